//! The unquantized path: bf16 x, the f32 original weights, f64 arithmetic, no rounding.

use super::rows::plain_strip;
use super::{LayerOptions, Routed};
use crate::batch::WorldInputs;
use crate::preset::Shape;
use crate::quant::WEIGHT_BLOCK;
use crate::weights::{Matrix, WeightSource};

/// Computes the f64 output of every slot routed to `expert`.
pub(super) fn expert(
    world: &WorldInputs,
    weights: &impl WeightSource,
    options: &LayerOptions,
    expert: usize,
    routed: &mut [Routed<f64>],
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
        for r in routed.iter() {
            let row = &world.ranks[r.rank].x[r.token * hidden..][..hidden];
            x.extend(row.iter().map(|v| f64::from(v.to_f32())));
        }
        let h = gemm(weights, expert, Matrix::W1, &x, n);
        let mut a = vec![0f64; n * inter];
        let clamp = options.clamp.map(f64::from);
        for ((a, h), r) in a
            .chunks_exact_mut(inter)
            .zip(h.chunks_exact(2 * inter))
            .zip(routed.iter())
        {
            let weight = f64::from(world.ranks[r.rank].topk_weights[r.token * topk + r.slot]);
            let (gate, up) = h.split_at(inter);
            for ((a, &g), &u) in a.iter_mut().zip(gate).zip(up) {
                let (g, u) = match clamp {
                    Some(c) => (g.min(c), u.clamp(-c, c)),
                    None => (g, u),
                };
                *a = g / (1.0 + (-g).exp()) * u * weight;
            }
        }
        let o = gemm(weights, expert, Matrix::W2, &a, n);
        for (r, o) in routed.iter_mut().zip(o.chunks_exact(hidden)) {
            r.out.copy_from_slice(o);
        }
    }
}

/// out[t, n] = Σ_k acts[t, k] · W[n, k] in f64 for every row n of `matrix`. Returns
/// `[n_tokens, N]`.
fn gemm(
    weights: &impl WeightSource,
    expert: usize,
    matrix: Matrix,
    acts: &[f64],
    n_tokens: usize,
) -> Vec<f64> {
    let (rows, cols) = weights.dims(matrix);
    let mut out = vec![0f64; n_tokens * rows];
    let mut strip = vec![0f32; WEIGHT_BLOCK * cols];
    for first_row in (0..rows).step_by(WEIGHT_BLOCK) {
        weights.fill_rows(expert, matrix, first_row, &mut strip);
        plain_strip(&strip, acts, cols, first_row, &mut out);
    }
    out
}
