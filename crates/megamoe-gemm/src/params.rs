//! The kernel's single parameter struct and the params of its pieces, laid out exactly as their
//! device counterparts: `MainloopParams` (device/megamoe_gemm/mma/mainloop_params.cuh),
//! `SchedulerParams` (scheduler/tile_scheduler.cuh), `EpilogueParams` (epilogue/store.cuh) and
//! their composition `GroupedGemmParams` (impls/grouped_gemm_params.cuh), which assert the same
//! sizes and alignments.

use megamoe_cuda::{Pod, TensorMap};

/// What the TMA producer loads and the wgmma consumer multiplies (see the device header for
/// each field's meaning).
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
pub struct MainloopParams {
    pub tma_a: TensorMap,
    pub tma_b: TensorMap,
    pub tma_sa: TensorMap,
    pub scale_b: u64,
    pub error: u64,
    pub timeout_ns: u64,
    pub k: u32,
    pub n: u32,
}

/// The tile scheduler's walk over the experts.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SchedulerParams {
    pub expert_rows: u64,
    pub num_experts: u32,
    pub n: u32,
    pub max_m: u32,
    pub group_m: u32,
}

/// The output of the GEMM's own epilogues (TMA stores or row stores).
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
pub struct EpilogueParams {
    pub tma_d: TensorMap,
    pub out: u64,
    pub n: u32,
}

/// Parameters of one grouped GEMM launch.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
pub struct GroupedGemmParams {
    pub mainloop: MainloopParams,
    pub scheduler: SchedulerParams,
    pub epilogue: EpilogueParams,
}

const _: () = assert!(std::mem::size_of::<MainloopParams>() == 448);
const _: () = assert!(std::mem::align_of::<MainloopParams>() == 64);
const _: () = assert!(std::mem::offset_of!(MainloopParams, scale_b) == 384);
const _: () = assert!(std::mem::offset_of!(MainloopParams, k) == 408);
const _: () = assert!(std::mem::offset_of!(MainloopParams, n) == 412);
const _: () = assert!(std::mem::size_of::<SchedulerParams>() == 24);
const _: () = assert!(std::mem::align_of::<SchedulerParams>() == 8);
const _: () = assert!(std::mem::offset_of!(SchedulerParams, num_experts) == 8);
const _: () = assert!(std::mem::offset_of!(SchedulerParams, group_m) == 20);
const _: () = assert!(std::mem::size_of::<EpilogueParams>() == 192);
const _: () = assert!(std::mem::align_of::<EpilogueParams>() == 64);
const _: () = assert!(std::mem::offset_of!(EpilogueParams, out) == 128);
const _: () = assert!(std::mem::offset_of!(EpilogueParams, n) == 136);
const _: () = assert!(std::mem::size_of::<GroupedGemmParams>() == 704);
const _: () = assert!(std::mem::align_of::<GroupedGemmParams>() == 64);
const _: () = assert!(std::mem::offset_of!(GroupedGemmParams, scheduler) == 448);
const _: () = assert!(std::mem::offset_of!(GroupedGemmParams, epilogue) == 512);
// SAFETY: plain data (tensor maps, integers), no padding the device reads, sizes asserted above.
unsafe impl Pod for GroupedGemmParams {}
