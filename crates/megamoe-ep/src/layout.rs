//! Sizes and offsets of the symmetric buffer (the same layout on every rank) and of a handle:
//! megamoe-core's, which the planner reports for the split kernel, and the rows' format.

pub use megamoe_core::plan::buffer::{
    BufferLayout, BufferSpec, HandleLayout, MAX_EXPERTS, MAX_RANKS, MAX_TOPK,
};

/// Row format of dispatched activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowDtype {
    /// bf16 `[T, H]`.
    Bf16,
    /// e4m3 `[T, H]` with f32 scales `[T, H/128]`.
    Fp8,
}

impl RowDtype {
    pub fn row_bytes(self, hidden: usize) -> usize {
        match self {
            RowDtype::Bf16 => hidden * 2,
            RowDtype::Fp8 => hidden,
        }
    }
    pub fn scales_per_row(self, hidden: usize) -> usize {
        match self {
            RowDtype::Bf16 => 0,
            RowDtype::Fp8 => hidden / 128,
        }
    }
}
