//! The permute plan: where every (token, expert) row of an EP world lands. Pure integer math
//! on the routing of all ranks; the GPU dispatch computes the same plan and must match it.

use crate::error::{Error, Result};
use crate::preset::Shape;
use crate::routing::{check_topk_idx, on_rank};

/// How the output of dispatch is sized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncMode {
    /// Every rank's output has exactly the rows the plan needs (a host sync learns the sizes).
    Blocking,
    /// Every rank's output has `max_rows` rows (CUDA-graph friendly, no host sync); rows past
    /// the plan are zero. A rank that needs more is an [`Error::Overflow`] naming it.
    NonBlocking { max_rows: usize },
}

/// Where an output row of dispatch comes from: slot `slot` of token `token` of rank `rank`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowSource {
    pub rank: usize,
    pub token: usize,
    pub slot: usize,
}

/// Where a valid slot's row went: row `row` of rank `rank`'s dispatch output, for global
/// expert `expert` (owned by `rank`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowDestination {
    pub expert: usize,
    pub rank: usize,
    pub row: usize,
}

/// One receiving rank's layout.
///
/// Local expert j (global expert `first_expert + j`) owns output rows
/// `expert_offsets[j] .. expert_offsets[j] + tokens_per_expert[j]`; its first
/// `rows_per_expert[j]` rows are its (token, expert) pairs in ascending (source rank, token
/// index) order, the rest are zero padding up to a multiple of `pad_multiple` (an expert with
/// no token has no rows). Equivalently, the pair (rank r, token t) routed to global expert e
/// lands at row `expert_offsets[j] + #{(r', t') < (r, t) : (r', t') routed to e}`.
/// Rows from `expert_offsets[E_l]` on (non-blocking mode only) are unused and zero.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PermutePlan {
    pub rank: usize,
    pub first_expert: usize,
    /// Valid rows of each local expert, `[E_l]`.
    pub rows_per_expert: Vec<usize>,
    /// Rows of each local expert after padding, `[E_l]` (what dispatch returns to the user).
    pub tokens_per_expert: Vec<usize>,
    /// Exclusive prefix sum of `tokens_per_expert`, `[E_l + 1]`.
    pub expert_offsets: Vec<usize>,
    /// Source of every output row (`None` = padding or unused), length = output rows.
    pub sources: Vec<Option<RowSource>>,
}

impl PermutePlan {
    /// Rows of this rank's dispatch output (exact in blocking mode, the bound otherwise).
    pub fn output_rows(&self) -> usize {
        self.sources.len()
    }

    /// Rows holding expert segments, padding included: the exact size of blocking mode.
    pub fn used_rows(&self) -> usize {
        *self
            .expert_offsets
            .last()
            .expect("offsets have E_l + 1 entries")
    }
}

/// The routing map of one dispatch, reused by combine and both backward passes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PermuteHandle {
    pub experts: usize,
    pub topk: usize,
    pub pad_multiple: usize,
    /// Tokens of each source rank, T_r.
    pub tokens: Vec<usize>,
    /// One plan per receiving rank, rank 0 first.
    pub plans: Vec<PermutePlan>,
    /// Per source rank, `[T_r, K]` in slot order: where each valid slot's row went
    /// (`None` for masked slots).
    pub destinations: Vec<Vec<Option<RowDestination>>>,
}

impl PermuteHandle {
    pub fn num_ranks(&self) -> usize {
        self.plans.len()
    }
}

/// Plans the dispatch of an EP world of `topk_idx.len()` ranks. `topk_idx[r]` is rank r's
/// `[T_r, K]` routing; T_r is its length over K. Validates the shape against the number of
/// ranks, `pad_multiple` ≥ 1, every index and the non-blocking bound.
pub fn plan_permute<I: AsRef<[i32]>>(
    shape: Shape,
    topk_idx: &[I],
    pad_multiple: usize,
    mode: SyncMode,
) -> Result<PermuteHandle> {
    let ranks = topk_idx.len();
    shape.validate(ranks)?;
    if pad_multiple == 0 {
        return Err(Error::Value {
            arg: "pad_multiple",
            value: "0".into(),
            reason: "must be at least 1".into(),
        });
    }
    let topk = shape.topk;
    let local_experts = shape.local_experts(ranks);
    let mut rows_per_global_expert = vec![0usize; shape.experts];
    for (rank, idx) in topk_idx.iter().enumerate() {
        let idx = idx.as_ref();
        if idx.len() % topk != 0 {
            return Err(on_rank(
                rank,
                Error::Shape {
                    arg: "topk_idx",
                    reason: format!("{} entries are not a multiple of K = {topk}", idx.len()),
                },
            ));
        }
        check_topk_idx("topk_idx", shape, idx).map_err(|e| on_rank(rank, e))?;
        for &e in idx.iter().filter(|&&e| e >= 0) {
            rows_per_global_expert[e as usize] += 1;
        }
    }

    let mut plans: Vec<PermutePlan> = rows_per_global_expert
        .chunks(local_experts)
        .enumerate()
        .map(|(rank, rows)| {
            let padded: Vec<usize> = rows
                .iter()
                .map(|n| n.div_ceil(pad_multiple) * pad_multiple)
                .collect();
            let mut offsets = vec![0];
            for n in &padded {
                offsets.push(offsets.last().unwrap() + n);
            }
            PermutePlan {
                rank,
                first_expert: rank * local_experts,
                rows_per_expert: rows.to_vec(),
                tokens_per_expert: padded,
                sources: vec![None; *offsets.last().unwrap()],
                expert_offsets: offsets,
            }
        })
        .collect();
    if let SyncMode::NonBlocking { max_rows } = mode {
        for plan in &mut plans {
            if plan.used_rows() > max_rows {
                return Err(Error::Overflow {
                    arg: "max_rows",
                    rank: plan.rank,
                    needed: plan.used_rows(),
                    bound: max_rows,
                });
            }
            plan.sources.resize(max_rows, None);
        }
    }

    // Visiting (rank, token) in ascending order fills every expert segment in that order.
    let mut next_row: Vec<usize> = plans
        .iter()
        .flat_map(|p| p.expert_offsets[..local_experts].iter().copied())
        .collect();
    let mut destinations = Vec::with_capacity(ranks);
    for (rank, idx) in topk_idx.iter().enumerate() {
        let idx = idx.as_ref();
        let mut rank_destinations = vec![None; idx.len()];
        for (i, &e) in idx.iter().enumerate() {
            if e < 0 {
                continue;
            }
            let expert = e as usize;
            let dest_rank = expert / local_experts;
            let row = next_row[expert];
            next_row[expert] += 1;
            plans[dest_rank].sources[row] = Some(RowSource {
                rank,
                token: i / topk,
                slot: i % topk,
            });
            rank_destinations[i] = Some(RowDestination {
                expert,
                rank: dest_rank,
                row,
            });
        }
        destinations.push(rank_destinations);
    }

    Ok(PermuteHandle {
        experts: shape.experts,
        topk,
        pad_multiple,
        tokens: topk_idx.iter().map(|i| i.as_ref().len() / topk).collect(),
        plans,
        destinations,
    })
}

/// The size query of blocking mode: the exact dispatch output rows of every rank.
pub fn dispatch_rows_per_rank<I: AsRef<[i32]>>(
    shape: Shape,
    topk_idx: &[I],
    pad_multiple: usize,
) -> Result<Vec<usize>> {
    let handle = plan_permute(shape, topk_idx, pad_multiple, SyncMode::Blocking)?;
    Ok(handle.plans.iter().map(PermutePlan::used_rows).collect())
}
