//! Block sizes and pipeline stages of the GEMM tiles, pure functions of (bound, load per expert,
//! shape). They take the call's bound, never a rank's own count, so every rank of a call picks
//! the same tile (the seed reads each rank's raw count, so ranks with different batches compile
//! different instantiations).

use serde::Serialize;

use crate::preset::Shape;

/// K extent of one pipeline stage: one scale block of both operands (SPEC §3).
pub const BLOCK_K: usize = 128;
/// Dynamic shared memory one SM90 block may use (227 KiB).
pub const SMEM_BYTES: usize = 232_448;
/// Shared memory kept for barriers, the tile table cursor and scales of B.
const SMEM_RESERVED: usize = 1024;
/// More stages than this hide no more latency: 4 TMA loads in flight cover HBM latency at
/// the rate one SM consumes them.
const MAX_STAGES: usize = 6;

/// The tile of both GEMMs of one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct TileConfig {
    pub block_m: usize,
    /// N extent of an L1 tile over 2I (gate and up interleaved, so SwiGLU stays in the tile).
    pub block_n_l1: usize,
    /// N extent of an L2 tile over H.
    pub block_n_l2: usize,
    pub block_k: usize,
    pub stages_l1: usize,
    pub stages_l2: usize,
}

impl TileConfig {
    /// L1 tasks per m-block.
    pub fn n_blocks_l1(&self, shape: &Shape) -> usize {
        (2 * shape.inter).div_ceil(self.block_n_l1)
    }

    /// L2 tasks per m-block.
    pub fn n_blocks_l2(&self, shape: &Shape) -> usize {
        shape.hidden.div_ceil(self.block_n_l2)
    }
}

/// Mean rows per local expert at a token bound with uniform routing: bound·K/E_l (= R·bound·K/E).
pub fn mean_rows_per_expert(shape: &Shape, ranks: usize, bound: usize) -> f64 {
    (bound * shape.topk) as f64 / shape.local_experts(ranks) as f64
}

/// block_m: 64 below 64 mean rows per expert, else 128.
///
/// WGMMA works on 64-row slices. Below 64 rows an expert's single 128-row block would be more
/// than half padding, and the call is bound by reading weights anyway; from 64 rows a 128-row
/// block halves how often each weight tile is read per row.
pub fn block_m(mean_rows_per_expert: f64) -> usize {
    if mean_rows_per_expert < 64.0 {
        64
    } else {
        128
    }
}

/// block_n over an N extent of `n_dim`: 256 where it divides, else 128.
///
/// 256 is the widest WGMMA instruction: each A tile in shared memory feeds twice the columns of
/// a 128-wide tile, which is what keeps a 64-row decode tile from being bound by shared memory.
/// Narrower tiles are only for N extents that 256 does not divide (H, 2I are multiples of 128).
pub fn block_n(n_dim: usize) -> usize {
    if n_dim % 256 == 0 {
        256
    } else {
        128
    }
}

/// Pipeline stages that fit in shared memory next to the epilogue staging, for a reduction over
/// `k_dim`.
///
/// A stage holds one BLOCK_K slice of A (block_m rows of e4m3 plus their f32 scales) and of B
/// (block_n rows of e4m3); the epilogue stages a block_m × block_n bf16 tile. More stages than
/// k-blocks never fill, and beyond `MAX_STAGES` (6) hide nothing more. On 4096/2048 with a 128×256
/// tile this gives 3, the seed's count.
pub fn stages(block_m: usize, block_n: usize, k_dim: usize) -> usize {
    let stage = block_m * BLOCK_K + block_n * BLOCK_K + block_m * 4;
    let epilogue = block_m * block_n * 2;
    let fit = (SMEM_BYTES - SMEM_RESERVED - epilogue) / stage;
    fit.min(MAX_STAGES).min(k_dim.div_ceil(BLOCK_K)).max(1)
}

/// The tile of a call at `bound` tokens per rank.
pub fn tile_config(shape: &Shape, ranks: usize, bound: usize) -> TileConfig {
    let block_m = block_m(mean_rows_per_expert(shape, ranks, bound));
    let block_n_l1 = block_n(2 * shape.inter);
    let block_n_l2 = block_n(shape.hidden);
    TileConfig {
        block_m,
        block_n_l1,
        block_n_l2,
        block_k: BLOCK_K,
        stages_l1: stages(block_m, block_n_l1, shape.hidden),
        stages_l2: stages(block_m, block_n_l2, shape.inter),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preset::Preset;

    #[test]
    fn flash_uses_the_seeds_large_tile_and_three_stages() {
        let flash = Preset::by_name("flash").unwrap().shape;
        let t = tile_config(&flash, 8, 8192);
        assert_eq!((t.block_m, t.block_n_l1, t.block_n_l2), (128, 256, 256));
        assert_eq!((t.stages_l1, t.stages_l2), (3, 3));
    }

    #[test]
    fn decode_sized_bounds_take_64_row_blocks() {
        let flash = Preset::by_name("flash").unwrap().shape;
        // 256 tokens · 6 / 32 experts = 48 rows per expert.
        assert_eq!(tile_config(&flash, 8, 256).block_m, 64);
        assert_eq!(tile_config(&flash, 8, 512).block_m, 128);
    }

    #[test]
    fn stages_never_exceed_k_blocks() {
        assert_eq!(stages(64, 128, 256), 2);
        assert!(stages(64, 128, 1 << 14) <= MAX_STAGES);
    }
}
