//! The kernels' parameter structs, field for field as in device/megamoe_ep/params.cuh, and the
//! kernels' specifications for the runtime's JIT.

use megamoe_core::plan::layout::ERROR_RECORD_BYTES;
use megamoe_cuda::jit::Headers;
use megamoe_cuda::{KernelSpec, Pod};

use crate::layout::MAX_RANKS;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Layout {
    pub peer_base: [u64; MAX_RANKS],
    pub handle: u64,
    pub deadline_ns: u64,
    /// This rank's `megamoe_cuda::WaitRecord`, where a wait past its deadline is recorded.
    pub wait_record: u64,
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
    /// 0: output scales row-major `[rows, S]`; else group-major `[S, scales_stride]`.
    pub scales_stride: i32,
    pub _pad0: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CombineParams {
    pub l: Layout,
    pub y: u64,
    pub grad_probs: u64,
    pub with_prob_grads: i32,
    /// [`CombineOrder`] as its device value.
    pub order: i32,
    pub _pad0: i32,
    pub _pad1: i32,
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

/// What a call rejected on the device (bad routing, overflow) leaves in its rank's buffer.
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

/// DispatchParams::mode (device/megamoe_ep/impls/dispatch.cuh).
pub const DISPATCH_FULL: i32 = 0;
pub const DISPATCH_CACHED: i32 = 1;
pub const DISPATCH_UNPERMUTED: i32 = 2;

/// In which order combine sums a token's copies (f32, one rounding per row produced).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CombineOrder {
    /// Ascending global expert id: SPEC §5 `exact` (the bits do not depend on R).
    ExpertId = 0,
    /// Ascending slot k: SPEC §3 step 5, the MoE layer's combine.
    Slot = 1,
    /// SPEC §5 `per_rank` (HybridEP's traffic): each expert rank sums its copies of a token in
    /// ascending local expert id and rounds to bf16, then the token's rank sums those rows in
    /// ascending rank order and rounds once more. Uses the dispatch output rows as scratch.
    PerRank = 2,
}

impl CombineOrder {
    /// The SPEC §5 orders by their names, `exact` and `per_rank`.
    pub fn by_name(name: &str) -> Option<CombineOrder> {
        match name {
            "exact" => Some(CombineOrder::ExpertId),
            "per_rank" => Some(CombineOrder::PerRank),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            CombineOrder::ExpertId => "exact",
            CombineOrder::Slot => "slot",
            CombineOrder::PerRank => "per_rank",
        }
    }
}

pub const ERR_OK: u32 = 0;
pub const ERR_BAD_TOPK: u32 = 2;
pub const ERR_OVERFLOW: u32 = 3;
/// A published count no routing gives (above its source's T, or a T above the capacity).
pub const ERR_BAD_COUNT: u32 = 6;

/// A fault the probe instantiations of dispatch and combine inject on one rank (device:
/// `FaultSpec`): the fault checks of the selftest. A world built with one
/// ([`crate::EpConfig::fault`]) loads the probe kernels; the default kernels have none of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InjectedFault {
    pub rank: usize,
    pub kind: FaultKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// Dispatch and combine return at entry, as on a rank that never launched them.
    NeverArrives,
    /// Dispatch publishes its counts and routing, raises `dispatch ready`, then stops.
    StopMidDispatch,
    /// Combine raises `combine ready`, then stops.
    StopMidCombine,
    /// Dispatch publishes a count no routing gives (its expert 0: T + 1).
    CorruptCount,
    /// Dispatch sleeps this long before raising `dispatch ready`, then goes on.
    SlowPeer(std::time::Duration),
}

/// [`InjectedFault`] as the device takes it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FaultSpec {
    pub sleep_ns: u64,
    pub rank: u32,
    pub fault: u32,
}

impl From<InjectedFault> for FaultSpec {
    fn from(f: InjectedFault) -> Self {
        let (fault, sleep_ns) = match f.kind {
            FaultKind::NeverArrives => (1, 0),
            FaultKind::StopMidDispatch => (2, 0),
            FaultKind::StopMidCombine => (3, 0),
            FaultKind::CorruptCount => (4, 0),
            FaultKind::SlowPeer(d) => (5, megamoe_cuda::wait::deadline_ns(d)),
        };
        FaultSpec {
            sleep_ns,
            rank: f.rank as u32,
            fault,
        }
    }
}

/// The probe instantiations' parameters (device: `DispatchProbeParams`, `CombineProbeParams`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DispatchProbeParams {
    pub p: DispatchParams,
    pub fault: FaultSpec,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CombineProbeParams {
    pub p: CombineParams,
    pub fault: FaultSpec,
}

// Sizes as the device code computes them (asserted in params.cuh too).
const _: () = assert!(std::mem::size_of::<Layout>() == 8 * 8 + 24 * 8 + 8 * 4);
const _: () =
    assert!(std::mem::size_of::<DispatchParams>() == std::mem::size_of::<Layout>() + 16 + 32);
const _: () =
    assert!(std::mem::size_of::<CombineParams>() == std::mem::size_of::<Layout>() + 16 + 16);
const _: () = assert!(std::mem::size_of::<ErrorRecord>() as u64 == ERROR_RECORD_BYTES);
const _: () = assert!(
    std::mem::size_of::<DispatchProbeParams>() == std::mem::size_of::<DispatchParams>() + 16
);
const _: () =
    assert!(std::mem::size_of::<CombineProbeParams>() == std::mem::size_of::<CombineParams>() + 16);
const _: () = assert!(std::mem::size_of::<GatherParams>() == 32);
const _: () = assert!(std::mem::align_of::<DispatchParams>() == 8);
const _: () = assert!(std::mem::align_of::<CombineParams>() == 8);
const _: () = assert!(std::mem::align_of::<GatherParams>() == 8);
const _: () = assert!(std::mem::align_of::<ErrorRecord>() == 8);
// SAFETY: plain `#[repr(C)]` integers, layouts asserted above against the device structs.
unsafe impl Pod for DispatchParams {}
unsafe impl Pod for CombineParams {}
unsafe impl Pod for GatherParams {}
unsafe impl Pod for DispatchProbeParams {}
unsafe impl Pod for CombineProbeParams {}
unsafe impl Pod for ErrorRecord {}

/// This crate's device headers, included as `<megamoe_ep/...>`.
pub const HEADERS: Headers = megamoe_cuda::header_set!(
    "device",
    [
        "megamoe_ep/params.cuh",
        "megamoe_ep/comm/sync.cuh",
        "megamoe_ep/impls/dispatch.cuh",
        "megamoe_ep/impls/combine.cuh",
        "megamoe_ep/impls/gather.cuh",
    ]
);

/// Threads per block of every kernel here (`ep::kThreads`).
pub const THREADS: u32 = 512;

/// Dynamic shared memory of the dispatch kernel (`ep::kDispatchDynamicSmem`): two 4-KiB row
/// chunks per warp for its bulk stores, and one chunk of zeros for the padding rows.
pub const DISPATCH_DYNAMIC_SMEM: u32 = (2 * THREADS / 32 + 1) * 4096;

/// A translation unit defining `entry`, which runs `ep::{body}` on one `Params` struct `p`.
fn unit(entry: &str, header: &str, params: &str, body: &str) -> KernelSpec {
    KernelSpec {
        name: entry.to_string(),
        entry: entry.to_string(),
        source: format!(
            "#include <megamoe_ep/impls/{header}>\n\
             extern \"C\" __global__ void __launch_bounds__({THREADS}, 1) \
             {entry}(const __grid_constant__ ep::{params} p) {{ ep::{body}; }}\n"
        ),
        headers: vec![HEADERS],
        options: vec![],
    }
}

/// dispatch_with_permute, its cached replay (combine's backward) and the unpermuted arm;
/// `probe`: the instantiation that injects a fault ([`DispatchProbeParams`]).
pub fn dispatch_kernel(probe: bool) -> KernelSpec {
    if probe {
        unit(
            "ep_dispatch_probe",
            "dispatch.cuh",
            "DispatchProbeParams",
            "dispatch_kernel<true>(p.p, p.fault)",
        )
    } else {
        unit(
            "ep_dispatch",
            "dispatch.cuh",
            "DispatchParams",
            "dispatch_kernel<false>(p, ep::FaultSpec{})",
        )
    }
}

/// combine_with_unpermute (and dispatch's backward); `probe` as for [`dispatch_kernel`].
pub fn combine_kernel(probe: bool) -> KernelSpec {
    if probe {
        unit(
            "ep_combine_probe",
            "combine.cuh",
            "CombineProbeParams",
            "combine_kernel<true>(p.p, p.fault)",
        )
    } else {
        unit(
            "ep_combine",
            "combine.cuh",
            "CombineParams",
            "combine_kernel<false>(p, ep::FaultSpec{})",
        )
    }
}

/// The row gather of the NCCL baseline's permutes.
pub fn gather_kernel() -> KernelSpec {
    unit(
        "ep_gather",
        "gather.cuh",
        "GatherParams",
        "gather_kernel(p)",
    )
}

/// Registry hook: every kernel this crate compiles (shapes are run-time parameters).
pub fn kernel_specs() -> Vec<KernelSpec> {
    vec![
        dispatch_kernel(false),
        combine_kernel(false),
        dispatch_kernel(true),
        combine_kernel(true),
        gather_kernel(),
    ]
}
