//! The kernels' parameter structs, field for field as in kernels/params.cuh.

use crate::layout::MAX_RANKS;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Layout {
    pub peer_base: [u64; MAX_RANKS],
    pub handle: u64,
    pub deadline_ns: u64,
    pub off_epochs: u64,
    pub off_signals: u64,
    pub off_status: u64,
    pub off_counts: u64,
    pub off_meta: u64,
    pub off_in_rows: u64,
    pub off_in_scales: u64,
    pub off_out_rows: u64,
    pub off_out_scales: u64,
    pub off_out_probs: u64,
    pub off_comb_rows: u64,
    pub off_comb_prob_grads: u64,
    pub off_error: u64,
    pub h_recv_slot: u64,
    pub h_send_row: u64,
    pub h_idx: u64,
    pub h_padded: u64,
    pub h_counts: u64,
    pub h_seg_base: u64,
    pub h_src_tokens: u64,
    pub h_total_rows: u64,
    pub rank: i32,
    pub ranks: i32,
    pub experts: i32,
    pub topk: i32,
    pub hidden: i32,
    pub max_tokens: i32,
    pub max_rows: i32,
    pub _pad0: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DispatchParams {
    pub l: Layout,
    pub topk_idx: u64,
    pub probs: u64,
    pub tokens: i32,
    pub pad_multiple: i32,
    pub row_bytes: i32,
    pub scales_per_row: i32,
    pub row_bound: i32,
    pub mode: i32,
    pub _pad0: i32,
    pub _pad1: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CombineParams {
    pub l: Layout,
    pub y: u64,
    pub grad_probs: u64,
    pub with_prob_grads: i32,
    pub _pad0: i32,
    pub _pad1: i32,
    pub _pad2: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GatherParams {
    pub src: u64,
    pub dst: u64,
    pub index: u64,
    pub rows: i32,
    pub row_bytes: i32,
}

/// What a failed call leaves in its rank's buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ErrorRecord {
    pub code: u32,
    pub rank: u32,
    pub what: u32,
    pub peer: u32,
    pub seen: u64,
    pub expected: u64,
}

/// DispatchParams::mode (kernels/impls/dispatch.cuh).
pub const DISPATCH_FULL: i32 = 0;
pub const DISPATCH_CACHED: i32 = 1;
pub const DISPATCH_UNPERMUTED: i32 = 2;

pub const ERR_OK: u32 = 0;
pub const ERR_TIMEOUT: u32 = 1;
pub const ERR_BAD_TOPK: u32 = 2;
pub const ERR_OVERFLOW: u32 = 3;

// Sizes as the device code computes them (asserted in kernels/params.cuh too).
const _: () = assert!(std::mem::size_of::<Layout>() == 8 * 8 + 23 * 8 + 8 * 4);
const _: () =
    assert!(std::mem::size_of::<DispatchParams>() == std::mem::size_of::<Layout>() + 16 + 32);
const _: () =
    assert!(std::mem::size_of::<CombineParams>() == std::mem::size_of::<Layout>() + 16 + 16);
const _: () = assert!(std::mem::size_of::<ErrorRecord>() == 32);
const _: () = assert!(std::mem::size_of::<GatherParams>() == 32);
const _: () = assert!(std::mem::align_of::<DispatchParams>() == 8);
