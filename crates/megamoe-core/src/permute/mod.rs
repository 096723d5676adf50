//! Dispatch / combine with fused permute (SPEC §5): the permute plan every implementation
//! shares, the row types it moves, and the CPU reference of the forward and backward passes.
//!
//! Layout on receiving rank d (owning global experts d·E_l … (d+1)·E_l − 1): local experts in
//! ascending order, each a segment of rows; inside a segment one row per (token, expert) in
//! ascending (source rank, token index) order, then zero rows (prob 0, FP8 scales 0) up to a
//! multiple of `pad_multiple`. [`PermutePlan`] spells out every row.

mod plan;
mod reference;
mod rows;

pub use plan::{
    dispatch_rows_per_rank, plan_permute, PermuteHandle, PermutePlan, RowDestination, RowSource,
    SyncMode,
};
pub use reference::{
    combine_backward, combine_with_unpermute, combine_with_unpermute_in, dispatch_backward,
    dispatch_backward_in, dispatch_rows, dispatch_with_permute, CombineOrder, DispatchGrads,
    Dispatched,
};
pub use rows::{Bf16Rows, Fp8Rows, PermuteRows, SCALE_BLOCK};
