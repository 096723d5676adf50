//! Timing of one grouped GEMM case against its floor (benchmark protocol, SPEC §8).

use megamoe_cuda::Gpu;

use crate::error::{GemmError, Result};
use crate::grouped::GroupedGemm;
use crate::heuristics::{choose, with_block_n, GemmProblem};
use crate::testdata::{compare, DeviceOperands, HostOperands};

/// Measured FP8 dense peak of our H200 (ANCHORS.md).
pub const PEAK_FLOPS: f64 = 1394e12;
/// Measured HBM copy bandwidth of our H200 (ANCHORS.md).
pub const HBM_BYTES_PER_S: f64 = 4.2e12;

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
    /// Another BLOCK_N than the heuristic's.
    pub block_n: Option<usize>,
    /// Stores tiles straight from registers instead of through TMA.
    pub direct_store: bool,
}

/// Checks sampled rows (first and last of every expert, every element for poison), then times
/// `iters` launches after `warmup`, each between its own pair of events.
pub fn run_case(
    gpu: &Gpu,
    problem: GemmProblem,
    rows: &[usize],
    seed: u64,
    opts: &BenchOptions,
) -> Result<BenchResult> {
    let mut config = choose(&problem, gpu.props().sm_count as usize)?;
    if let Some(bn) = opts.block_n {
        config = with_block_n(config, &problem, bn).ok_or_else(|| GemmError::Shape {
            arg: "block_n",
            reason: format!(
                "{bn} is not a tile width for BLOCK_M {} and N {}",
                config.block_m, problem.n
            ),
        })?;
    }
    if opts.direct_store {
        config.tma_store = false;
    }
    let host = HostOperands::random(problem, rows, seed)?;
    let dev = DeviceOperands::upload(gpu, &host)?;
    let gemm = GroupedGemm::new(gpu, problem, config, host.contiguous_rows, dev.pointers())?;
    dev.poison_output()?;
    gemm.launch(gpu)?;
    gemm.check(gpu)?;
    let out: Vec<u8> = dev.out.download()?;
    let c = compare(&host, &out, usize::MAX);

    for _ in 0..opts.warmup {
        gemm.launch(gpu)?;
    }
    let timer = gpu.timer()?;
    let mut times = Vec::with_capacity(opts.iters);
    for _ in 0..opts.iters {
        timer.start()?;
        gemm.launch(gpu)?;
        timer.stop()?;
        times.push(timer.elapsed_ms()? as f64 * 1e3);
    }
    gemm.check(gpu)?;
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let (flops, bytes) = host.flops_and_bytes();
    Ok(BenchResult {
        kernel: config.kernel_name(),
        median_us: median,
        min_us: times[0],
        max_us: *times.last().unwrap(),
        tflops: flops / (median * 1e-6) / 1e12,
        floor_us: (flops / PEAK_FLOPS).max(bytes / HBM_BYTES_PER_S) * 1e6,
        weight_floor_us: host.weight_bytes() / HBM_BYTES_PER_S * 1e6,
        diff: c.diff,
        rows_checked: c.rows_checked,
        unwritten: c.unwritten + c.overwritten,
    })
}
