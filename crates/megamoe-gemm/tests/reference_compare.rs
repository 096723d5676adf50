//! The comparison used by the GPU checks catches unwritten rows, rows written past a masked
//! count, and wrong values; an exact copy of the reference passes.

use megamoe_gemm::heuristics::{Accumulation, GemmProblem, Layout, OutDtype};
use megamoe_gemm::testdata::{compare, HostOperands};

fn problem(layout: Layout) -> GemmProblem {
    GemmProblem {
        experts: 3,
        n: 128,
        k: 256,
        group_size: 64,
        layout,
        out: OutDtype::F32,
        rows_per_expert: 4,
        accumulation: Accumulation::PerBlock,
    }
}

fn reference_output(host: &HostOperands) -> Vec<u8> {
    let n = host.problem.n;
    let mut out = vec![0xFFu8; host.view_rows * n * 4];
    for (ex, &valid) in host.rows.iter().enumerate() {
        let seg = match host.problem.layout {
            Layout::Contiguous { pad } => valid.div_ceil(pad) * pad,
            Layout::Masked { .. } => valid,
        };
        for r in 0..seg {
            let row = host.seg_start[ex] + r;
            let values = if r < valid {
                host.reference(ex, r)
            } else {
                vec![0.0; n]
            };
            for (c, v) in values.iter().enumerate() {
                out[(row * n + c) * 4..(row * n + c + 1) * 4].copy_from_slice(&v.to_le_bytes());
            }
        }
    }
    out
}

#[test]
fn exact_reference_passes_and_corruptions_are_caught() {
    for layout in [Layout::Contiguous { pad: 64 }, Layout::Masked { max_m: 8 }] {
        let host = HostOperands::random(problem(layout), &[3, 0, 5], 7).unwrap();
        let mut out = reference_output(&host);
        let c = compare(&host, &out, 1);
        assert_eq!(
            (c.diff, c.unwritten, c.overwritten, c.rows_checked),
            (0.0, 0, 0, 8)
        );

        // A wrong value in expert 2's first row.
        let at = host.seg_start[2] * host.problem.n * 4;
        let v = f32::from_le_bytes(out[at..at + 4].try_into().unwrap());
        out[at..at + 4].copy_from_slice(&(v * 4.0 + 1.0).to_le_bytes());
        assert!(compare(&host, &out, 1).diff > 1e-4);

        // A valid row left as poison.
        let mut out = reference_output(&host);
        let at = (host.seg_start[0] + 1) * host.problem.n * 4;
        out[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
        assert_eq!(compare(&host, &out, 1).unwritten, 1);
    }
    // A masked row past the count that was written.
    let host = HostOperands::random(problem(Layout::Masked { max_m: 8 }), &[3, 0, 5], 7).unwrap();
    let mut out = reference_output(&host);
    let at = (host.seg_start[0] + 3) * host.problem.n * 4;
    out[at..at + 4].copy_from_slice(&0f32.to_le_bytes());
    assert_eq!(compare(&host, &out, 1).overwritten, 1);
}
