//! The grouped GEMM's tiles: the shapes it is instantiated with, its shared-memory plan and the
//! rules that pick a tile. This is the one home of these facts: `megamoe-gemm` chooses its
//! kernels with them and the planner sizes its m-blocks and stages with them, so the two never
//! disagree.
//!
//! The planner takes the call's bound, never a rank's own count, so every rank of a call picks
//! the same tile (the seed reads each rank's raw count, so ranks with different batches compile
//! different instantiations).

use serde::Serialize;

use crate::preset::Shape;

/// K extent of one pipeline stage: one scale block of both operands (SPEC §3).
pub const BLOCK_K: usize = 128;
/// Shared memory one CTA may ask for on sm_90 (227 KiB).
pub const MAX_SMEM_BYTES: usize = 232_448;
/// Most experts one launch takes (their row counts are staged in shared memory).
pub const MAX_EXPERTS: usize = 1024;
/// Longest K, in 128-wide blocks: a tile's weight scales are staged in shared memory.
pub const MAX_K_BLOCKS: usize = 128;
/// Deepest ring the kernel is instantiated with.
pub const MAX_STAGES: usize = 8;
/// Every (BLOCK_M, BLOCK_N) the kernel is instantiated with.
pub const TILE_SHAPES: [(usize, usize); 4] = [(128, 256), (128, 192), (128, 128), (64, 256)];

/// Bytes of the shared-memory plan (SmemLayout in megamoe_gemm/layout/smem_layout.cuh).
pub fn smem_bytes(block_m: usize, block_n: usize, stages: usize, group_size: usize) -> usize {
    let per_stage = block_m * BLOCK_K + block_n * BLOCK_K + (BLOCK_K / group_size) * block_m * 4;
    let staging = 2 * 64 * 64 * 2;
    let weight_scales = 2 * 2 * MAX_K_BLOCKS * 4;
    stages * per_stage + staging + 2 * stages * 8 + MAX_EXPERTS * 4 + weight_scales
}

/// The deepest ring that fits in shared memory next to the 1 KiB alignment slack.
pub fn max_stages(block_m: usize, block_n: usize, group_size: usize) -> usize {
    (1..=MAX_STAGES)
        .rev()
        .find(|&s| smem_bytes(block_m, block_n, s, group_size) + 1024 <= MAX_SMEM_BYTES)
        .unwrap_or(1)
}

/// BLOCK_M for experts of `rows_per_expert` expected rows: 64 up to 64 rows, else 128.
///
/// WGMMA works on 64-row slices. Up to 64 rows an expert's single 128-row block would be at
/// least half padding, and the call is bound by reading weights anyway; past 64 rows a 128-row
/// block halves how often each weight tile is read per row.
pub fn block_m(rows_per_expert: usize) -> usize {
    if rows_per_expert <= 64 {
        64
    } else {
        128
    }
}

/// BLOCK_N of a `block_m`-row tile over an N extent of `n`: 256 where it divides N, else 128;
/// None where no instantiated tile fits (the only 64-row tile is 64 x 256).
///
/// 256 is the widest WGMMA instruction: each A tile in shared memory feeds twice the columns of
/// a 128-wide tile, which is what keeps a 64-row decode tile from being bound by shared memory.
/// The 192-column tile is a benchmark knob, never chosen.
pub fn block_n(block_m: usize, n: usize) -> Option<usize> {
    [256, 128]
        .into_iter()
        .find(|&block_n| n % block_n == 0 && TILE_SHAPES.contains(&(block_m, block_n)))
}

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

/// Expected rows per local expert at a token bound with uniform routing: bound·K/E_l
/// (= R·bound·K/E), rounded down as the GEMM's `rows_per_expert`.
pub fn rows_per_expert(shape: &Shape, ranks: usize, bound: usize) -> usize {
    bound * shape.topk / shape.local_experts(ranks)
}

/// The tile of a call at `bound` tokens per rank, with intermediate scale granularity `gran`:
/// the GEMM's own choice for each of the two GEMMs, with one block_m for both (the m-blocks of a
/// pool feed L1 and L2), so 64 only where both N extents have a 64-row tile.
pub fn tile_config(shape: &Shape, ranks: usize, bound: usize, gran: usize) -> TileConfig {
    let (n_l1, n_l2) = (2 * shape.inter, shape.hidden);
    let small = block_m(rows_per_expert(shape, ranks, bound));
    let block_m = if block_n(small, n_l1).is_some() && block_n(small, n_l2).is_some() {
        small
    } else {
        128
    };
    // H and I are multiples of 128, which every 128-row tile width divides.
    let block_n_l1 = block_n(block_m, n_l1).expect("2I is a multiple of 128");
    let block_n_l2 = block_n(block_m, n_l2).expect("H is a multiple of 128");
    TileConfig {
        block_m,
        block_n_l1,
        block_n_l2,
        block_k: BLOCK_K,
        stages_l1: max_stages(block_m, block_n_l1, BLOCK_K),
        stages_l2: max_stages(block_m, block_n_l2, gran),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preset::Preset;

    #[test]
    fn flash_uses_the_large_tile_and_four_stages() {
        let flash = Preset::by_name("flash").unwrap().shape;
        let t = tile_config(&flash, 8, 8192, 128);
        assert_eq!((t.block_m, t.block_n_l1, t.block_n_l2), (128, 256, 256));
        assert_eq!((t.stages_l1, t.stages_l2), (4, 4));
    }

    #[test]
    fn decode_sized_bounds_take_64_row_blocks() {
        let flash = Preset::by_name("flash").unwrap().shape;
        // 256 tokens · 6 / 32 experts = 48 rows per expert.
        assert_eq!(tile_config(&flash, 8, 256, 128).block_m, 64);
        assert_eq!(tile_config(&flash, 8, 512, 128).block_m, 128);
    }

    #[test]
    fn one_block_m_fits_both_gemms() {
        let mut shape = Preset::by_name("flash").unwrap().shape;
        shape.hidden = 4096 + 128;
        let t = tile_config(&shape, 8, 256, 128);
        assert_eq!((t.block_m, t.block_n_l1, t.block_n_l2), (128, 256, 128));
    }
}
