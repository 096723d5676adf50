//! The CPU reference of the fused MoE layer (SPEC §3) and the same layer unquantized in f64.
//!
//! Both are organised expert-major: for each global expert that any slot names, generate its
//! weights (in 128-row strips, never the whole expert set), compute every (token, slot) routed
//! to it and drop the weights. Experts run in parallel; every slot's output is a pure function
//! of the token's row, the slot's expert and weight, so the output bits do not depend on the
//! thread count, on the expert order or on the number of ranks R.

mod exact;
mod fused;
mod rows;

pub use fused::swiglu;

use std::sync::atomic::{AtomicUsize, Ordering};

use half::bf16;
use rayon::prelude::*;

use crate::batch::WorldInputs;
use crate::error::{Error, Result};
use crate::preset::Shape;
use crate::quant::{default_group, WEIGHT_BLOCK};
use crate::routing::validate_world;
use crate::weights::{Matrix, WeightSource};

/// One output per rank, rank 0 first.
pub type PerRank<T> = Vec<Vec<T>>;

/// The per-call options of the layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerOptions {
    /// Columns per scale of the re-quantized intermediate, G ∈ {64, 128}.
    pub group: usize,
    /// Optional SwiGLU clamp c: g = min(g, c), u = clamp(u, −c, c).
    pub clamp: Option<f32>,
}

impl LayerOptions {
    /// The SPEC §3 defaults for `shape`: G by [`default_group`], no clamp.
    pub fn for_shape(shape: &Shape) -> Self {
        LayerOptions {
            group: default_group(shape),
            clamp: None,
        }
    }
}

/// Called with (experts done, experts to do) after each expert, from any thread.
pub type Progress<'a> = &'a (dyn Fn(usize, usize) + Sync);

/// The fused layer as SPEC §3 defines it: one bf16 `[T, H]` output per rank, rank 0 first.
///
/// Non-finite inputs (SPEC §6): a NaN or ±Inf in a token's `x` row changes only that token's
/// output rows, every other token's bits stay the same; a non-finite weight on a masked slot is
/// ignored, on a valid slot it is an error naming `topk_weights`.
pub fn fused_layer(
    world: &WorldInputs,
    weights: &impl WeightSource,
    options: &LayerOptions,
    progress: Progress,
) -> Result<Vec<Vec<bf16>>> {
    check(world, weights, options)?;
    let inputs = fused::quantize_inputs(world);
    let slots = per_slot_outputs(world, progress, |expert, routed| {
        fused::expert(world, &inputs, weights, options, expert, routed)
    });
    Ok(combine(world, &slots, |o: &bf16| *o))
}

/// The same layer without any quantization or rounding: bf16 `x`, the f32 original weights,
/// f64 arithmetic throughout, f64 output. Its distance to [`fused_layer`] is the FP8 cost.
/// `options.group` is not used (nothing is quantized); the clamp is.
pub fn fused_layer_f64(
    world: &WorldInputs,
    weights: &impl WeightSource,
    options: &LayerOptions,
    progress: Progress,
) -> Result<Vec<Vec<f64>>> {
    check(world, weights, options)?;
    let slots = per_slot_outputs(world, progress, |expert, routed| {
        exact::expert(world, weights, options, expert, routed)
    });
    Ok(combine(world, &slots, |o: &f64| *o))
}

/// [`fused_layer`] and [`fused_layer_f64`] in one pass over the experts, with the same bits:
/// each 128-row strip of an expert's weights is generated once and feeds both paths (quantized
/// for the FP8 path, as it is for the f64 path).
pub fn fused_layer_and_f64(
    world: &WorldInputs,
    weights: &impl WeightSource,
    options: &LayerOptions,
    progress: Progress,
) -> Result<(PerRank<bf16>, PerRank<f64>)> {
    check(world, weights, options)?;
    let inputs = fused::quantize_inputs(world);
    let slots = per_slot_outputs(
        world,
        progress,
        |expert, routed: &mut [Routed<(bf16, f64)>]| {
            let x = (
                fused::l1_input(world, &inputs, routed),
                exact::l1_input(world, routed),
            );
            let h = both_gemms(weights, expert, Matrix::W1, (&x.0, &x.1));
            let a = (
                fused::l2_input(world, routed, &h.0, options),
                exact::l2_input(world, routed, &h.1, options),
            );
            let o = both_gemms(weights, expert, Matrix::W2, (&a.0, &a.1));
            write_output(world, routed, &o.0, |dst, v| dst.0 = bf16::from_f32(v));
            write_output(world, routed, &o.1, |dst, v| dst.1 = v);
        },
    );
    Ok((
        combine(world, &slots, |o| o.0),
        combine(world, &slots, |o| o.1),
    ))
}

/// The FP8 and the f64 product of `matrix` of `expert` with their activations, on one
/// generation of the weights: `([n, N] f32, [n, N] f64)`.
fn both_gemms(
    weights: &impl WeightSource,
    expert: usize,
    matrix: Matrix,
    acts: (&fused::Acts, &[f64]),
) -> (Vec<f32>, Vec<f64>) {
    let cols = weights.dims(matrix).1;
    let mut out = (
        fused::output(weights, matrix, acts.0),
        exact::output(weights, matrix, acts.1),
    );
    let mut strip = fused::Strip::default();
    for_each_strip(weights, expert, matrix, |first_row, w| {
        strip.add(w, acts.0, first_row, &mut out.0);
        rows::plain_strip(w, acts.1, cols, first_row, &mut out.1);
    });
    out
}

/// Calls `add(first_row, strip)` for every 128-row strip `[128, K]` of `matrix` of `expert`,
/// each generated once in f32.
fn for_each_strip(
    weights: &impl WeightSource,
    expert: usize,
    matrix: Matrix,
    mut add: impl FnMut(usize, &[f32]),
) {
    let (rows, cols) = weights.dims(matrix);
    let mut strip = vec![0f32; WEIGHT_BLOCK * cols];
    for first_row in (0..rows).step_by(WEIGHT_BLOCK) {
        weights.fill_rows(expert, matrix, first_row, &mut strip);
        add(first_row, &strip);
    }
}

/// One valid (token, slot) routed to an expert, and where its `[H]` output goes.
pub(crate) struct Routed<'a, T> {
    pub rank: usize,
    pub token: usize,
    pub slot: usize,
    pub out: &'a mut [T],
}

/// `swiglu(gate, up, topk weight)` of every routed slot: `h` is `[n, 2I]` (gate columns, then
/// up), the result `[n, I]`.
fn weighted_swiglu<T: Copy + Default, O>(
    world: &WorldInputs,
    routed: &[Routed<O>],
    h: &[T],
    swiglu: impl Fn(T, T, f32) -> T,
) -> Vec<T> {
    let Shape { inter, topk, .. } = world.shape;
    let mut a = vec![T::default(); routed.len() * inter];
    for ((a, h), r) in a
        .chunks_exact_mut(inter)
        .zip(h.chunks_exact(2 * inter))
        .zip(routed)
    {
        let weight = world.ranks[r.rank].topk_weights[r.token * topk + r.slot];
        let (gate, up) = h.split_at(inter);
        for ((a, &g), &u) in a.iter_mut().zip(gate).zip(up) {
            *a = swiglu(g, u, weight);
        }
    }
    a
}

/// Hands each slot's L2 output row of `o` (`[n, H]`) to `write`.
fn write_output<T: Copy, O>(
    world: &WorldInputs,
    routed: &mut [Routed<O>],
    o: &[T],
    write: impl Fn(&mut O, T),
) {
    for (r, o) in routed.iter_mut().zip(o.chunks_exact(world.shape.hidden)) {
        for (dst, &v) in r.out.iter_mut().zip(o) {
            write(dst, v);
        }
    }
}

/// Runs `compute(expert, routed)` for every expert that some slot names, in parallel, and
/// returns every rank's per-slot outputs `[T, K, H]` (masked slots left at the default).
fn per_slot_outputs<T, F>(world: &WorldInputs, progress: Progress, compute: F) -> Vec<Vec<T>>
where
    T: Copy + Default + Send,
    F: Fn(usize, &mut [Routed<T>]) + Sync,
{
    let Shape {
        hidden,
        topk,
        experts,
        ..
    } = world.shape;
    let mut outputs: Vec<Vec<T>> = world
        .ranks
        .iter()
        .map(|r| vec![T::default(); r.tokens * topk * hidden])
        .collect();
    let mut by_expert: Vec<Vec<Routed<T>>> = (0..experts).map(|_| Vec::new()).collect();
    for (rank, (inputs, out)) in world.ranks.iter().zip(&mut outputs).enumerate() {
        for (i, out) in out.chunks_exact_mut(hidden).enumerate() {
            if let Ok(expert) = usize::try_from(inputs.topk_idx[i]) {
                by_expert[expert].push(Routed {
                    rank,
                    token: i / topk,
                    slot: i % topk,
                    out,
                });
            }
        }
    }
    let mut work: Vec<(usize, Vec<Routed<T>>)> = by_expert
        .into_iter()
        .enumerate()
        .filter(|(_, routed)| !routed.is_empty())
        .collect();
    let total = work.len();
    let done = AtomicUsize::new(0);
    work.par_iter_mut().for_each(|(expert, routed)| {
        compute(*expert, routed);
        progress(done.fetch_add(1, Ordering::Relaxed) + 1, total);
    });
    outputs
}

/// The combine of one output kind: y_t = Σ over valid slots in ascending k of o_k, summed in
/// f32 and rounded once for bf16 slots (SPEC §3), in f64 for f64 slots. `pick` selects the
/// output from a slot's entry.
fn combine<T, O: Combined>(
    world: &WorldInputs,
    slots: &[Vec<T>],
    pick: impl Fn(&T) -> O,
) -> Vec<Vec<O>> {
    let Shape { hidden, topk, .. } = world.shape;
    world
        .ranks
        .iter()
        .zip(slots)
        .map(|(inputs, slots)| {
            let mut y = Vec::with_capacity(inputs.tokens * hidden);
            let mut acc = vec![O::Acc::default(); hidden];
            for (idx, token_slots) in inputs
                .topk_idx
                .chunks_exact(topk)
                .zip(slots.chunks_exact(topk * hidden))
            {
                acc.fill(O::Acc::default());
                for (_, o) in idx
                    .iter()
                    .zip(token_slots.chunks_exact(hidden))
                    .filter(|(&e, _)| e >= 0)
                {
                    for (a, o) in acc.iter_mut().zip(o) {
                        *a = O::add(*a, pick(o));
                    }
                }
                y.extend(acc.iter().map(|&a| O::finish(a)));
            }
            y
        })
        .collect()
}

/// How one output kind is summed over a token's slots.
trait Combined: Copy {
    type Acc: Copy + Default;
    fn add(acc: Self::Acc, o: Self) -> Self::Acc;
    fn finish(acc: Self::Acc) -> Self;
}

impl Combined for bf16 {
    type Acc = f32;
    fn add(acc: f32, o: bf16) -> f32 {
        acc + o.to_f32()
    }
    fn finish(acc: f32) -> bf16 {
        bf16::from_f32(acc)
    }
}

impl Combined for f64 {
    type Acc = f64;
    fn add(acc: f64, o: f64) -> f64 {
        acc + o
    }
    fn finish(acc: f64) -> f64 {
        acc
    }
}

/// Rejects inputs the layer cannot compute, naming the argument: the world's inputs through
/// [`validate_world`], then the weights' shape and the options.
fn check(world: &WorldInputs, weights: &impl WeightSource, options: &LayerOptions) -> Result<()> {
    validate_world(world, None)?;
    if weights.shape() != world.shape {
        return Err(Error::Value {
            arg: "weights",
            value: format!("{:?}", weights.shape()),
            reason: format!("generator shape differs from the inputs' {:?}", world.shape),
        });
    }
    if options.group != 64 && options.group != 128 {
        return Err(Error::Value {
            arg: "group",
            value: options.group.to_string(),
            reason: "must be 64 or 128".into(),
        });
    }
    if let Some(c) = options.clamp {
        if c.is_nan() || c < 0.0 {
            return Err(Error::Value {
                arg: "clamp",
                value: c.to_string(),
                reason: "must be a non-negative number".into(),
            });
        }
    }
    Ok(())
}
