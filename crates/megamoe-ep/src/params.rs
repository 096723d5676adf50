//! The kernels' parameter structs, codes and constants, declared once here (their C++
//! declarations, device/megamoe_ep/params.cuh, are generated from these: [`generated_header`]),
//! and the kernels' specifications for the runtime's JIT.

use megamoe_core::plan::layout::{ERROR_RECORD_BYTES, SIGNAL_KINDS};
use megamoe_cuda::interface::{DeviceStruct, GeneratedHeader, Item};
use megamoe_cuda::jit::Headers;
use megamoe_cuda::KernelSpec;

use crate::error::WAITS;
use crate::layout::{MAX_EXPERTS, MAX_RANKS, MAX_TOPK};

megamoe_cuda::device_struct! {
    #[device(namespace = "ep")]
    /// Where everything lives: byte offsets inside every rank's symmetric buffer (the same on
    /// all ranks) and inside this rank's handle block.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct Layout {
        /// Each rank's buffer, valid here under unified addressing.
        pub peer_base: [u64; MAX_RANKS],
        /// This rank's handle block (local).
        pub handle: u64,
        /// Budget of every wait.
        pub deadline_ns: u64,
        /// This rank's `megamoe_cuda::WaitRecord`, where a wait past its deadline is recorded.
        pub wait_record: u64,
        /// Buffer regions.
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
        /// Handle regions.
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
}

megamoe_cuda::device_struct! {
    #[device(namespace = "ep")]
    /// The dispatch kernel's parameters.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct DispatchParams {
        pub l: Layout,
        /// `[T, K]` i32, this rank's routing (full mode), 16-byte aligned.
        pub topk_idx: u64,
        /// `[T, K]` f32 (full mode).
        pub probs: u64,
        pub tokens: i32,
        pub pad_multiple: i32,
        pub row_bytes: i32,
        pub scales_per_row: i32,
        pub row_bound: i32,
        /// A `DISPATCH_*` mode (device: `DispatchMode`).
        pub mode: i32,
        /// 0: output scales row-major `[rows, S]`; else group-major `[S, scales_stride]`.
        pub scales_stride: i32,
        pub _pad0: i32,
    }
}

megamoe_cuda::device_struct! {
    #[device(namespace = "ep")]
    /// The combine kernel's parameters.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct CombineParams {
        pub l: Layout,
        /// `[T, H]` bf16 output.
        pub y: u64,
        /// `[T, K]` f32 output, or 0.
        pub grad_probs: u64,
        pub with_prob_grads: i32,
        /// [`CombineOrder`] as its device value: the order in which a token's copies are summed.
        pub order: i32,
        pub _pad0: i32,
        pub _pad1: i32,
    }
}

megamoe_cuda::device_struct! {
    #[device(namespace = "ep")]
    /// The row gather of the NCCL baseline's permutes.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct GatherParams {
        /// Rows `[*, row_bytes]`.
        pub src: u64,
        /// Rows `[rows, row_bytes]`.
        pub dst: u64,
        /// i32 `[rows]`.
        pub index: u64,
        pub rows: i32,
        pub row_bytes: i32,
    }
}

megamoe_cuda::device_struct! {
    #[device(namespace = "ep")]
    /// What a call rejected on the device (bad routing, overflow) leaves in its rank's buffer
    /// (read by the host after a sync).
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct ErrorRecord {
        /// An `ERR_*` code (device: `ErrorCode`).
        pub code: u32,
        pub rank: u32,
        pub what: u32,
        pub peer: u32,
        pub seen: u64,
        pub expected: u64,
    }
}

const _: () = assert!(std::mem::size_of::<ErrorRecord>() as u64 == ERROR_RECORD_BYTES);

/// DispatchParams::mode (device: `DispatchMode`).
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

megamoe_cuda::device_struct! {
    #[device(namespace = "ep")]
    /// [`InjectedFault`] as the device takes it.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct FaultSpec {
        pub sleep_ns: u64,
        /// The rank that takes the fault.
        pub rank: u32,
        /// A `FAULT_*` code (device: `Fault`).
        pub fault: u32,
    }
}

/// The faults of [`FaultSpec`] (device: `Fault`); the default kernels are instantiated without
/// them.
pub const FAULT_NONE: u32 = 0;
/// Dispatch and combine return at entry.
pub const FAULT_NEVER_ARRIVES: u32 = 1;
/// Dispatch publishes its counts and meta, raises `dispatch ready`, stops.
pub const FAULT_STOP_MID_DISPATCH: u32 = 2;
/// Combine raises `combine ready`, then stops.
pub const FAULT_STOP_MID_COMBINE: u32 = 3;
/// Dispatch publishes a count no routing gives (expert 0: T + 1).
pub const FAULT_CORRUPT_COUNT: u32 = 4;
/// Dispatch sleeps `sleep_ns` before raising `dispatch ready`, then goes on.
pub const FAULT_SLOW_PEER: u32 = 5;

impl From<InjectedFault> for FaultSpec {
    fn from(f: InjectedFault) -> Self {
        let (fault, sleep_ns) = match f.kind {
            FaultKind::NeverArrives => (FAULT_NEVER_ARRIVES, 0),
            FaultKind::StopMidDispatch => (FAULT_STOP_MID_DISPATCH, 0),
            FaultKind::StopMidCombine => (FAULT_STOP_MID_COMBINE, 0),
            FaultKind::CorruptCount => (FAULT_CORRUPT_COUNT, 0),
            FaultKind::SlowPeer(d) => (FAULT_SLOW_PEER, megamoe_cuda::wait::deadline_ns(d)),
        };
        FaultSpec {
            sleep_ns,
            rank: f.rank as u32,
            fault,
        }
    }
}

megamoe_cuda::device_struct! {
    #[device(namespace = "ep")]
    /// The dispatch probe instantiation's parameters.
    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    pub struct DispatchProbeParams {
        pub p: DispatchParams,
        pub fault: FaultSpec,
    }
}

megamoe_cuda::device_struct! {
    #[device(namespace = "ep")]
    /// The combine probe instantiation's parameters.
    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    pub struct CombineProbeParams {
        pub p: CombineParams,
        pub fault: FaultSpec,
    }
}

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

/// Bytes of the row chunks dispatch stages in shared memory for its bulk stores (`ep::kChunkBytes`).
pub const CHUNK_BYTES: u32 = 4096;

/// Dynamic shared memory of the dispatch kernel (`ep::kDispatchDynamicSmem`): two row chunks
/// per warp, double-buffered, and one chunk of zeros for the padding rows.
pub const DISPATCH_DYNAMIC_SMEM: u32 = (2 * THREADS / 32 + 1) * CHUNK_BYTES;

/// The device header generated from this module's declarations: `megamoe_ep/params.cuh`.
pub fn generated_header() -> GeneratedHeader {
    let signals = [
        "kDispatchReady",
        "kDispatchDone",
        "kCombineReady",
        "kCombineDone",
    ];
    assert_eq!(
        signals.len(),
        SIGNAL_KINDS,
        "one signal kind per counter of the buffer"
    );
    let mut signal_values: Vec<_> = (0..).zip(signals).map(|(v, n)| (n, v)).collect();
    signal_values.push(("kNumSignals", SIGNAL_KINDS as i64));
    let orders = [
        ("kExpertOrder", CombineOrder::ExpertId),
        ("kSlotOrder", CombineOrder::Slot),
        ("kPerRankOrder", CombineOrder::PerRank),
    ];
    GeneratedHeader {
        path: "megamoe_ep/params.cuh",
        source: file!(),
        about: &[
            " Kernel parameter structs, codes and constants of dispatch and combine. Every kernel",
            " takes exactly one of the structs as `const __grid_constant__ Params p`.",
        ],
        includes: &["megamoe/ptx/memory.cuh"],
        namespace: "ep",
        preamble: &[
            "using megamoe::i32;",
            "using megamoe::u32;",
            "using megamoe::u64;",
            "namespace ptx = megamoe::ptx;",
        ],
        items: vec![
            Item::constant("", "kMaxRanks", "int", MAX_RANKS),
            Item::constant("", "kMaxTopk", "int", MAX_TOPK),
            Item::constant("", "kMaxExperts", "int", MAX_EXPERTS),
            Item::constant(" Threads per block.", "kThreads", "int", THREADS),
            Item::constant("", "kWarps", "int", THREADS / 32),
            Item::constant(
                " Dispatch stores rows with bulk copies from shared memory: every warp stages its row in\n \
                 chunks of kChunkBytes, double-buffered, and the block keeps one chunk of zeros for the\n \
                 padding rows.",
                "kChunkBytes",
                "int",
                CHUNK_BYTES,
            ),
            Item::constant("", "kDispatchDynamicSmem", "int", DISPATCH_DYNAMIC_SMEM),
            Item::enumeration(
                " Signal kinds: one u64 counter per (kind, source rank) in every rank's buffer.",
                "Signal",
                "int",
                &signal_values,
            ),
            Item::constant(
                " The wait on each signal kind is wait kFirstWait + kind, in this crate's range of wait ids.",
                "kFirstWait",
                "u32",
                format!("{:#x}", WAITS.first),
            ),
            Item::enumeration(
                " CombineParams::order. Each sums in f32 and rounds once per row it produces.",
                "CombineOrder",
                "int",
                &orders.map(|(n, o)| (n, o as i64)),
            ),
            Item::enumeration(
                " DispatchParams::mode.",
                "DispatchMode",
                "int",
                &[
                    ("kFull", DISPATCH_FULL.into()),
                    ("kCached", DISPATCH_CACHED.into()),
                    ("kUnpermuted", DISPATCH_UNPERMUTED.into()),
                ],
            ),
            Item::enumeration(
                " Error codes of the device error record (a wait past its deadline is recorded in the\n \
                 rank's `megamoe::comm::WaitRecord` instead).",
                "ErrorCode",
                "u32",
                &[
                    ("kOk", ERR_OK.into()),
                    ("kBadTopk", ERR_BAD_TOPK.into()),
                    ("kOverflow", ERR_OVERFLOW.into()),
                    ("kBadCount", ERR_BAD_COUNT.into()),
                ],
            ),
            Item::enumeration(
                " Faults the probe instantiations of dispatch and combine inject on one rank.",
                "Fault",
                "u32",
                &[
                    ("kFaultNone", FAULT_NONE.into()),
                    ("kFaultNeverArrives", FAULT_NEVER_ARRIVES.into()),
                    ("kFaultStopMidDispatch", FAULT_STOP_MID_DISPATCH.into()),
                    ("kFaultStopMidCombine", FAULT_STOP_MID_COMBINE.into()),
                    ("kFaultCorruptCount", FAULT_CORRUPT_COUNT.into()),
                    ("kFaultSlowPeer", FAULT_SLOW_PEER.into()),
                ],
            ),
            FaultSpec::declaration(),
            Layout::declaration(),
            DispatchParams::declaration(),
            CombineParams::declaration(),
            DispatchProbeParams::declaration(),
            CombineProbeParams::declaration(),
            GatherParams::declaration(),
            ErrorRecord::declaration(),
        ],
    }
}

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

#[cfg(test)]
mod tests {
    #[test]
    fn generated_headers_are_current() {
        megamoe_cuda::interface::check_headers(
            env!("CARGO_MANIFEST_DIR"),
            &[super::generated_header()],
        );
    }
}
