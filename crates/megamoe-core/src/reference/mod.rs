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

use std::sync::atomic::{AtomicUsize, Ordering};

use half::bf16;
use rayon::prelude::*;

use crate::batch::WorldInputs;
use crate::error::{Error, Result};
use crate::preset::Shape;
use crate::quant::default_group;
use crate::weights::WeightSource;

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
    Ok(combine(
        world,
        slots,
        0f32,
        |acc, o: bf16| acc + o.to_f32(),
        bf16::from_f32,
    ))
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
    Ok(combine(
        world,
        slots,
        0f64,
        |acc, o: f64| acc + o,
        |acc| acc,
    ))
}

/// One valid (token, slot) routed to an expert, and where its `[H]` output goes.
pub(crate) struct Routed<'a, T> {
    pub rank: usize,
    pub token: usize,
    pub slot: usize,
    pub out: &'a mut [T],
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
    by_expert.retain(|routed| !routed.is_empty());
    let total = by_expert.len();
    let done = AtomicUsize::new(0);
    by_expert.par_iter_mut().for_each(|routed| {
        let expert = world.ranks[routed[0].rank].topk_idx[routed[0].token * topk + routed[0].slot];
        compute(expert as usize, routed);
        progress(done.fetch_add(1, Ordering::Relaxed) + 1, total);
    });
    outputs
}

/// y_t = finish(Σ over valid slots in ascending k of o_k), the sum starting from `zero`.
fn combine<T: Copy, A: Copy, Y>(
    world: &WorldInputs,
    slots: Vec<Vec<T>>,
    zero: A,
    add: impl Fn(A, T) -> A,
    finish: impl Fn(A) -> Y,
) -> Vec<Vec<Y>> {
    let Shape { hidden, topk, .. } = world.shape;
    world
        .ranks
        .iter()
        .zip(slots)
        .map(|(inputs, slots)| {
            let mut y = Vec::with_capacity(inputs.tokens * hidden);
            let mut acc = vec![zero; hidden];
            for (idx, token_slots) in inputs
                .topk_idx
                .chunks_exact(topk)
                .zip(slots.chunks_exact(topk * hidden))
            {
                acc.fill(zero);
                for (_, o) in idx
                    .iter()
                    .zip(token_slots.chunks_exact(hidden))
                    .filter(|(&e, _)| e >= 0)
                {
                    for (a, &o) in acc.iter_mut().zip(o) {
                        *a = add(*a, o);
                    }
                }
                y.extend(acc.iter().map(|&a| finish(a)));
            }
            y
        })
        .collect()
}

/// Rejects inputs the layer cannot compute, naming the argument.
fn check(world: &WorldInputs, weights: &impl WeightSource, options: &LayerOptions) -> Result<()> {
    let shape = world.shape;
    shape.validate(world.num_ranks())?;
    if weights.shape() != shape {
        return Err(Error::Value {
            arg: "weights",
            value: format!("{:?}", weights.shape()),
            reason: format!("generator shape differs from the inputs' {shape:?}"),
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
    let Shape {
        hidden,
        topk,
        experts,
        ..
    } = shape;
    for inputs in &world.ranks {
        let t = inputs.tokens;
        for (arg, got, expected) in [
            ("x", inputs.x.len(), t * hidden),
            ("topk_idx", inputs.topk_idx.len(), t * topk),
            ("topk_weights", inputs.topk_weights.len(), t * topk),
        ] {
            if got != expected {
                return Err(Error::Length { arg, got, expected });
            }
        }
        for (row, idx) in inputs.topk_idx.chunks_exact(topk).enumerate() {
            for (slot, &e) in idx.iter().enumerate() {
                if e < -1 || e >= experts as i32 {
                    return Err(Error::ExpertOutOfRange {
                        arg: "topk_idx",
                        row,
                        slot,
                        value: e.into(),
                        experts,
                    });
                }
                if let Some(first) = idx[..slot].iter().position(|&f| f == e && e >= 0) {
                    return Err(Error::DuplicateExpert {
                        arg: "topk_idx",
                        row,
                        expert: e as usize,
                        first,
                        second: slot,
                    });
                }
            }
        }
    }
    Ok(())
}
