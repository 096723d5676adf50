//! Validation of one call's inputs (SPEC §6): every check runs before anything is written and
//! fails with an error naming the argument (and, through [`Error::OnRank`], the rank).

use crate::batch::{RankInputs, WorldInputs};
use crate::error::{Error, Result};
use crate::preset::Shape;

/// Checks one rank's inputs against `shape` and an optional token capacity T_max.
/// Errors come wrapped in [`Error::OnRank`] with `rank`.
///
/// Order of checks: lengths of `x` (T·H), `topk_idx` (T·K), `topk_weights` (T·K); T against
/// `capacity` (arg `tokens`); then row by row: expert range, duplicate experts, finite weights
/// on valid slots.
pub fn validate_rank(
    shape: Shape,
    rank: usize,
    inputs: &RankInputs,
    capacity: Option<usize>,
) -> Result<()> {
    check_rank(shape, inputs, capacity).map_err(|e| on_rank(rank, e))
}

/// Checks the shape against the number of ranks and every rank's inputs.
pub fn validate_world(world: &WorldInputs, capacity: Option<usize>) -> Result<()> {
    world.shape.validate(world.num_ranks())?;
    for (rank, inputs) in world.ranks.iter().enumerate() {
        validate_rank(world.shape, rank, inputs, capacity)?;
    }
    Ok(())
}

fn check_rank(shape: Shape, inputs: &RankInputs, capacity: Option<usize>) -> Result<()> {
    // Saturated products no slice length equals, so a T too large for memory fails as a
    // length mismatch instead of overflowing.
    let tokens = inputs.tokens;
    check_len("x", inputs.x.len(), tokens.saturating_mul(shape.hidden))?;
    let slots = tokens.saturating_mul(shape.topk);
    check_len("topk_idx", inputs.topk_idx.len(), slots)?;
    check_len("topk_weights", inputs.topk_weights.len(), slots)?;
    if let Some(capacity) = capacity {
        if tokens > capacity {
            return Err(Error::Capacity {
                arg: "tokens",
                got: tokens,
                capacity,
            });
        }
    }
    check_topk_idx("topk_idx", shape, &inputs.topk_idx)?;
    check_slot_weights(
        "topk_weights",
        shape.topk,
        &inputs.topk_idx,
        &inputs.topk_weights,
    )
}

/// Wraps `error` with the rank it happened on.
pub(crate) fn on_rank(rank: usize, error: Error) -> Error {
    Error::OnRank {
        rank,
        source: Box::new(error),
    }
}

pub(crate) fn check_len(arg: &'static str, got: usize, expected: usize) -> Result<()> {
    if got == expected {
        Ok(())
    } else {
        Err(Error::Length { arg, got, expected })
    }
}

/// Every entry in [0, E) or −1, and no expert twice in one row of K slots.
/// `topk_idx.len()` must be a multiple of K (checked by the callers' length checks).
pub fn check_topk_idx(arg: &'static str, shape: Shape, topk_idx: &[i32]) -> Result<()> {
    check_topk(shape.topk)?;
    for (row, slots) in topk_idx.chunks(shape.topk).enumerate() {
        for (slot, &value) in slots.iter().enumerate() {
            if value < -1 || value as i64 >= shape.experts as i64 {
                return Err(Error::ExpertOutOfRange {
                    arg,
                    row,
                    slot,
                    value: value as i64,
                    experts: shape.experts,
                });
            }
            if value < 0 {
                continue;
            }
            if let Some(first) = slots[..slot].iter().position(|&v| v == value) {
                return Err(Error::DuplicateExpert {
                    arg,
                    row,
                    expert: value as usize,
                    first,
                    second: slot,
                });
            }
        }
    }
    Ok(())
}

/// Rows of K = 0 slots cannot be told apart (the row checks take K from the caller).
fn check_topk(topk: usize) -> Result<()> {
    if topk == 0 {
        return Err(Error::Shape {
            arg: "topk",
            reason: "0 slots per token".into(),
        });
    }
    Ok(())
}

/// Weights of valid slots must be finite; masked slots' weights are never read.
pub fn check_slot_weights(
    arg: &'static str,
    topk: usize,
    topk_idx: &[i32],
    weights: &[f32],
) -> Result<()> {
    check_topk(topk)?;
    let bad = topk_idx
        .iter()
        .zip(weights)
        .position(|(&e, w)| e >= 0 && !w.is_finite());
    match bad {
        None => Ok(()),
        Some(i) => Err(Error::Value {
            arg,
            value: weights[i].to_string(),
            reason: format!(
                "row {} slot {} is a valid slot and its weight is not finite",
                i / topk,
                i % topk
            ),
        }),
    }
}
