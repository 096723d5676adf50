//! The time model: FLOPs at the measured FP8 rate, bytes at the measured HBM and NVLink rates
//! (docs/PEERS.md, "Our machine"), each SM getting an equal share of the GPU's math and HBM rate.
//!
//! It is a floor-style model: it predicts what the order and the overlap allow, not what a
//! kernel of given quality reaches. Its use is to compare orders, lags and kernels against each
//! other before spending GPU time.

use serde::Serialize;

use crate::floor;
use crate::plan::layout::ROW_INFO_BYTES;
use crate::plan::TileConfig;
use crate::preset::Shape;

/// Machine rates and fixed latencies.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct TimeModel {
    /// Dense FP8 GEMM rate of one GPU, FLOP/s.
    pub fp8_flops: f64,
    /// HBM rate of one GPU, bytes/s (read and write counted).
    pub hbm_bytes: f64,
    /// NVLink rate per GPU per direction, bytes/s.
    pub nvlink_bytes: f64,
    /// SMs per GPU (H200: 132).
    pub sms: usize,
    /// One cross-rank barrier (count exchange, final barrier). Assumed, not measured: one
    /// NVLink round trip plus flag polling, a few µs.
    pub barrier_s: f64,
    /// Gap between two kernels on one stream without programmatic dependent launch. Assumed,
    /// not measured: a few µs.
    pub kernel_boundary_s: f64,
}

impl TimeModel {
    /// The H200 pair of docs/PEERS.md ("Our machine"): the rates of the floor, except HBM at the measured copy
    /// rate itself (4.18 TB/s) rather than the floor's rounded 4.2, which the simulator's
    /// recorded results (docs/SIMULATOR.md) were made with.
    pub const H200: TimeModel = TimeModel {
        fp8_flops: floor::FP8_FLOPS,
        hbm_bytes: 4.18e12,
        nvlink_bytes: floor::NVLINK_BYTES_PER_S,
        sms: 132,
        barrier_s: 3e-6,
        kernel_boundary_s: 4e-6,
    };

    /// Seconds one SM needs for `flops` and `hbm_bytes`, whichever bounds it.
    pub fn sm_seconds(&self, flops: f64, hbm_bytes: f64) -> f64 {
        let sms = self.sms as f64;
        (flops / (self.fp8_flops / sms)).max(hbm_bytes / (self.hbm_bytes / sms))
    }
}

/// Costs of the tasks of one call, from the shape and the tile.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct TaskCosts {
    pub shape: Shape,
    pub tile: TileConfig,
    pub gran: usize,
    pub model: TimeModel,
}

impl TaskCosts {
    /// One L1 tile: a block_m × block_n_l1 × H GEMM plus SwiGLU and re-quantization. The weight
    /// tile is read once per unit (its other blocks hit L2), the A rows once per block (its other
    /// n-blocks hit L2), the e4m3 output and scales written once.
    pub fn l1_seconds(&self, rows: usize, unit_blocks: usize) -> f64 {
        let (h, bm, bn) = (
            self.shape.hidden as f64,
            self.tile.block_m as f64,
            self.tile.block_n_l1 as f64,
        );
        let n_blocks = self.tile.n_blocks_l1(&self.shape) as f64;
        let rows = rows as f64;
        let flops = 2.0 * bm * bn * h;
        let weights = bn * h * (1.0 + 4.0 / (128.0 * 128.0)) / unit_blocks as f64;
        let a = rows * h * (1.0 + 4.0 / 128.0) / n_blocks;
        let out = rows * (bn / 2.0) * (1.0 + 4.0 / self.gran as f64);
        self.model.sm_seconds(flops, weights + a + out)
    }

    /// One L2 tile: a block_m × block_n_l2 × I GEMM; bf16 rows of the block's own rank are
    /// written to HBM, the others leave over NVLink (see [`TaskCosts::scatter_bytes_per_row`]).
    pub fn l2_seconds(&self, rows: usize, local_rows: usize, unit_blocks: usize) -> f64 {
        let (i, bm, bn) = (
            self.shape.inter as f64,
            self.tile.block_m as f64,
            self.tile.block_n_l2 as f64,
        );
        let n_blocks = self.tile.n_blocks_l2(&self.shape) as f64;
        let flops = 2.0 * bm * bn * i;
        let weights = bn * i * (1.0 + 4.0 / (128.0 * 128.0)) / unit_blocks as f64;
        let a = rows as f64 * i * (1.0 + 4.0 / self.gran as f64) / n_blocks;
        let out = local_rows as f64 * bn * 2.0;
        self.model.sm_seconds(flops, weights + a + out)
    }

    /// Bytes of one pulled row: e4m3 hidden, its scales and its row record.
    pub fn pull_bytes_per_row(&self) -> f64 {
        let h = self.shape.hidden as f64;
        h + h / 128.0 * 4.0 + ROW_INFO_BYTES as f64
    }

    /// Seconds to copy `rows` rows of the rank's own tokens into its pool (HBM read + write).
    pub fn local_pull_seconds(&self, rows: usize) -> f64 {
        2.0 * rows as f64 * self.pull_bytes_per_row() / self.model.hbm_bytes
    }

    /// Bytes one L2 tile scatters per row: block_n_l2 bf16 values.
    pub fn scatter_bytes_per_row(&self) -> f64 {
        self.tile.block_n_l2 as f64 * 2.0
    }

    /// Seconds of the final combine on a rank: read every returned bf16 row, write y.
    pub fn combine_seconds(&self, tokens: usize, valid_slots: usize) -> f64 {
        let h = self.shape.hidden as f64;
        (valid_slots as f64 + tokens as f64) * h * 2.0 / self.model.hbm_bytes
    }
}
