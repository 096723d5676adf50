//! The FP8 reference path, SPEC §3 step by step.
//!
//! Exactness: every finite e4m3 value is an integer multiple of 2^-9 with magnitude ≤ 448, so a
//! product of two is an integer multiple of 2^-18 below 2^18 in magnitude, and a sum of up to
//! 128 of them is a multiple of 2^-18 below 2^25: it needs at most 43 significant bits, so
//! summing the products in f64 is exact in any order. The block sum is then rounded to f32 once.
//!
//! The f32 operation order of one output element n of a GEMM (K columns, activation scale
//! groups of G columns, G ∈ {64, 128}; weight scale blocks of 128):
//!
//! ```text
//! running = 0f32
//! for j in 0..K/G (ascending):
//!     block_sum = f32( Σ_{k in group j} q_x[t,k] · q_w[n,k] )      exact, then one rounding
//!     scale     = sa[t,j] · sb[n/128, j·G/128]                        f32 multiply
//!     running   = fma(block_sum, scale, running)                     f32, one rounding
//! out[t,n] = running        (L1: h, f32; L2: o = bf16(running), round to nearest even)
//! ```
//!
//! The SwiGLU in f32: g = min(g, c), u = clamp(u, −c, c) when clamped;
//! silu(g) = g / (1 + e) with e = f32(exp_f64(−g)) (the f64 exponential rounded once: the
//! same bits on every platform in practice, unlike f32 `exp`); a = (silu(g) · u) · topk_weight.
//! Then a is re-quantized per G columns (floor 1e-10) for L2. The combine is in `super`.

use half::bf16;

use super::rows::{block_scaled_strip, ScaledRows};
use super::{for_each_strip, weighted_swiglu, write_output, LayerOptions, Routed};
use crate::batch::WorldInputs;
use crate::numerics::{e4m3_round, e4m3_to_f32, INPUT_SCALE_FLOOR, INTERMEDIATE_SCALE_FLOOR};
use crate::quant::{quantize_rows, QuantRows, INPUT_GROUP};
use crate::weights::{encode_f32_strip, Matrix, WeightSource};

/// Every rank's input quantized per token per 128 columns (floor 1e-4).
pub(super) fn quantize_inputs(world: &WorldInputs) -> Vec<QuantRows> {
    let hidden = world.shape.hidden;
    world
        .ranks
        .iter()
        .map(|r| {
            let x: Vec<f32> = r.x.iter().map(|v| v.to_f32()).collect();
            quantize_rows(&x, r.tokens, hidden, INPUT_GROUP, INPUT_SCALE_FLOOR)
                .expect("inputs were checked against the shape")
        })
        .collect()
}

/// Activation rows of one expert (e4m3 values as f64) with their scales per `group` columns.
pub(super) struct Acts {
    values: Vec<f64>,
    scales: Vec<f32>,
    group: usize,
}

impl Acts {
    fn rows(&self) -> ScaledRows<'_> {
        ScaledRows {
            values: &self.values,
            scales: &self.scales,
            group: self.group,
        }
    }
}

/// Computes the bf16 output of every slot routed to `expert`.
pub(super) fn expert(
    world: &WorldInputs,
    inputs: &[QuantRows],
    weights: &impl WeightSource,
    options: &LayerOptions,
    expert: usize,
    routed: &mut [Routed<bf16>],
) {
    let x = l1_input(world, inputs, routed);
    let h = gemm(weights, expert, Matrix::W1, &x);
    let a = l2_input(world, routed, &h, options);
    let o = gemm(weights, expert, Matrix::W2, &a);
    write_output(world, routed, &o, |dst, v| *dst = bf16::from_f32(v));
}

/// The quantized input rows of the slots routed to the expert.
pub(super) fn l1_input<O>(world: &WorldInputs, inputs: &[QuantRows], routed: &[Routed<O>]) -> Acts {
    let hidden = world.shape.hidden;
    let n = routed.len();
    let mut values = Vec::with_capacity(n * hidden);
    let mut scales = Vec::with_capacity(n * hidden / INPUT_GROUP);
    for r in routed {
        let q = &inputs[r.rank];
        values.extend(
            q.codes[r.token * hidden..][..hidden]
                .iter()
                .map(|&c| f64::from(e4m3_to_f32(c))),
        );
        scales
            .extend_from_slice(&q.scales[r.token * hidden / INPUT_GROUP..][..hidden / INPUT_GROUP]);
    }
    Acts {
        values,
        scales,
        group: INPUT_GROUP,
    }
}

/// The L1 output `h` through the weighted SwiGLU, re-quantized per `options.group` columns.
pub(super) fn l2_input<O>(
    world: &WorldInputs,
    routed: &[Routed<O>],
    h: &[f32],
    options: &LayerOptions,
) -> Acts {
    let a = weighted_swiglu(world, routed, h, |g, u, weight| {
        swiglu(g, u, options.clamp, weight)
    });
    let a = quantize_rows(
        &a,
        routed.len(),
        world.shape.inter,
        options.group,
        INTERMEDIATE_SCALE_FLOOR,
    )
    .expect("I is a multiple of 128");
    Acts {
        values: a.codes.iter().map(|&c| f64::from(e4m3_to_f32(c))).collect(),
        scales: a.scales,
        group: options.group,
    }
}

/// out[t, n] for every activation row t of `acts` against every row n of the quantized
/// `matrix` of `expert`, in the operation order of the module comment. Returns `[n, N]`.
fn gemm(weights: &impl WeightSource, expert: usize, matrix: Matrix, acts: &Acts) -> Vec<f32> {
    let mut out = output(weights, matrix, acts);
    let mut strip = Strip::default();
    for_each_strip(weights, expert, matrix, |first_row, w| {
        strip.add(w, acts, first_row, &mut out)
    });
    out
}

/// The zeroed `[n, N]` output of `matrix` against `acts`.
pub(super) fn output(weights: &impl WeightSource, matrix: Matrix, acts: &Acts) -> Vec<f32> {
    let (rows, cols) = weights.dims(matrix);
    vec![0f32; acts.values.len() / cols * rows]
}

/// The buffers of one quantized weight strip.
#[derive(Default)]
pub(super) struct Strip {
    values: Vec<f32>,
    scales: Vec<f32>,
}

impl Strip {
    /// Quantizes the f32 weight strip `w` (`[128, K]`, rows `first_row…`) and adds its
    /// products with `acts` to `out` (`[n, N]`).
    pub(super) fn add(&mut self, w: &[f32], acts: &Acts, first_row: usize, out: &mut [f32]) {
        encode_f32_strip(w, e4m3_round, &mut self.values, &mut self.scales);
        block_scaled_strip(&self.values, &self.scales, &acts.rows(), first_row, out);
    }
}

/// SPEC §3's SwiGLU of one element in f32: a = silu(g) · u · weight with the optional clamp c
/// (g = min(g, c), u = clamp(u, −c, c)), silu(g) = g / (1 + e), e = f32(exp_f64(−g)).
pub fn swiglu(g: f32, u: f32, clamp: Option<f32>, weight: f32) -> f32 {
    let (g, u) = match clamp {
        Some(c) => (g.min(c), u.clamp(-c, c)),
        None => (g, u),
    };
    let e = (-f64::from(g)).exp() as f32;
    g / (1.0 + e) * u * weight
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swiglu_follows_the_formula_and_the_clamp() {
        assert_eq!(swiglu(0.0, 5.0, None, 1.0), 0.0);
        let silu1 = 1.0f32 / (1.0 + (-1.0f64).exp() as f32);
        assert_eq!(swiglu(1.0, 2.0, None, 0.5), silu1 * 2.0 * 0.5);
        let silu3 = 3.0f32 / (1.0 + (-3.0f64).exp() as f32);
        assert_eq!(swiglu(7.0, -9.0, Some(3.0), 1.0), silu3 * -3.0);
        // Very negative gates go to -0 without producing NaN.
        assert_eq!(swiglu(-200.0, 1.0, None, 1.0), 0.0);
    }
}
