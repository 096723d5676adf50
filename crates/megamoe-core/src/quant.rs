//! Quantizers (SPEC §2-§3): activations per row per group of contiguous columns, weights per
//! 128×128 block. Both apply the one scale rule of [`crate::numerics::scale`].

use crate::error::{Error, Result};
use crate::numerics::{amax, e4m3_to_f32, encode_scaled, quantize_group, scale_factor};
use crate::preset::Shape;

/// Rows and columns of one weight scale block.
pub const WEIGHT_BLOCK: usize = 128;

/// Column group of the layer input's scales.
pub const INPUT_GROUP: usize = 128;

/// A row-major matrix quantized per row per `group` contiguous columns.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantRows {
    pub rows: usize,
    pub cols: usize,
    pub group: usize,
    /// e4m3 codes `[rows, cols]`.
    pub codes: Vec<u8>,
    /// f32 scales `[rows, cols / group]`.
    pub scales: Vec<f32>,
}

/// A row-major matrix quantized per 128×128 block.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QuantBlocks {
    pub rows: usize,
    pub cols: usize,
    /// e4m3 codes `[rows, cols]`.
    pub codes: Vec<u8>,
    /// f32 scales `[rows / 128, cols / 128]`.
    pub scales: Vec<f32>,
}

/// The intermediate's default scale group (SPEC §3): 128 when H and 2I are multiples of 512,
/// else 64.
pub fn default_group(shape: &Shape) -> usize {
    if shape.hidden % 512 == 0 && (2 * shape.inter) % 512 == 0 {
        128
    } else {
        64
    }
}

fn check_matrix(arg: &'static str, len: usize, rows: usize, cols: usize) -> Result<()> {
    // A saturated product is no slice's length, so an overflowing shape is a mismatch.
    let expected = rows.saturating_mul(cols);
    if len != expected {
        return Err(Error::Length {
            arg,
            got: len,
            expected,
        });
    }
    Ok(())
}

fn check_multiple(arg: &'static str, value: usize, of: usize) -> Result<()> {
    if of == 0 || value % of != 0 {
        return Err(Error::Shape {
            arg,
            reason: format!("{value} is not a multiple of {of}"),
        });
    }
    Ok(())
}

/// Quantizes `values` `[rows, cols]` per row per `group` columns with the given scale floor.
pub fn quantize_rows(
    values: &[f32],
    rows: usize,
    cols: usize,
    group: usize,
    floor: f32,
) -> Result<QuantRows> {
    check_matrix("values", values.len(), rows, cols)?;
    check_multiple("cols", cols, group)?;
    let mut codes = vec![0u8; values.len()];
    let scales = values
        .chunks_exact(group)
        .zip(codes.chunks_exact_mut(group))
        .map(|(v, c)| quantize_group(v, floor, c))
        .collect();
    Ok(QuantRows {
        rows,
        cols,
        group,
        codes,
        scales,
    })
}

/// Quantizes `values` `[rows, cols]` per 128×128 block with the given scale floor.
pub fn quantize_blocks(
    values: &[f32],
    rows: usize,
    cols: usize,
    floor: f32,
) -> Result<QuantBlocks> {
    check_matrix("values", values.len(), rows, cols)?;
    check_multiple("rows", rows, WEIGHT_BLOCK)?;
    check_multiple("cols", cols, WEIGHT_BLOCK)?;
    // No strips to walk (and zero columns would make an empty strip).
    if values.is_empty() {
        return Ok(QuantBlocks {
            rows,
            cols,
            ..QuantBlocks::default()
        });
    }
    let mut codes = vec![0u8; values.len()];
    let mut scales = vec![0f32; (rows / WEIGHT_BLOCK) * (cols / WEIGHT_BLOCK)];
    #[cfg(target_arch = "x86_64")]
    if crate::simd::avx2_fma() {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn fast(v: &[f32], cols: usize, floor: f32, c: &mut [u8], s: &mut [f32]) {
            quantize_blocks_body(v, cols, floor, c, s)
        }
        // SAFETY: the CPU has the features `fast` is compiled for.
        unsafe { fast(values, cols, floor, &mut codes, &mut scales) };
        return Ok(QuantBlocks {
            rows,
            cols,
            codes,
            scales,
        });
    }
    quantize_blocks_body(values, cols, floor, &mut codes, &mut scales);
    Ok(QuantBlocks {
        rows,
        cols,
        codes,
        scales,
    })
}

/// Per 128-row strip: each block's amax over its 128 row segments, then each segment encoded
/// with its block's inverse scale; the same rule as one [`quantize_group`] per block.
#[inline(always)]
fn quantize_blocks_body(
    values: &[f32],
    cols: usize,
    floor: f32,
    codes: &mut [u8],
    scales: &mut [f32],
) {
    let strip_len = WEIGHT_BLOCK * cols;
    let block_cols = cols / WEIGHT_BLOCK;
    let strips = values
        .chunks_exact(strip_len)
        .zip(codes.chunks_exact_mut(strip_len));
    for ((values, codes), scales) in strips.zip(scales.chunks_exact_mut(block_cols)) {
        let mut amaxes = vec![0f32; block_cols];
        for row in values.chunks_exact(cols) {
            for (m, segment) in amaxes.iter_mut().zip(row.chunks_exact(WEIGHT_BLOCK)) {
                *m = m.max(amax(segment));
            }
        }
        for (scale, &m) in scales.iter_mut().zip(&amaxes) {
            *scale = scale_factor(m, floor);
        }
        for (row, codes) in values.chunks_exact(cols).zip(codes.chunks_exact_mut(cols)) {
            let segments = row
                .chunks_exact(WEIGHT_BLOCK)
                .zip(codes.chunks_exact_mut(WEIGHT_BLOCK));
            for ((segment, codes), &scale) in segments.zip(scales.iter()) {
                encode_scaled(segment, 1.0 / scale, codes);
            }
        }
    }
}

impl QuantRows {
    /// The dequantized values, code · scale in f32.
    pub fn dequantize(&self) -> Vec<f32> {
        self.codes
            .chunks_exact(self.group)
            .zip(&self.scales)
            .flat_map(|(c, &s)| c.iter().map(move |&q| e4m3_to_f32(q) * s))
            .collect()
    }
}

impl QuantBlocks {
    /// The scale of element (`row`, `col`).
    pub fn scale_at(&self, row: usize, col: usize) -> f32 {
        self.scales[(row / WEIGHT_BLOCK) * (self.cols / WEIGHT_BLOCK) + col / WEIGHT_BLOCK]
    }

    /// The dequantized values, code · scale in f32.
    pub fn dequantize(&self) -> Vec<f32> {
        (0..self.rows * self.cols)
            .map(|i| e4m3_to_f32(self.codes[i]) * self.scale_at(i / self.cols, i % self.cols))
            .collect()
    }
}
