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
use crate::numerics::INPUT_SCALE_FLOOR;
use crate::preset::Shape;
use crate::quant::{quantize_blocks, QuantBlocks, WEIGHT_BLOCK};

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

/// One expert's weights in f32 (the unquantized originals).
#[derive(Clone, Debug, PartialEq)]
pub struct ExpertF32 {
    /// `[2I, H]`.
    pub w1: Vec<f32>,
    /// `[H, I]`.
    pub w2: Vec<f32>,
}

/// One expert's weights quantized per 128×128 block.
#[derive(Clone, Debug, PartialEq)]
pub struct ExpertFp8 {
    /// `[2I, H]` with scales `[2I/128, H/128]`.
    pub w1: QuantBlocks,
    /// `[H, I]` with scales `[H/128, I/128]`.
    pub w2: QuantBlocks,
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

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[inline(always)]
fn mix32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^ (x >> 16)
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

    /// Writes rows `first_row…` of `matrix` of global expert `expert` into `out` (a whole
    /// number of rows).
    fn fill_rows(&self, expert: usize, matrix: Matrix, first_row: usize, out: &mut [f32]);

    /// Rows and columns of `matrix`.
    fn dims(&self, matrix: Matrix) -> (usize, usize) {
        matrix.dims(&self.shape())
    }
}

impl WeightSource for WeightGen {
    fn shape(&self) -> Shape {
        self.shape
    }

    /// Writes rows `first_row…` of `matrix` of global expert `expert` into `out` (a whole number
    /// of rows).
    fn fill_rows(&self, expert: usize, matrix: Matrix, first_row: usize, out: &mut [f32]) {
        let (rows, cols) = self.dims(matrix);
        assert!(expert < self.shape.experts, "expert {expert} out of range");
        assert!(
            out.len() % cols == 0 && first_row * cols + out.len() <= rows * cols,
            "rows out of range"
        );
        assert!(rows * cols <= 1 << 32, "element indices are 32-bit");
        #[cfg(target_arch = "x86_64")]
        if crate::simd::avx2_fma() {
            #[target_feature(enable = "avx2,fma")]
            unsafe fn fast(g: &WeightGen, e: usize, m: Matrix, first: usize, out: &mut [f32]) {
                g.fill_rows_body(e, m, first, out)
            }
            // SAFETY: the CPU has the features `fast` is compiled for.
            return unsafe { fast(self, expert, matrix, first_row, out) };
        }
        self.fill_rows_body(expert, matrix, first_row, out)
    }
}

impl WeightGen {
    pub fn new(shape: Shape, seed: u64) -> Self {
        WeightGen { shape, seed }
    }

    #[inline(always)]
    fn fill_rows_body(&self, expert: usize, matrix: Matrix, first_row: usize, out: &mut [f32]) {
        let cols = self.dims(matrix).1;
        let key = splitmix64(self.seed ^ splitmix64(2 * expert as u64 + matrix as u64));
        let (key_lo, key_hi) = (key as u32, (key >> 32) as u32);
        let amplitude = (3.0 / cols as f64).sqrt() as f32 * (1.0 / 2_147_483_648.0);
        let first = (first_row * cols) as u32;
        for (i, w) in out.iter_mut().enumerate() {
            let bits = mix32(mix32(first.wrapping_add(i as u32) ^ key_lo) ^ key_hi);
            *w = (bits as i32) as f32 * amplitude;
        }
    }

    /// Rows `first_row…first_row + rows` of `matrix`, quantized per 128×128 block
    /// (`first_row` and `rows` multiples of 128).
    pub fn quantized_rows(
        &self,
        expert: usize,
        matrix: Matrix,
        first_row: usize,
        rows: usize,
    ) -> QuantBlocks {
        assert!(first_row % WEIGHT_BLOCK == 0, "strips start on a block row");
        let cols = self.dims(matrix).1;
        let mut values = vec![0f32; rows * cols];
        self.fill_rows(expert, matrix, first_row, &mut values);
        quantize_blocks(&values, rows, cols, INPUT_SCALE_FLOOR)
            .expect("shape rules make every weight matrix a whole number of blocks")
    }

    /// One expert's unquantized weights.
    pub fn expert_f32(&self, expert: usize) -> ExpertF32 {
        let full = |matrix| {
            let (rows, cols) = self.dims(matrix);
            let mut values = vec![0f32; rows * cols];
            self.fill_rows(expert, matrix, 0, &mut values);
            values
        };
        ExpertF32 {
            w1: full(Matrix::W1),
            w2: full(Matrix::W2),
        }
    }

    /// One expert's quantized weights.
    pub fn expert_fp8(&self, expert: usize) -> ExpertFp8 {
        let full = |matrix| self.quantized_rows(expert, matrix, 0, self.dims(matrix).0);
        ExpertFp8 {
            w1: full(Matrix::W1),
            w2: full(Matrix::W2),
        }
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
        let experts: Vec<ExpertFp8> = (rank * local..(rank + 1) * local)
            .into_par_iter()
            .map(|e| self.expert_fp8(e))
            .collect();
        let concat =
            |part: fn(&ExpertFp8) -> &[u8]| experts.iter().flat_map(part).copied().collect();
        let concat_scales =
            |part: fn(&ExpertFp8) -> &[f32]| experts.iter().flat_map(part).copied().collect();
        Ok(RankWeightsFp8 {
            w1: concat(|x| &x.w1.codes),
            s1: concat_scales(|x| &x.w1.scales),
            w2: concat(|x| &x.w2.codes),
            s2: concat_scales(|x| &x.w2.scales),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preset::Preset;

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
        assert_ne!(g.expert_f32(4).w1, full.w1);
        assert_ne!(WeightGen::new(g.shape, 8).expert_f32(3).w1, full.w1);
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
