//! The unquantized path: bf16 x, the f32 original weights, f64 arithmetic, no rounding.

use super::rows::plain_strip;
use super::{for_each_strip, weighted_swiglu, write_output, LayerOptions, Routed};
use crate::batch::WorldInputs;
use crate::weights::{Matrix, WeightSource};

/// Computes the f64 output of every slot routed to `expert`.
pub(super) fn expert(
    world: &WorldInputs,
    weights: &impl WeightSource,
    options: &LayerOptions,
    expert: usize,
    routed: &mut [Routed<f64>],
) {
    let x = l1_input(world, routed);
    let h = gemm(weights, expert, Matrix::W1, &x);
    let a = l2_input(world, routed, &h, options);
    let o = gemm(weights, expert, Matrix::W2, &a);
    write_output(world, routed, &o, |dst, v| *dst = v);
}

/// The input rows of the slots routed to the expert, in f64.
pub(super) fn l1_input<O>(world: &WorldInputs, routed: &[Routed<O>]) -> Vec<f64> {
    let hidden = world.shape.hidden;
    let mut x = Vec::with_capacity(routed.len() * hidden);
    for r in routed {
        let row = &world.ranks[r.rank].x[r.token * hidden..][..hidden];
        x.extend(row.iter().map(|v| f64::from(v.to_f32())));
    }
    x
}

/// The L1 output `h` through the weighted SwiGLU (and the clamp), in f64.
pub(super) fn l2_input<O>(
    world: &WorldInputs,
    routed: &[Routed<O>],
    h: &[f64],
    options: &LayerOptions,
) -> Vec<f64> {
    let clamp = options.clamp.map(f64::from);
    weighted_swiglu(world, routed, h, |g, u, weight| {
        let (g, u) = match clamp {
            Some(c) => (g.min(c), u.clamp(-c, c)),
            None => (g, u),
        };
        g / (1.0 + (-g).exp()) * u * f64::from(weight)
    })
}

/// out[t, n] = Σ_k acts[t, k] · W[n, k] in f64 for every row n of `matrix`. Returns
/// `[n_tokens, N]`.
fn gemm(weights: &impl WeightSource, expert: usize, matrix: Matrix, acts: &[f64]) -> Vec<f64> {
    let mut out = output(weights, matrix, acts);
    let cols = weights.dims(matrix).1;
    for_each_strip(weights, expert, matrix, |first_row, w| {
        plain_strip(w, acts, cols, first_row, &mut out)
    });
    out
}

/// The zeroed `[n, N]` output of `matrix` against `acts`.
pub(super) fn output(weights: &impl WeightSource, matrix: Matrix, acts: &[f64]) -> Vec<f64> {
    let (rows, cols) = weights.dims(matrix);
    vec![0f64; acts.len() / cols * rows]
}
