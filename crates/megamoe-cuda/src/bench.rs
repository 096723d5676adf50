//! Benchmarks of the runtime's own kernels: NVLink exchange and quantization. CUDA events
//! around every launch, warm-up first, median of `iters` launches (SPEC §8).

use crate::device::{DeviceBuffer, Gpu, Kernel, LaunchConfig, Timer};
use crate::error::{Error, Result};
use crate::kernels::{self, CopyParams, QuantConfig, COPY_THREADS};
use crate::quant::Quantizer;
use megamoe_core::floor::floor_seconds;

const WARMUP: usize = 3;

/// Median, minimum and maximum of per-launch times in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    pub median_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
}

impl Stats {
    pub fn of(times_ms: &[f64]) -> Stats {
        assert!(!times_ms.is_empty(), "no samples");
        let mut t = times_ms.to_vec();
        t.sort_by(f64::total_cmp);
        let n = t.len();
        let median_ms = if n % 2 == 1 {
            t[n / 2]
        } else {
            (t[n / 2 - 1] + t[n / 2]) / 2.0
        };
        Stats {
            median_ms,
            min_ms: t[0],
            max_ms: t[n - 1],
        }
    }
}

/// Runs `op(i)` for every GPU index in `active` `iters` times after a warm-up, with the GPUs'
/// launches interleaved so that they run at the same time, and returns each one's statistics.
fn time_concurrently(
    gpus: &[Gpu],
    active: &[usize],
    iters: usize,
    op: &dyn Fn(usize) -> Result<()>,
) -> Result<Vec<Stats>> {
    for _ in 0..WARMUP {
        for &i in active {
            op(i)?;
        }
    }
    let timers: Vec<Vec<Timer>> = active
        .iter()
        .map(|&i| (0..iters).map(|_| gpus[i].timer()).collect())
        .collect::<Result<_>>()?;
    for it in 0..iters {
        for (ts, &i) in timers.iter().zip(active) {
            ts[it].start()?;
            op(i)?;
            ts[it].stop()?;
        }
    }
    timers
        .iter()
        .map(|ts| {
            let ms = ts
                .iter()
                .map(|t| t.elapsed_ms().map(f64::from))
                .collect::<Result<Vec<_>>>()?;
            Ok(Stats::of(&ms))
        })
        .collect()
}

/// One NVLink measurement: GB/s per busy GPU (GPU 0 first).
#[derive(Debug, Clone)]
pub struct NvlinkRow {
    /// `pull` (SM loads from the peer), `push` (SM stores to the peer) or `copy engine`.
    pub mode: &'static str,
    /// 1: only GPU 0 moves data; 2: both GPUs at once, in opposite directions.
    pub directions: usize,
    /// Thread blocks of the copy kernel (`None` for the copy engine).
    pub blocks: Option<u32>,
    pub gbps: Vec<f64>,
}

struct Exchange {
    gpus: Vec<Gpu>,
    kernels: Vec<Kernel>,
    /// Per GPU: data to send, where pulls land, where the peer's pushes land.
    src: Vec<DeviceBuffer>,
    out: Vec<DeviceBuffer>,
    inbox: Vec<DeviceBuffer>,
    bytes: usize,
}

impl Exchange {
    fn copy(&self, i: usize, dst: u64, src: u64, blocks: u32) -> Result<()> {
        let params = CopyParams {
            dst,
            src,
            bytes: self.bytes as u64,
        };
        self.gpus[i].launch(
            &self.kernels[i],
            &LaunchConfig::new(blocks, COPY_THREADS),
            &params,
        )
    }

    fn op(&self, mode: &str, i: usize, blocks: u32) -> Result<()> {
        let peer = 1 - i;
        match mode {
            "pull" => self.copy(i, self.out[i].ptr(), self.src[peer].ptr(), blocks),
            "push" => self.copy(i, self.inbox[peer].ptr(), self.src[i].ptr(), blocks),
            _ => self.gpus[i].copy(&self.out[i], &self.src[peer], self.bytes),
        }
    }
}

/// NVLink exchange between GPUs 0 and 1: pull and push with each block count, one and both
/// directions busy, and the copy engine, `bytes` per transfer.
pub fn nvlink(bytes: usize, blocks: &[u32], iters: usize) -> Result<Vec<NvlinkRow>> {
    let count = crate::device::device_count()?;
    if count < 2 {
        return Err(Error::Invalid {
            arg: "gpus",
            reason: format!("the NVLink benchmark needs 2 GPUs, {count} visible"),
        });
    }
    if bytes % 16 != 0 || bytes == 0 || iters == 0 {
        return Err(Error::Invalid {
            arg: "bytes",
            reason: format!(
                "{bytes} bytes x {iters} iterations: bytes must be a positive multiple of 16"
            ),
        });
    }
    let gpus = vec![Gpu::new(0)?, Gpu::new(1)?];
    gpus[0].enable_peer_access(&gpus[1])?;
    gpus[1].enable_peer_access(&gpus[0])?;
    let compiled = crate::jit::compile(&kernels::nvlink_copy())?;
    let alloc = |g: &Gpu| -> Result<DeviceBuffer> {
        let b = g.alloc(bytes)?;
        b.memset(0x5a)?;
        Ok(b)
    };
    let ex = Exchange {
        kernels: gpus
            .iter()
            .map(|g| g.load(&compiled))
            .collect::<Result<_>>()?,
        src: gpus.iter().map(alloc).collect::<Result<_>>()?,
        out: gpus.iter().map(alloc).collect::<Result<_>>()?,
        inbox: gpus.iter().map(alloc).collect::<Result<_>>()?,
        gpus,
        bytes,
    };
    let mut rows = Vec::new();
    let mut measure = |mode: &'static str, blocks: Option<u32>| -> Result<()> {
        for active in [&[0usize][..], &[0, 1][..]] {
            let stats = time_concurrently(&ex.gpus, active, iters, &|i| {
                ex.op(mode, i, blocks.unwrap_or(0))
            })?;
            rows.push(NvlinkRow {
                mode,
                directions: active.len(),
                blocks,
                gbps: stats
                    .iter()
                    .map(|s| bytes as f64 / (s.median_ms * 1e-3) / 1e9)
                    .collect(),
            });
        }
        Ok(())
    };
    for &b in blocks {
        measure("pull", Some(b))?;
        measure("push", Some(b))?;
    }
    measure("copy engine", None)?;
    Ok(rows)
}

/// One quantization measurement.
#[derive(Debug, Clone)]
pub struct QuantRow {
    pub config: QuantConfig,
    pub rows: usize,
    pub cols: usize,
    pub stats: Stats,
    /// Bytes read and written: bf16 in, e4m3 out, f32 scales out.
    pub bytes: usize,
    /// The time at 4.2 TB/s.
    pub floor_ms: f64,
}

/// Times each quantizer configuration on `gpu` for a `[rows, cols]`
/// bf16 input, the configurations interleaved launch by launch.
pub fn quant(
    gpu: &Gpu,
    rows: usize,
    cols: usize,
    configs: &[QuantConfig],
    iters: usize,
) -> Result<Vec<QuantRow>> {
    let quantizers: Vec<Quantizer> = configs
        .iter()
        .map(|&c| Quantizer::with_config(gpu, c))
        .collect::<Result<_>>()?;
    let x = gpu.alloc(rows * cols * 2)?;
    x.memset(0x3f)?;
    let q = gpu.alloc(rows * cols)?;
    let sf = gpu.alloc(rows * cols / 128 * 4)?;
    let bytes = rows * cols * 3 + rows * cols / 128 * 4;
    let mut times = vec![Vec::new(); configs.len()];
    for _ in 0..WARMUP {
        for quantizer in &quantizers {
            quantizer.launch(gpu, &x, &q, &sf, rows, cols)?;
        }
    }
    let timer = gpu.timer()?;
    for _ in 0..iters {
        for (quantizer, t) in quantizers.iter().zip(&mut times) {
            timer.start()?;
            quantizer.launch(gpu, &x, &q, &sf, rows, cols)?;
            timer.stop()?;
            t.push(timer.elapsed_ms()? as f64);
        }
    }
    Ok(configs
        .iter()
        .zip(times)
        .map(|(&config, t)| QuantRow {
            config,
            rows,
            cols,
            stats: Stats::of(&t),
            bytes,
            floor_ms: floor_seconds(0.0, bytes as f64, 0.0) * 1e3,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_median_min_max() {
        let s = Stats::of(&[3.0, 1.0, 2.0]);
        assert_eq!((s.median_ms, s.min_ms, s.max_ms), (2.0, 1.0, 3.0));
        assert_eq!(Stats::of(&[4.0, 1.0, 2.0, 3.0]).median_ms, 2.5);
    }
}
