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
//! h[t,n] = running
//! ```
//!
//! The SwiGLU in f32: g = min(g, c), u = clamp(u, −c, c) when clamped;
//! silu(g) = g / (1 + e) with e = f32(exp_f64(−g)) (the correctly rounded f32 exponential,
//! platform-independent unlike f32 `exp`); a = (silu(g) · u) · topk_weight.

use half::bf16;

use super::rows::block_scaled_strip;
use super::{LayerOptions, Routed};
use crate::batch::WorldInputs;
use crate::numerics::{e4m3_to_f32, INPUT_SCALE_FLOOR, INTERMEDIATE_SCALE_FLOOR};
use crate::preset::Shape;
use crate::quant::{
    quantize_blocks_into, quantize_rows, QuantBlocks, QuantRows, INPUT_GROUP, WEIGHT_BLOCK,
};
use crate::weights::{Matrix, WeightSource};

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

/// Computes the bf16 output of every slot routed to `expert`.
pub(super) fn expert(
    world: &WorldInputs,
    inputs: &[QuantRows],
    weights: &impl WeightSource,
    options: &LayerOptions,
    expert: usize,
    routed: &mut [Routed<bf16>],
) {
    {
        let Shape {
            hidden,
            inter,
            topk,
            ..
        } = world.shape;
        let n = routed.len();
        let mut x = Vec::with_capacity(n * hidden);
        let mut x_scales = Vec::with_capacity(n * hidden / INPUT_GROUP);
        for r in routed.iter() {
            let q = &inputs[r.rank];
            x.extend(
                q.codes[r.token * hidden..][..hidden]
                    .iter()
                    .map(|&c| f64::from(e4m3_to_f32(c))),
            );
            x_scales.extend_from_slice(
                &q.scales[r.token * hidden / INPUT_GROUP..][..hidden / INPUT_GROUP],
            );
        }
        let h = gemm(weights, expert, Matrix::W1, &x, &x_scales, INPUT_GROUP, n);
        let mut a = vec![0f32; n * inter];
        for ((a, h), r) in a
            .chunks_exact_mut(inter)
            .zip(h.chunks_exact(2 * inter))
            .zip(routed.iter())
        {
            let weight = world.ranks[r.rank].topk_weights[r.token * topk + r.slot];
            let (gate, up) = h.split_at(inter);
            for ((a, &g), &u) in a.iter_mut().zip(gate).zip(up) {
                *a = swiglu(g, u, options.clamp, weight);
            }
        }
        let a = quantize_rows(&a, n, inter, options.group, INTERMEDIATE_SCALE_FLOOR)
            .expect("I is a multiple of 128");
        let a_values: Vec<f64> = a.codes.iter().map(|&c| f64::from(e4m3_to_f32(c))).collect();
        let o = gemm(
            weights,
            expert,
            Matrix::W2,
            &a_values,
            &a.scales,
            options.group,
            n,
        );
        for (r, o) in routed.iter_mut().zip(o.chunks_exact(hidden)) {
            for (dst, &v) in r.out.iter_mut().zip(o) {
                *dst = bf16::from_f32(v);
            }
        }
    }
}

/// out[t, n] for `n_tokens` activation rows `acts` (e4m3 values as f64, `[n_tokens, K]`) with
/// scales `[n_tokens, K/group]` against every row n of the quantized `matrix` of `expert`,
/// in the operation order of the module comment. Returns `[n_tokens, N]`.
fn gemm(
    weights: &impl WeightSource,
    expert: usize,
    matrix: Matrix,
    acts: &[f64],
    act_scales: &[f32],
    group: usize,
    n_tokens: usize,
) -> Vec<f32> {
    let (rows, cols) = weights.dims(matrix);
    let mut out = vec![0f32; n_tokens * rows];
    let mut strip = vec![0f32; WEIGHT_BLOCK * cols];
    let mut w = QuantBlocks::default();
    for first_row in (0..rows).step_by(WEIGHT_BLOCK) {
        weights.fill_rows(expert, matrix, first_row, &mut strip);
        quantize_blocks_into(&strip, WEIGHT_BLOCK, cols, INPUT_SCALE_FLOOR, &mut w)
            .expect("weights are whole blocks");
        block_scaled_strip(&w, acts, act_scales, group, first_row, &mut out);
    }
    out
}

/// a = silu(g) · u · weight in f32, with the optional clamp (module comment).
fn swiglu(g: f32, u: f32, clamp: Option<f32>, weight: f32) -> f32 {
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
