//! The CPU reference of dispatch / combine with fused permute and of their backward passes
//! (SPEC §5). Pure data movement plus one f32 sum: the GPU results must match bit for bit.

use half::bf16;
use rayon::prelude::*;

use super::plan::{plan_permute, PermuteHandle, SyncMode};
use super::rows::{Bf16Rows, PermuteRows};
use crate::error::{Error, Result};
use crate::preset::Shape;
use crate::routing::{check_len, check_slot_weights, on_rank};

/// One receiving rank's dispatch output.
#[derive(Clone, Debug, PartialEq)]
pub struct Dispatched<M> {
    /// `[output_rows, H]` in the plan's layout; padding rows are zero.
    pub rows: M,
    /// `[output_rows]`: the source slot's prob, 0 for padding.
    pub probs: Vec<f32>,
    /// Padded rows of each local expert, `[E_l]`.
    pub tokens_per_expert: Vec<usize>,
}

/// Gradients of dispatch's inputs.
#[derive(Clone, Debug, PartialEq)]
pub struct DispatchGrads {
    /// Gradient of x per source rank, `[T_r, H]` (a combine of the row gradients).
    pub x: Vec<Bf16Rows>,
    /// Gradient of probs per source rank, `[T_r, K]`; 0 on masked slots.
    pub probs: Vec<Vec<f32>>,
}

/// Dispatches every rank's rows `x[r]` (`[T_r, H]`, bf16 or FP8 with scales) with routing
/// `topk_idx[r]` (`[T_r, K]`) and `probs[r]` (f32 `[T_r, K]`, finite on valid slots) to the
/// ranks owning the experts, in the layout of [`super::PermutePlan`]. Returns one output per
/// rank and the handle combine and the backward passes reuse.
pub fn dispatch_with_permute<M, I, P>(
    shape: Shape,
    x: &[M],
    topk_idx: &[I],
    probs: &[P],
    pad_multiple: usize,
    mode: SyncMode,
) -> Result<(Vec<Dispatched<M>>, PermuteHandle)>
where
    M: PermuteRows,
    I: AsRef<[i32]>,
    P: AsRef<[f32]>,
{
    let ranks = x.len();
    check_len("topk_idx", topk_idx.len(), ranks)?;
    check_len("probs", probs.len(), ranks)?;
    for (rank, ((x, idx), probs)) in x.iter().zip(topk_idx).zip(probs).enumerate() {
        check_rows("x", x, shape.hidden)
            .and_then(|_| check_len("topk_idx", idx.as_ref().len(), x.rows() * shape.topk))
            .and_then(|_| check_len("probs", probs.as_ref().len(), x.rows() * shape.topk))
            .map_err(|e| on_rank(rank, e))?;
    }
    let handle = plan_permute(shape, topk_idx, pad_multiple, mode)?;
    for (rank, (idx, probs)) in topk_idx.iter().zip(probs).enumerate() {
        check_slot_weights("probs", shape.topk, idx.as_ref(), probs.as_ref())
            .map_err(|e| on_rank(rank, e))?;
    }

    let rows = gather_tokens(x, &handle, shape.hidden);
    let outputs = rows
        .into_iter()
        .zip(&handle.plans)
        .map(|(rows, plan)| Dispatched {
            rows,
            probs: plan
                .sources
                .iter()
                .map(|s| {
                    s.map_or(0.0, |s| {
                        probs[s.rank].as_ref()[s.token * shape.topk + s.slot]
                    })
                })
                .collect(),
            tokens_per_expert: plan.tokens_per_expert.clone(),
        })
        .collect();
    Ok((outputs, handle))
}

/// Dispatches rows with the layout of an earlier dispatch (no probs): `x[r]` is `[T_r, H]`.
pub fn dispatch_rows<M: PermuteRows>(x: &[M], handle: &PermuteHandle) -> Result<Vec<M>> {
    dispatch_rows_named("x", x, handle)
}

/// How combine sums a token's copies (SPEC §5, "combine orders"). Both sum in f32 from +0.0, so a
/// token without a valid slot gives +0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CombineOrder {
    /// y_t = bf16(Σ f32 of every copy, in ascending global expert id), one rounding: every copy
    /// crosses to the token's rank; the bits do not depend on R.
    Exact,
    /// HybridEP's traffic: each expert rank sums its copies of t in ascending local expert id in
    /// f32 and sends one bf16 row; the token's rank sums those rows in ascending rank order in
    /// f32 and rounds once more. Deterministic for a given R (the bits may differ between R).
    PerRank,
}

/// Combine in the `exact` order (see [`CombineOrder::Exact`]), unweighted. `rows[r]` is rank r's
/// dispatch-layout `[output_rows, H]` (padding rows are not read). Returns y per source rank,
/// `[T_r, H]`.
pub fn combine_with_unpermute(rows: &[Bf16Rows], handle: &PermuteHandle) -> Result<Vec<Bf16Rows>> {
    combine_named("rows", rows, handle, CombineOrder::Exact)
}

/// [`combine_with_unpermute`] in `order`.
pub fn combine_with_unpermute_in(
    rows: &[Bf16Rows],
    handle: &PermuteHandle,
    order: CombineOrder,
) -> Result<Vec<Bf16Rows>> {
    combine_named("rows", rows, handle, order)
}

/// Dispatch's backward: x's gradient is the combine of the row gradients `row_grads[r]`
/// (`[output_rows, H]`), probs' gradient scatters `prob_grads[r]` (`[output_rows]`) back to
/// `[T, K]` (masked slots 0; padding rows are not read).
pub fn dispatch_backward<P: AsRef<[f32]>>(
    row_grads: &[Bf16Rows],
    prob_grads: &[P],
    handle: &PermuteHandle,
) -> Result<DispatchGrads> {
    dispatch_backward_in(row_grads, prob_grads, handle, CombineOrder::Exact)
}

/// [`dispatch_backward`] with the row gradients combined in `order`.
pub fn dispatch_backward_in<P: AsRef<[f32]>>(
    row_grads: &[Bf16Rows],
    prob_grads: &[P],
    handle: &PermuteHandle,
    order: CombineOrder,
) -> Result<DispatchGrads> {
    check_len("prob_grads", prob_grads.len(), handle.num_ranks())?;
    for (rank, (grads, plan)) in prob_grads.iter().zip(&handle.plans).enumerate() {
        check_len("prob_grads", grads.as_ref().len(), plan.output_rows())
            .map_err(|e| on_rank(rank, e))?;
    }
    let x = combine_named("row_grads", row_grads, handle, order)?;
    let probs = handle
        .destinations
        .iter()
        .map(|slots| {
            slots
                .iter()
                .map(|d| d.map_or(0.0, |d| prob_grads[d.rank].as_ref()[d.row]))
                .collect()
        })
        .collect();
    Ok(DispatchGrads { x, probs })
}

/// Combine's backward: the dispatch of the output gradient `y_grad[r]` (`[T_r, H]`) into the
/// forward dispatch layout.
pub fn combine_backward(y_grad: &[Bf16Rows], handle: &PermuteHandle) -> Result<Vec<Bf16Rows>> {
    dispatch_rows_named("y_grad", y_grad, handle)
}

fn check_rows<M: PermuteRows>(arg: &'static str, rows: &M, hidden: usize) -> Result<()> {
    if rows.hidden() != hidden {
        return Err(Error::Shape {
            arg,
            reason: format!("rows of width {} where H = {hidden}", rows.hidden()),
        });
    }
    rows.check(arg)
}

/// Checks `inputs` has one matrix per rank, each of `rows_of(rank)` rows and one width;
/// returns the width.
fn check_world_rows<M: PermuteRows>(
    arg: &'static str,
    inputs: &[M],
    handle: &PermuteHandle,
    rows_of: impl Fn(usize) -> usize,
) -> Result<usize> {
    check_len(arg, inputs.len(), handle.num_ranks())?;
    let hidden = inputs[0].hidden();
    for (rank, rows) in inputs.iter().enumerate() {
        check_rows(arg, rows, hidden)
            .and_then(|_| check_len(arg, rows.rows(), rows_of(rank)))
            .map_err(|e| on_rank(rank, e))?;
    }
    Ok(hidden)
}

fn dispatch_rows_named<M: PermuteRows>(
    arg: &'static str,
    x: &[M],
    handle: &PermuteHandle,
) -> Result<Vec<M>> {
    let hidden = check_world_rows(arg, x, handle, |rank| handle.tokens[rank])?;
    Ok(gather_tokens(x, handle, hidden))
}

fn gather_tokens<M: PermuteRows>(x: &[M], handle: &PermuteHandle, hidden: usize) -> Vec<M> {
    handle
        .plans
        .iter()
        .map(|plan| {
            let sources: Vec<_> = plan
                .sources
                .iter()
                .map(|s| s.map(|s| (s.rank, s.token)))
                .collect();
            M::gather(x, hidden, &sources)
        })
        .collect()
}

fn combine_named(
    arg: &'static str,
    rows: &[Bf16Rows],
    handle: &PermuteHandle,
    order: CombineOrder,
) -> Result<Vec<Bf16Rows>> {
    let hidden = check_world_rows(arg, rows, handle, |rank| handle.plans[rank].output_rows())?;
    let topk = handle.topk;
    Ok(handle
        .destinations
        .iter()
        .zip(&handle.tokens)
        .map(|(slots, &tokens)| {
            let mut y = Bf16Rows::zeros(tokens, hidden);
            if hidden == 0 {
                return y;
            }
            y.values
                .par_chunks_mut(hidden)
                .zip(slots.par_chunks(topk))
                .for_each_init(
                    || (vec![0f32; hidden], vec![0f32; hidden]),
                    |(sum, part), (y_row, token_slots)| {
                        // Ascending expert id is ascending rank, then ascending local id.
                        let mut copies: Vec<_> = token_slots.iter().flatten().collect();
                        copies.sort_by_key(|d| d.expert);
                        sum.fill(0.0);
                        match order {
                            CombineOrder::Exact => {
                                for d in copies {
                                    add_row(sum, rows[d.rank].row(d.row));
                                }
                            }
                            CombineOrder::PerRank => {
                                for run in copies.chunk_by(|a, b| a.rank == b.rank) {
                                    part.fill(0.0);
                                    for d in run {
                                        add_row(part, rows[d.rank].row(d.row));
                                    }
                                    // The expert rank's bf16 row, as it crosses to the token's rank.
                                    for (acc, p) in sum.iter_mut().zip(part.iter()) {
                                        *acc += bf16::from_f32(*p).to_f32();
                                    }
                                }
                            }
                        }
                        for (out, acc) in y_row.iter_mut().zip(sum.iter()) {
                            *out = bf16::from_f32(*acc);
                        }
                    },
                );
            y
        })
        .collect())
}

fn add_row(acc: &mut [f32], row: &[bf16]) {
    for (a, v) in acc.iter_mut().zip(row) {
        *a += v.to_f32();
    }
}
