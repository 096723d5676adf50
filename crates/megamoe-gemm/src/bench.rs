//! Timing of one grouped GEMM case against its floor (benchmark protocol, SPEC §8).

use megamoe_core::floor::floor_seconds;
use megamoe_cuda::Gpu;

use crate::error::{GemmError, Result};
use crate::grouped::GroupedGemm;
use crate::heuristics::{
    choose, with_block_n, with_cluster, Accumulation, GemmConfig, GemmProblem,
};
use crate::testdata::{compare, DeviceOperands, HostOperands};

/// One measured case.
#[derive(Debug, Clone)]
pub struct BenchResult {
    pub kernel: String,
    pub median_us: f64,
    pub min_us: f64,
    pub max_us: f64,
    pub tflops: f64,
    pub floor_us: f64,
    pub weight_floor_us: f64,
    pub diff: f64,
    pub rows_checked: usize,
    pub unwritten: usize,
}

/// How a case is run and which of the heuristic's choices it overrides (tuning knobs).
#[derive(Clone, Copy, Debug)]
pub struct BenchOptions {
    pub warmup: usize,
    pub iters: usize,
    /// Stores tiles straight from registers instead of through TMA.
    pub direct_store: bool,
    /// Another `group_m` than the heuristic's.
    pub group_m: Option<usize>,
    /// Writes `L2_FLUSH_BYTES` before every timed launch (outside its events), so that no
    /// launch finds its operands in L2 (DeepGEMM's benchmark does the same).
    pub flush_l2: bool,
}

/// Bytes written to push every operand out of L2 (50 MiB on an H200) before a timed launch.
pub const L2_FLUSH_BYTES: usize = 256 << 20;

/// One arm of an interleaved comparison: the heuristic's kernel with these overrides.
#[derive(Clone, Copy, Debug, Default)]
pub struct Arm {
    /// Another BLOCK_N than the heuristic's.
    pub block_n: Option<usize>,
    /// CTAs per cluster sharing the weight tile (see `GemmConfig::cluster_m`).
    pub cluster_m: Option<usize>,
    /// How the K loop sums over K (overrides the problem's; see `GemmConfig::accumulation`).
    pub accumulation: Accumulation,
}

/// The configuration `arm` runs for `problem`.
fn arm_config(
    gpu: &Gpu,
    problem: &GemmProblem,
    opts: &BenchOptions,
    arm: &Arm,
) -> Result<GemmConfig> {
    let problem = &GemmProblem {
        accumulation: arm.accumulation,
        ..*problem
    };
    let mut config = choose(problem, gpu.props().sm_count as usize)?;
    if let Some(bn) = arm.block_n {
        config = with_block_n(config, problem, bn).ok_or_else(|| GemmError::Shape {
            arg: "block_n",
            reason: format!(
                "{bn} is not a tile width for BLOCK_M {} and N {}",
                config.block_m, problem.n
            ),
        })?;
    }
    if let Some(cm) = arm.cluster_m {
        config = with_cluster(config, problem, cm).ok_or_else(|| GemmError::Shape {
            arg: "cluster_m",
            reason: format!("no {cm}-CTA cluster variant of {}", config.kernel_name()),
        })?;
    }
    if opts.direct_store {
        config.tma_store = false;
    }
    if let Some(group_m) = opts.group_m {
        if group_m == 0 {
            return Err(GemmError::Shape {
                arg: "group_m",
                reason: "0 m-blocks per group".into(),
            });
        }
        config.group_m = group_m;
    }
    Ok(config)
}

/// Runs every arm on the same operands: each checked (sampled rows: first and last of every
/// expert, every element for poison, output poisoned before each arm's first launch), then
/// `warmup` launches of each and `iters` rounds of one launch per arm in turn, each launch
/// between its own pair of events (after an L2 flush with `opts.flush_l2`), so that clocks and
/// temperature drift hit every arm alike.
pub fn run_arms(
    gpu: &Gpu,
    problem: GemmProblem,
    rows: &[usize],
    seed: u64,
    opts: &BenchOptions,
    arms: &[Arm],
) -> Result<Vec<BenchResult>> {
    let configs = arms
        .iter()
        .map(|arm| arm_config(gpu, &problem, opts, arm))
        .collect::<Result<Vec<_>>>()?;
    let host = HostOperands::random(problem, rows, seed)?;
    let dev = DeviceOperands::upload(gpu, &host)?;
    let mut gemms = Vec::with_capacity(configs.len());
    let mut checks = Vec::with_capacity(configs.len());
    for config in &configs {
        let gemm = GroupedGemm::new(gpu, problem, *config, host.contiguous_rows, dev.pointers())?;
        dev.poison_output()?;
        gemm.launch(gpu)?;
        gemm.check(gpu)?;
        let out: Vec<u8> = dev.out.download()?;
        checks.push(compare(&host, &out, usize::MAX));
        for _ in 0..opts.warmup {
            gemm.launch(gpu)?;
        }
        gemms.push(gemm);
    }
    let timer = gpu.timer()?;
    let flush = if opts.flush_l2 {
        Some(gpu.alloc(L2_FLUSH_BYTES)?)
    } else {
        None
    };
    let mut times = vec![Vec::with_capacity(opts.iters); gemms.len()];
    for _ in 0..opts.iters {
        for (gemm, t) in gemms.iter().zip(&mut times) {
            if let Some(buf) = &flush {
                buf.memset(0)?;
            }
            timer.start()?;
            gemm.launch(gpu)?;
            timer.stop()?;
            t.push(timer.elapsed_ms()? as f64 * 1e3);
        }
    }
    let (flops, bytes) = host.flops_and_bytes();
    let mut results = Vec::with_capacity(gemms.len());
    for ((gemm, mut times), (config, c)) in gemms.iter().zip(times).zip(configs.iter().zip(checks))
    {
        gemm.check(gpu)?;
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        results.push(BenchResult {
            kernel: config.kernel_name(),
            median_us: median,
            min_us: times[0],
            max_us: *times.last().unwrap(),
            tflops: flops / (median * 1e-6) / 1e12,
            floor_us: floor_seconds(flops, bytes, 0.0) * 1e6,
            weight_floor_us: floor_seconds(0.0, host.weight_bytes(), 0.0) * 1e6,
            diff: c.diff,
            rows_checked: c.rows_checked,
            unwritten: c.unwritten + c.overwritten,
        });
    }
    Ok(results)
}
