//! The one-time weight load: W1's gate and up halves re-laid so that each 256-row tile of the L1
//! GEMM holds gate rows 128j…128j+127 then the up rows of the same intermediate columns
//! (the SwiGLU epilogue then finds both in one thread, device/megamoe_layer/epilogue/); W2 and
//! both scale tensors keep the SPEC §2 layouts (W1's scales re-laid with their rows).

use megamoe_core::preset::Shape;
use megamoe_core::weights::RankWeightsFp8;
use megamoe_core::{Error, Result};
use megamoe_cuda::{DeviceBuffer, Gpu};

use crate::error::LayerError;

/// Rows of one weight scale block, the unit the gate/up interleave moves.
const BLOCK: usize = 128;

/// Which original W1 row lands at row `row` of an expert's interleaved W1 (`inter` = I).
pub fn interleaved_source_row(row: usize, inter: usize) -> usize {
    let (pair, within) = (row / (2 * BLOCK), row % (2 * BLOCK));
    if within < BLOCK {
        pair * BLOCK + within
    } else {
        inter + pair * BLOCK + within - BLOCK
    }
}

/// W1 `[E_l, 2I, H]` and its scales `[E_l, 2I/128, H/128]` with gate and up interleaved by 128
/// rows (module comment).
pub fn interleave_w1(
    w1: &[u8],
    s1: &[f32],
    shape: &Shape,
    local_experts: usize,
) -> (Vec<u8>, Vec<f32>) {
    let (h, i) = (shape.hidden, shape.inter);
    let rows = local_experts * 2 * i;
    let mut w = vec![0u8; w1.len()];
    let mut s = vec![0f32; s1.len()];
    let scale_cols = h / BLOCK;
    for e in 0..local_experts {
        for row in 0..2 * i {
            let src = e * 2 * i + interleaved_source_row(row, i);
            let dst = e * 2 * i + row;
            w[dst * h..][..h].copy_from_slice(&w1[src * h..][..h]);
        }
        for block in 0..2 * i / BLOCK {
            let src = e * 2 * i / BLOCK + interleaved_source_row(block * BLOCK, i) / BLOCK;
            let dst = e * 2 * i / BLOCK + block;
            s[dst * scale_cols..][..scale_cols]
                .copy_from_slice(&s1[src * scale_cols..][..scale_cols]);
        }
    }
    debug_assert_eq!(rows * h, w.len());
    (w, s)
}

/// Checks one rank's weights against the SPEC §2 sizes.
pub fn check(weights: &RankWeightsFp8, shape: &Shape, local_experts: usize) -> Result<()> {
    let (h, i, el) = (shape.hidden, shape.inter, local_experts);
    let blocks = |rows: usize, cols: usize| rows * cols / (BLOCK * BLOCK);
    for (arg, got, expected) in [
        ("w1", weights.w1.len(), el * 2 * i * h),
        ("s1", weights.s1.len(), el * blocks(2 * i, h)),
        ("w2", weights.w2.len(), el * h * i),
        ("s2", weights.s2.len(), el * blocks(h, i)),
    ] {
        if got != expected {
            return Err(Error::Length { arg, got, expected });
        }
    }
    Ok(())
}

/// One rank's weights on its GPU: W1 (gate and up interleaved) and its scales, W2 and its
/// scales, in the layouts the L1 and L2 GEMMs read.
pub(crate) struct DeviceWeights {
    pub w1: DeviceBuffer,
    pub s1: DeviceBuffer,
    pub w2: DeviceBuffer,
    pub s2: DeviceBuffer,
}

/// Rank `rank`'s weights from `weights(rank)`, checked against `shape`'s sizes, on `gpu`.
pub(crate) fn upload(
    gpu: &Gpu,
    rank: usize,
    weights: impl Fn(usize) -> Result<RankWeightsFp8>,
    shape: &Shape,
    local_experts: usize,
) -> crate::error::Result<DeviceWeights> {
    let w = weights(rank).map_err(|e| LayerError::input(rank, e))?;
    check(&w, shape, local_experts).map_err(|e| LayerError::input(rank, e))?;
    let (w1, s1) = interleave_w1(&w.w1, &w.s1, shape, local_experts);
    Ok(DeviceWeights {
        w1: gpu.alloc_from(&w1)?,
        s1: gpu.alloc_from(&s1)?,
        w2: gpu.alloc_from(&w.w2)?,
        s2: gpu.alloc_from(&w.s2)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_256_row_tile_holds_a_gate_block_then_its_up_block() {
        let inter = 384;
        let rows: Vec<usize> = (0..2 * inter)
            .map(|r| interleaved_source_row(r, inter))
            .collect();
        assert_eq!(rows[0], 0);
        assert_eq!(rows[127], 127);
        assert_eq!(rows[128], 384);
        assert_eq!(rows[255], 511);
        assert_eq!(rows[256], 128);
        assert_eq!(rows[2 * inter - 1], 2 * inter - 1);
        let mut sorted = rows.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..2 * inter).collect::<Vec<_>>(), "a permutation");
    }

    #[test]
    fn rows_and_scales_move_together() {
        let shape = Shape {
            hidden: 256,
            inter: 256,
            experts: 2,
            topk: 1,
        };
        let (el, h, i) = (2, 256, 256);
        // Every byte of a row holds its (expert, row) identity mod 251; every scale its block.
        let w1: Vec<u8> = (0..el * 2 * i * h).map(|x| ((x / h) % 251) as u8).collect();
        let s1: Vec<f32> = (0..el * 2 * i / 128 * 2).map(|x| (x / 2) as f32).collect();
        let (w, s) = interleave_w1(&w1, &s1, &shape, el);
        for e in 0..el {
            for row in 0..2 * i {
                let src = e * 2 * i + interleaved_source_row(row, i);
                assert!(w[(e * 2 * i + row) * h..][..h]
                    .iter()
                    .all(|&b| b == (src % 251) as u8));
                let block = (e * 2 * i + row) / 128;
                assert_eq!(s[block * 2], (src / 128) as f32);
                assert_eq!(s[block * 2 + 1], (src / 128) as f32);
            }
        }
    }
}
