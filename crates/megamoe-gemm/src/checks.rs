//! GPU correctness checks of the grouped GEMM, for `megamoe selftest`: every configuration the
//! heuristics can pick, on fresh random data with empty and one-row experts, output poisoned
//! first, diff ≤ 1e-4 against the CPU reference (≤ 1e-3 for the rescaled accumulation, whose
//! error grows with K).

use std::rc::Rc;

use megamoe_cuda::selftest::Check;
use megamoe_cuda::Gpu;

use crate::error::Result;
use crate::grouped::GroupedGemm;
use crate::heuristics::{all_configs, Accumulation, GemmConfig, GemmProblem, Layout};
use crate::testdata::{compare, DeviceOperands, HostOperands};

/// Accuracy promise of SPEC §3 against the CPU reference.
pub const MAX_DIFF: f64 = 1e-4;

/// The bound of the rescaled accumulation's checks: SPEC §3's bound for any batch, the same
/// as the layer's ([`Accumulation::Rescaled`] trades accuracy for speed; its measured error is
/// documented beside the default's).
pub const MAX_DIFF_RESCALED: f64 = 1e-3;

/// The bound a configuration is checked against.
pub fn max_diff(accumulation: Accumulation) -> f64 {
    match accumulation {
        Accumulation::PerBlock => MAX_DIFF,
        Accumulation::Rescaled => MAX_DIFF_RESCALED,
    }
}

/// Runs `config` on fresh data shaped like `problem` with `rows` per expert and compares it.
pub fn check_config(
    gpu: &Gpu,
    problem: GemmProblem,
    config: GemmConfig,
    rows: &[usize],
    seed: u64,
    every: usize,
) -> Result<std::result::Result<String, String>> {
    let host = HostOperands::random(problem, rows, seed)?;
    let dev = DeviceOperands::upload(gpu, &host)?;
    let gemm = GroupedGemm::new(gpu, problem, config, host.contiguous_rows, dev.pointers())?;
    dev.poison_output()?;
    gemm.launch(gpu)?;
    gemm.check(gpu)?;
    let out: Vec<u8> = dev.out.download()?;
    let c = compare(&host, &out, every);
    let summary = format!(
        "diff {:.2e} over {} rows, {} unwritten rows, {} rows written past the count (registers {}, spills/stack/local: {})",
        c.diff,
        c.rows_checked,
        c.unwritten,
        c.overwritten,
        gemm.compiled.report.registers,
        gemm.compiled.report.unclean_reason().unwrap_or_else(|| "none".into())
    );
    Ok(
        if c.diff <= max_diff(config.accumulation)
            && c.unwritten == 0
            && c.overwritten == 0
            && !c.diff.is_nan()
        {
            Ok(summary)
        } else {
            Err(summary)
        },
    )
}

/// The small problem every configuration is checked on: 7 experts, among them an empty one
/// and a one-row one, sizes that end mid-block, K long enough to wrap the ring twice; N = 512
/// gives clusters both kinds of pairs (m-block pairs sharing the weight tile, and the odd last
/// m-block paired along N).
pub fn check_problem(config: &GemmConfig) -> (GemmProblem, Vec<usize>) {
    let rows = vec![37, 0, 1, 200, config.block_m, 129, 64];
    let layout = if config.masked {
        Layout::Masked { max_m: 200 }
    } else {
        Layout::Contiguous {
            pad: config.block_m,
        }
    };
    let problem = GemmProblem {
        experts: rows.len(),
        n: 512,
        k: 128 * (2 * config.stages + 3),
        group_size: config.group_size,
        layout,
        out: config.out,
        rows_per_expert: 64,
        accumulation: config.accumulation,
    };
    (problem, rows)
}

/// Every configuration's check, on `gpu`.
pub fn gpu_checks(gpu: &Rc<Gpu>) -> Vec<Check> {
    all_configs(gpu.props().sm_count as usize)
        .into_iter()
        .map(|config| {
            let gpu = gpu.clone();
            Check {
                name: format!("gemm {}", config.kernel_name()),
                run: Box::new(move || {
                    let (problem, rows) = check_problem(&config);
                    let seed = 0x5EED ^ config.stages as u64;
                    check_config(&gpu, problem, config, &rows, seed, 1)
                        .map_err(|e| e.to_string())?
                }),
            }
        })
        .collect()
}
