//! Expert weights generated from a seed (SPEC §2 layouts), so that every tool and every rank
//! builds the same weights without storing them.
//!
//! Element `i` (row-major index) of matrix `m` (0 = W1 `[2I, H]`, 1 = W2 `[H, I]`) of global
//! expert `e` is a pure function of (seed, e, m, i):
//!
//! ```text
//! key  = splitmix64(seed ^ splitmix64(2·e + m))          (64 bits, per matrix)
//! bits = mix32(mix32((i as u32) ^ key_lo) ^ key_hi)      (mix32 = "lowbias32" finalizer)
//! w    = (bits as i32) as f32 · (sqrt(3 / fan_in) · 2^-31)
//! ```
//!
//! i.e. uniform on [-a, a) with a = sqrt(3 / fan_in) (variance 1 / fan_in; fan_in = H for W1,
//! I for W2). The quantized weights are these values through the 128×128 block quantizer
//! (floor 1e-4). Experts are generated one at a time: a large preset's weights do not fit in
//! memory all at once.

use rayon::prelude::*;

use crate::error::Result;
use crate::numerics::{amax, e4m3_from_f32, scale_factor, INPUT_SCALE_FLOOR};
use crate::preset::Shape;
use crate::quant::{QuantBlocks, WEIGHT_BLOCK};
use crate::rng::{mix32, splitmix64};

/// One of an expert's two matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Matrix {
    /// L1 weights `[2I, H]`: rows 0…I−1 gate, rows I…2I−1 up.
    W1 = 0,
    /// L2 weights `[H, I]`.
    W2 = 1,
}

/// The generator of every expert's weights for one shape and seed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightGen {
    pub shape: Shape,
    pub seed: u64,
}

/// One expert's two matrices, W1 `[2I, H]` and W2 `[H, I]`, in some representation.
#[derive(Clone, Debug, PartialEq)]
pub struct Expert<M> {
    pub w1: M,
    pub w2: M,
}

/// One expert's weights in f32 (the unquantized originals).
pub type ExpertF32 = Expert<Vec<f32>>;

/// One expert's weights quantized per 128×128 block: scales `[2I/128, H/128]` for W1,
/// `[H/128, I/128]` for W2.
pub type ExpertFp8 = Expert<QuantBlocks>;

impl<M> Expert<M> {
    /// Both matrices, each made by `make(matrix)`.
    fn from_fn(make: impl Fn(Matrix) -> M) -> Self {
        Expert {
            w1: make(Matrix::W1),
            w2: make(Matrix::W2),
        }
    }
}

/// One rank's quantized weights in the SPEC §2 layouts.
#[derive(Clone, Debug, PartialEq)]
pub struct RankWeightsFp8 {
    /// e4m3 `[E_l, 2I, H]`.
    pub w1: Vec<u8>,
    /// f32 `[E_l, 2I/128, H/128]`.
    pub s1: Vec<f32>,
    /// e4m3 `[E_l, H, I]`.
    pub w2: Vec<u8>,
    /// f32 `[E_l, H/128, I/128]`.
    pub s2: Vec<f32>,
}

impl Matrix {
    /// Rows and columns of this matrix in `shape`.
    pub fn dims(self, shape: &Shape) -> (usize, usize) {
        let Shape { hidden, inter, .. } = *shape;
        match self {
            Matrix::W1 => (2 * inter, hidden),
            Matrix::W2 => (hidden, inter),
        }
    }
}

/// Where the references get expert weights from: rows of each expert's f32 originals.
/// [`WeightGen`] is the one every tool uses; tests bring hand-made ones.
pub trait WeightSource: Sync {
    fn shape(&self) -> Shape;

    /// Writes columns `first_col…first_col + width` of rows `first_row…` of `matrix` of global
    /// expert `expert` into `out` (`[out.len() / width, width]`, row-major).
    fn fill_block(
        &self,
        expert: usize,
        matrix: Matrix,
        first_row: usize,
        first_col: usize,
        width: usize,
        out: &mut [f32],
    );

    /// Writes whole rows `first_row…` of `matrix` of global expert `expert` into `out`.
    fn fill_rows(&self, expert: usize, matrix: Matrix, first_row: usize, out: &mut [f32]) {
        let cols = self.dims(matrix).1;
        self.fill_block(expert, matrix, first_row, 0, cols, out)
    }

    /// Rows and columns of `matrix`.
    fn dims(&self, matrix: Matrix) -> (usize, usize) {
        matrix.dims(&self.shape())
    }
}

impl WeightSource for WeightGen {
    fn shape(&self) -> Shape {
        self.shape
    }

    fn fill_block(
        &self,
        expert: usize,
        matrix: Matrix,
        first_row: usize,
        first_col: usize,
        width: usize,
        out: &mut [f32],
    ) {
        let (rows, cols) = self.dims(matrix);
        assert!(expert < self.shape.experts, "expert {expert} out of range");
        assert!(
            width > 0
                && first_col + width <= cols
                && out.len() % width == 0
                && first_row + out.len() / width <= rows,
            "block out of range"
        );
        assert!(rows * cols <= 1 << 32, "element indices are 32-bit");
        let first = first_row * cols + first_col;
        #[cfg(target_arch = "x86_64")]
        if crate::simd::avx2_fma() {
            #[target_feature(enable = "avx2,fma")]
            unsafe fn fast(
                g: &WeightGen,
                e: usize,
                m: Matrix,
                f: usize,
                w: usize,
                out: &mut [f32],
            ) {
                g.fill_block_body(e, m, f, w, out)
            }
            // SAFETY: the CPU has the features `fast` is compiled for.
            return unsafe { fast(self, expert, matrix, first, width, out) };
        }
        self.fill_block_body(expert, matrix, first, width, out)
    }
}

impl WeightGen {
    pub fn new(shape: Shape, seed: u64) -> Self {
        WeightGen { shape, seed }
    }

    /// Rows of `width` elements starting at flat indices `first`, `first + cols`, ….
    #[inline(always)]
    fn fill_block_body(
        &self,
        expert: usize,
        matrix: Matrix,
        first: usize,
        width: usize,
        out: &mut [f32],
    ) {
        let cols = self.dims(matrix).1;
        let key = splitmix64(self.seed ^ splitmix64(2 * expert as u64 + matrix as u64));
        let (key_lo, key_hi) = (key as u32, (key >> 32) as u32);
        let amplitude = (3.0 / cols as f64).sqrt() as f32 * (1.0 / 2_147_483_648.0);
        for (r, out) in out.chunks_exact_mut(width).enumerate() {
            let first = (first + r * cols) as u32;
            for (i, w) in out.iter_mut().enumerate() {
                let bits = mix32(mix32(first.wrapping_add(i as u32) ^ key_lo) ^ key_hi);
                *w = (bits as i32) as f32 * amplitude;
            }
        }
    }

    /// One expert's unquantized weights.
    pub fn expert_f32(&self, expert: usize) -> ExpertF32 {
        Expert::from_fn(|matrix| {
            let (rows, cols) = self.dims(matrix);
            let mut values = vec![0f32; rows * cols];
            self.fill_rows(expert, matrix, 0, &mut values);
            values
        })
    }

    /// One expert's quantized weights.
    pub fn expert_fp8(&self, expert: usize) -> ExpertFp8 {
        Expert::from_fn(|matrix| {
            let (rows, cols) = self.dims(matrix);
            let mut strip = QuantBlocks::default();
            let mut all = QuantBlocks {
                rows,
                cols,
                codes: Vec::with_capacity(rows * cols),
                scales: Vec::with_capacity(rows * cols / (WEIGHT_BLOCK * WEIGHT_BLOCK)),
            };
            for first_row in (0..rows).step_by(WEIGHT_BLOCK) {
                quantized_strip(self, expert, matrix, first_row, &mut strip);
                all.codes.extend_from_slice(&strip.codes);
                all.scales.extend_from_slice(&strip.scales);
            }
            all
        })
    }

    /// The quantized weights of the experts `rank` owns in a world of `ranks` ranks, generated in
    /// parallel.
    pub fn rank_fp8(&self, rank: usize, ranks: usize) -> Result<RankWeightsFp8> {
        self.shape.validate(ranks)?;
        if rank >= ranks {
            return Err(crate::error::Error::Value {
                arg: "rank",
                value: rank.to_string(),
                reason: format!("must be below the number of ranks, {ranks}"),
            });
        }
        let local = self.shape.local_experts(ranks);
        let (w1, w2) = (self.dims(Matrix::W1), self.dims(Matrix::W2));
        let blocks = |(rows, cols): (usize, usize)| rows * cols / (WEIGHT_BLOCK * WEIGHT_BLOCK);
        let mut out = RankWeightsFp8 {
            w1: vec![0; local * w1.0 * w1.1],
            s1: vec![0.0; local * blocks(w1)],
            w2: vec![0; local * w2.0 * w2.1],
            s2: vec![0.0; local * blocks(w2)],
        };
        out.w1
            .par_chunks_mut(w1.0 * w1.1)
            .zip(out.s1.par_chunks_mut(blocks(w1)))
            .zip(out.w2.par_chunks_mut(w2.0 * w2.1))
            .zip(out.s2.par_chunks_mut(blocks(w2)))
            .enumerate()
            .for_each(|(i, (((w1, s1), w2), s2))| {
                let expert = self.expert_fp8(rank * local + i);
                w1.copy_from_slice(&expert.w1.codes);
                s1.copy_from_slice(&expert.w1.scales);
                w2.copy_from_slice(&expert.w2.codes);
                s2.copy_from_slice(&expert.w2.scales);
            });
        Ok(out)
    }
}

/// Generates and quantizes the 128-row strip of `matrix` of `expert` starting at `first_row`
/// into `out` (resized to `[128, K]`, scales `[1, K/128]`): the same result as
/// [`crate::quant::quantize_blocks`] with floor 1e-4.
pub fn quantized_strip<S: WeightSource>(
    weights: &S,
    expert: usize,
    matrix: Matrix,
    first_row: usize,
    out: &mut QuantBlocks,
) {
    let cols = weights.dims(matrix).1;
    let mut strip = vec![0f32; WEIGHT_BLOCK * cols];
    weights.fill_rows(expert, matrix, first_row, &mut strip);
    out.rows = WEIGHT_BLOCK;
    out.cols = cols;
    encode_f32_strip(&strip, e4m3_from_f32, &mut out.codes, &mut out.scales);
}

/// Quantizes a strip of f32 weights (`[128, K]`, row-major) per 128×128 block: the block
/// scales in `scales` and each element's `encode(w · (1/scale))` (the e4m3 code, or its
/// value) in `values`.
pub(crate) fn encode_f32_strip<T, E>(
    strip: &[f32],
    encode: E,
    values: &mut Vec<T>,
    scales: &mut Vec<f32>,
) where
    T: Copy + Default,
    E: Fn(f32) -> T,
{
    let cols = strip.len() / WEIGHT_BLOCK;
    values.resize(WEIGHT_BLOCK * cols, T::default());
    scales.resize(cols / WEIGHT_BLOCK, 0.0);
    #[cfg(target_arch = "x86_64")]
    if crate::simd::avx2_fma() {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn fast<T: Copy, E: Fn(f32) -> T>(
            strip: &[f32],
            encode: E,
            values: &mut [T],
            scales: &mut [f32],
        ) {
            encode_f32_strip_body(strip, encode, values, scales)
        }
        // SAFETY: the CPU has the features `fast` is compiled for.
        return unsafe { fast(strip, encode, values, scales) };
    }
    encode_f32_strip_body(strip, encode, values, scales)
}

#[inline(always)]
fn encode_f32_strip_body<T: Copy, E: Fn(f32) -> T>(
    strip: &[f32],
    encode: E,
    values: &mut [T],
    scales: &mut [f32],
) {
    let cols = strip.len() / WEIGHT_BLOCK;
    for (b, scale) in scales.iter_mut().enumerate() {
        let block = || {
            strip
                .chunks_exact(cols)
                .map(move |row| &row[b * WEIGHT_BLOCK..][..WEIGHT_BLOCK])
        };
        // The largest magnitude of the block: per column first, so that it vectorizes (a
        // maximum is exact in any order).
        let mut columns = [0f32; WEIGHT_BLOCK];
        for row in block() {
            for (m, v) in columns.iter_mut().zip(row) {
                *m = m.max(v.abs());
            }
        }
        *scale = scale_factor(amax(&columns), INPUT_SCALE_FLOOR);
        let inverse = 1.0 / *scale;
        for (dst, src) in values.chunks_exact_mut(cols).zip(block()) {
            for (d, &v) in dst[b * WEIGHT_BLOCK..][..WEIGHT_BLOCK].iter_mut().zip(src) {
                *d = encode(v * inverse);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preset::Preset;
    use crate::quant::quantize_blocks;

    fn tiny() -> WeightGen {
        WeightGen::new(Preset::by_name("tiny").unwrap().shape, 7)
    }

    #[test]
    fn rows_are_a_pure_function_of_seed_expert_matrix_and_index() {
        let g = tiny();
        let full = g.expert_f32(3);
        let mut part = vec![0f32; 2 * 256];
        g.fill_rows(3, Matrix::W1, 5, &mut part);
        assert_eq!(part, full.w1[5 * 256..7 * 256]);
        let mut block = vec![0f32; 3 * 100];
        g.fill_block(3, Matrix::W1, 5, 17, 100, &mut block);
        for r in 0..3 {
            assert_eq!(
                block[r * 100..][..100],
                full.w1[(5 + r) * 256 + 17..][..100]
            );
        }
        assert_ne!(g.expert_f32(4).w1, full.w1);
        assert_ne!(WeightGen::new(g.shape, 8).expert_f32(3).w1, full.w1);
    }

    #[test]
    fn expert_fp8_is_the_block_quantizer_on_the_f32_originals() {
        let g = tiny();
        let (f, q) = (g.expert_f32(2), g.expert_fp8(2));
        assert_eq!(
            q.w1,
            quantize_blocks(&f.w1, 256, 256, INPUT_SCALE_FLOOR).unwrap()
        );
        assert_eq!(
            q.w2,
            quantize_blocks(&f.w2, 256, 128, INPUT_SCALE_FLOOR).unwrap()
        );
    }

    #[test]
    fn weights_have_variance_one_over_fan_in() {
        let g = tiny();
        let w = g.expert_f32(0);
        for (values, fan_in) in [(&w.w1, 256.0), (&w.w2, 128.0)] {
            let var =
                values.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / values.len() as f64;
            assert!((var * fan_in - 1.0).abs() < 0.05, "variance {var}");
        }
    }

    #[test]
    fn rank_weights_stack_the_local_experts() {
        let g = tiny();
        let rank = g.rank_fp8(1, 4).unwrap();
        let e5 = g.expert_fp8(5);
        let w1_len = e5.w1.codes.len();
        assert_eq!(rank.w1.len(), 4 * w1_len);
        assert_eq!(rank.w1[w1_len..2 * w1_len], e5.w1.codes);
        assert_eq!(
            rank.s2[e5.w2.scales.len()..2 * e5.w2.scales.len()],
            e5.w2.scales
        );
        assert!(g.rank_fp8(4, 4).is_err());
    }
}
