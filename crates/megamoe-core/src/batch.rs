//! The per-rank inputs of one call (SPEC §2), shared by the generators, the references and the
//! GPU paths.

use half::bf16;

use crate::preset::Shape;

/// One rank's inputs for one call.
#[derive(Clone, Debug, PartialEq)]
pub struct RankInputs {
    /// Tokens on this rank for this call, T.
    pub tokens: usize,
    /// Global index of this rank's first token: every generated input is a pure function of
    /// (seed, global token index), so one global batch split over any R is the same data.
    pub first_global_token: usize,
    /// Activations, bf16 `[T, H]`, row-major.
    pub x: Vec<bf16>,
    /// Expert of each slot, `[T, K]`, in `[0, E)` or −1 for a masked slot.
    pub topk_idx: Vec<i32>,
    /// Router weight of each slot, f32 `[T, K]` (any sign; never read for masked slots).
    pub topk_weights: Vec<f32>,
}

/// The inputs of every rank of an expert-parallel world for one call.
#[derive(Clone, Debug, PartialEq)]
pub struct WorldInputs {
    pub shape: Shape,
    /// One entry per rank, rank 0 first; rank r owns experts r·E_l … (r+1)·E_l − 1.
    pub ranks: Vec<RankInputs>,
}

impl WorldInputs {
    pub fn num_ranks(&self) -> usize {
        self.ranks.len()
    }

    /// Tokens over all ranks.
    pub fn global_tokens(&self) -> usize {
        self.ranks.iter().map(|r| r.tokens).sum()
    }

    /// Valid (token, slot) pairs over all ranks: the work the layer does.
    pub fn valid_slots(&self) -> usize {
        self.ranks
            .iter()
            .map(|r| r.topk_idx.iter().filter(|&&e| e >= 0).count())
            .sum()
    }
}
