//! Arbitrary problems to the kernel choice: `validate` names the first broken rule, and every
//! problem it accepts gets a configuration whose tile fits the problem as the kernels need it.

use megamoe_gemm::heuristics::{validate, Accumulation, TILE_SHAPES};
use megamoe_gemm::{choose, GemmError, GemmProblem, Layout, OutDtype};
use proptest::prelude::*;

/// The first rule `p` breaks, as the argument named.
fn fault(p: &GemmProblem) -> Option<&'static str> {
    let multiple = |v: usize| v > 0 && v % 128 == 0;
    if p.experts == 0 || p.experts > 1024 {
        Some("experts")
    } else if !multiple(p.n) {
        Some("n")
    } else if !multiple(p.k) || p.k > 128 * 128 {
        Some("k")
    } else if p.group_size != 64 && p.group_size != 128 {
        Some("group_size")
    } else {
        match p.layout {
            Layout::Contiguous { pad } if pad != 64 && pad != 128 => Some("pad"),
            Layout::Masked { max_m } if max_m == 0 || max_m % 4 != 0 => Some("max_m"),
            _ => None,
        }
    }
}

fn any_dim() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(0usize),
        Just(64),
        Just(128),
        Just(192),
        Just(256),
        Just(384),
        Just(512),
        Just(128 * 128),
        Just(128 * 129),
        Just(usize::MAX),
        1usize..5000,
    ]
}

fn any_layout() -> impl Strategy<Value = Layout> {
    let count = prop_oneof![Just(0usize), Just(64), Just(128), Just(256), 1usize..300];
    prop_oneof![
        count.clone().prop_map(|pad| Layout::Contiguous { pad }),
        count.prop_map(|max_m| Layout::Masked { max_m }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn every_accepted_problem_gets_a_tile_that_fits_it(
        experts in prop_oneof![Just(0usize), 1usize..40, 1020usize..1030],
        n in any_dim(),
        k in any_dim(),
        group_size in prop_oneof![Just(0usize), Just(32), Just(64), Just(100), Just(128), Just(256)],
        layout in any_layout(),
        bf16_out in any::<bool>(),
        rows_per_expert in prop_oneof![0usize..200, Just(usize::MAX)],
        rescaled in any::<bool>(),
        sms in 1usize..200,
    ) {
        let out = if bf16_out { OutDtype::Bf16 } else { OutDtype::F32 };
        let accumulation = if rescaled { Accumulation::Rescaled } else { Accumulation::PerBlock };
        let p = GemmProblem { experts, n, k, group_size, layout, out, rows_per_expert, accumulation };
        let want = fault(&p);
        match (validate(&p), want) {
            (Ok(()), None) => {}
            (Err(GemmError::Shape { arg, .. }), Some(want)) => prop_assert_eq!(arg, want),
            (got, want) => prop_assert!(false, "{:?} but expected {:?}", got, want),
        }
        match choose(&p, sms) {
            Ok(c) => {
                prop_assert!(want.is_none());
                prop_assert!(TILE_SHAPES.contains(&(c.block_m, c.block_n)));
                prop_assert_eq!(n % c.block_n, 0);
                prop_assert_eq!(c.group_size, group_size);
                prop_assert!(c.stages >= 1 && c.smem_bytes() <= 232_448);
                // A contiguous expert segment is whole m-blocks.
                if let Layout::Contiguous { pad } = layout {
                    prop_assert_eq!(pad % c.block_m, 0);
                }
                prop_assert_eq!(c.masked, matches!(layout, Layout::Masked { .. }));
                prop_assert_eq!(c.ctas, sms);
                prop_assert_eq!(c.accumulation, accumulation);
            }
            // Only 64-row segments narrow the tiles further: they need N a multiple of 256.
            Err(GemmError::Shape { arg, .. }) => {
                let pad_64 = matches!(layout, Layout::Contiguous { pad: 64 });
                let narrow = want.is_none() && arg == "n" && pad_64 && n % 256 != 0;
                prop_assert!(want == Some(arg) || narrow, "{} (expected {:?})", arg, want);
            }
            Err(e) => prop_assert!(false, "{}", e),
        }
    }
}
