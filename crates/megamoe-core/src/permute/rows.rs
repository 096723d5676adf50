//! Row matrices that dispatch moves: bf16 rows, or e4m3 rows with f32 scales per 128 columns.

use half::bf16;
use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::routing::check_len;

/// bf16 rows `[rows, hidden]`, row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Bf16Rows {
    pub rows: usize,
    pub hidden: usize,
    pub values: Vec<bf16>,
}

/// e4m3 rows `[rows, hidden]` (opaque `e4m3fn` codes, row-major) with f32 scales
/// `[rows, hidden / 128]`: scale j multiplies columns 128·j … 128·j + 127 of its row.
#[derive(Clone, Debug, PartialEq)]
pub struct Fp8Rows {
    pub rows: usize,
    pub hidden: usize,
    pub codes: Vec<u8>,
    pub scales: Vec<f32>,
}

/// Columns one FP8 scale covers.
pub const SCALE_BLOCK: usize = 128;

/// A row matrix dispatch can move. Rows are copied bit for bit; padding rows are all zero
/// bits (zero values, zero scales).
pub trait PermuteRows: Sized + Send + Sync {
    fn rows(&self) -> usize;
    fn hidden(&self) -> usize;
    /// Checks that the buffers hold `rows × hidden` values; `arg` names the argument.
    fn check(&self, arg: &'static str) -> Result<()>;
    /// Builds `sources.len()` rows of width `hidden`: row i is row `sources[i].1` of
    /// `inputs[sources[i].0]`, or zeros where `sources[i]` is `None`.
    fn gather(inputs: &[Self], hidden: usize, sources: &[Option<(usize, usize)>]) -> Self;
}

impl Bf16Rows {
    pub fn zeros(rows: usize, hidden: usize) -> Self {
        Bf16Rows {
            rows,
            hidden,
            values: vec![bf16::ZERO; rows * hidden],
        }
    }

    pub fn row(&self, i: usize) -> &[bf16] {
        &self.values[i * self.hidden..(i + 1) * self.hidden]
    }
}

impl Fp8Rows {
    pub fn row_codes(&self, i: usize) -> &[u8] {
        &self.codes[i * self.hidden..(i + 1) * self.hidden]
    }

    pub fn row_scales(&self, i: usize) -> &[f32] {
        let blocks = self.hidden / SCALE_BLOCK;
        &self.scales[i * blocks..(i + 1) * blocks]
    }
}

impl PermuteRows for Bf16Rows {
    fn rows(&self) -> usize {
        self.rows
    }

    fn hidden(&self) -> usize {
        self.hidden
    }

    fn check(&self, arg: &'static str) -> Result<()> {
        check_len(arg, self.values.len(), self.rows * self.hidden)
    }

    fn gather(inputs: &[Self], hidden: usize, sources: &[Option<(usize, usize)>]) -> Self {
        let mut out = Bf16Rows::zeros(sources.len(), hidden);
        if hidden > 0 {
            out.values
                .par_chunks_mut(hidden)
                .zip(sources)
                .for_each(|(dst, source)| {
                    if let Some((rank, row)) = *source {
                        dst.copy_from_slice(inputs[rank].row(row));
                    }
                });
        }
        out
    }
}

impl PermuteRows for Fp8Rows {
    fn rows(&self) -> usize {
        self.rows
    }

    fn hidden(&self) -> usize {
        self.hidden
    }

    fn check(&self, arg: &'static str) -> Result<()> {
        if self.hidden % SCALE_BLOCK != 0 {
            return Err(Error::Shape {
                arg,
                reason: format!(
                    "FP8 rows of width {} are not a multiple of the {SCALE_BLOCK}-column scale block",
                    self.hidden
                ),
            });
        }
        check_len(arg, self.codes.len(), self.rows * self.hidden)?;
        check_len(
            "scales",
            self.scales.len(),
            self.rows * (self.hidden / SCALE_BLOCK),
        )
    }

    fn gather(inputs: &[Self], hidden: usize, sources: &[Option<(usize, usize)>]) -> Self {
        let blocks = hidden / SCALE_BLOCK;
        let mut out = Fp8Rows {
            rows: sources.len(),
            hidden,
            codes: vec![0; sources.len() * hidden],
            scales: vec![0.0; sources.len() * blocks],
        };
        if blocks > 0 {
            out.codes
                .par_chunks_mut(hidden)
                .zip(out.scales.par_chunks_mut(blocks))
                .zip(sources)
                .for_each(|((codes, scales), source)| {
                    if let Some((rank, row)) = *source {
                        codes.copy_from_slice(inputs[rank].row_codes(row));
                        scales.copy_from_slice(inputs[rank].row_scales(row));
                    }
                });
        }
        out
    }
}
