//! Device sources of the layer (embedded), the kernels' parameter structs and the
//! configurations the layer runs. The split L1 kernel is the grouped GEMM of megamoe-gemm with
//! the SwiGLU + weight + re-quantization epilogue of device/megamoe_layer/epilogue/; the split
//! L2 kernel is megamoe-gemm's own (bf16 rows through TMA stores). The fused kernel
//! (device/megamoe_layer/impls/fused.cuh) runs the same mainloop and epilogue pieces over one
//! ring of stages.

use megamoe_core::plan::buffer::{MAX_RANKS, MAX_TOPK};
use megamoe_core::plan::layout::{
    fused_max_blocks, fused_max_segments, FusedOffsets, EXPERT_L2_BYTES, PLAN_ENTRY_BYTES,
    PLAN_HEADER_BYTES,
};
use megamoe_core::plan::rules::{self, GROUP_UNITS, PULL_AHEAD_BLOCKS, SLOT_ROWS, UNIT_BLOCKS};
use megamoe_core::plan::{SymmetricLayout, TaskKind};
use megamoe_core::preset::Shape;
use megamoe_cuda::interface::{DeviceStruct, GeneratedHeader, Item};
use megamoe_cuda::jit::Headers;
use megamoe_cuda::{KernelSpec, WaitNames};
use megamoe_gemm::heuristics::{
    max_stages, Accumulation, GemmConfig, GemmProblem, Layout, OutDtype,
};
use megamoe_gemm::params::{GroupedGemmParams, MainloopParams};

use crate::spec::{LayerSpec, POOL_PAD};

/// This crate's device headers, included as `<megamoe_layer/...>`.
pub const HEADERS: Headers = megamoe_cuda::header_set!(
    "device",
    [
        "megamoe_layer/comm/combine.cuh",
        "megamoe_layer/comm/flags.cuh",
        "megamoe_layer/comm/pull.cuh",
        "megamoe_layer/epilogue/scatter_rows.cuh",
        "megamoe_layer/epilogue/swiglu_quant_params.cuh",
        "megamoe_layer/epilogue/swiglu_quant.cuh",
        "megamoe_layer/impls/fused.cuh",
        "megamoe_layer/impls/fused_params.cuh",
        "megamoe_layer/impls/fused_trace.cuh",
        "megamoe_layer/impls/split_l1.cuh",
        "megamoe_layer/impls/stage_params.cuh",
        "megamoe_layer/impls/stage.cuh",
        "megamoe_layer/scheduler/task_queue.cuh",
        "megamoe_layer/scheduler/task_stream.cuh",
    ]
);

megamoe_cuda::device_struct! {
    #[device(namespace = "megamoe::layer", declared_as = "SwigluQuantParams")]
    /// The SwiGLU epilogue's parameters (the device's `SwigluQuant` epilogue derives from them).
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct SwigluQuant {
        /// e4m3 `[rows, I]`.
        pub out: u64,
        /// f32 `[I/G, rows_ld]`.
        pub out_scales: u64,
        /// f32 `[rows]`: each pool row's routing weight (0 on padding rows).
        pub weights: u64,
        /// Rows of the pool: the stride of `out_scales`.
        pub rows_ld: u32,
        /// I.
        pub inter: u32,
        /// G, 64 or 128.
        pub group: u32,
        pub has_clamp: u32,
        pub clamp: f32,
        pub reserved: [u32; 5],
    }
}

megamoe_cuda::device_struct! {
    #[device(namespace = "megamoe::layer")]
    /// The split layer's L1 kernel's one parameter struct.
    #[repr(C, align(64))]
    #[derive(Clone, Copy, Debug)]
    pub struct SplitL1Params {
        pub gemm: GroupedGemmParams,
        pub epilogue: SwigluQuant,
    }
}

megamoe_cuda::device_struct! {
    #[device(namespace = "megamoe::layer")]
    /// Where a fused call's data lives: byte offsets of megamoe-core's fused `SymmetricLayout`
    /// ([`FusedOffsets`]), the same in every rank's buffer, and the call's sizes.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct FusedRegions {
        /// Each rank's symmetric buffer.
        pub peer_base: [u64; MAX_RANKS],
        pub off_epochs: u64,
        pub off_signals: u64,
        pub off_error: u64,
        /// This call's inputs (peers read them).
        pub off_x: u64,
        pub off_x_scales: u64,
        pub off_topk_idx: u64,
        pub off_topk_weights: u64,
        /// The routing as published (peers read it).
        pub off_counts: u64,
        pub off_send_list: u64,
        /// The ring (the L2 pool is the SwiGLU epilogue's).
        pub off_l1_pool: u64,
        pub off_l1_scales: u64,
        pub off_ring_weights: u64,
        pub off_row_dest: u64,
        pub off_plan: u64,
        pub off_src_base: u64,
        pub off_blocks: u64,
        pub off_segments: u64,
        pub off_block_flags: u64,
        /// Per local expert: L2 warpgroup-tasks done and owed (comm/flags.cuh).
        pub off_expert_l2: u64,
        /// `[E]`: the call in which each expert's last L2 rows were written.
        pub off_expert_done: u64,
        pub off_grid_barrier: u64,
        /// `[t_cap, K, H]` bf16 rows the experts' ranks write back.
        pub off_combine: u64,
        /// This rank's output, bf16 `[T, H]` (local).
        pub y: u64,
        /// This rank's `megamoe::comm::WaitRecord`.
        pub wait_record: u64,
        pub deadline_ns: u64,
        /// The call's megamoe-core `rules::pull_ahead`: the pull of block b waits until the
        /// first L1 task of block b - pull_ahead is handed out (`u64::MAX`: it never waits).
        pub pull_ahead: u64,
        /// i32 `[E_l]`: the rows each local expert receives in the call are added to it; 0: none.
        pub recv_stats: u64,
        pub rank: i32,
        pub ranks: i32,
        pub hidden: i32,
        pub inter: i32,
        pub experts: i32,
        pub topk: i32,
        /// Token capacity: the stride of the send lists and the combine rows.
        pub t_cap: i32,
        /// This rank's T.
        pub tokens: i32,
        /// This rank's `num_tokens_bound` (checked against every rank's).
        pub bound: i32,
        /// Rows of the L1 and L2 pools.
        pub ring_rows: i32,
        /// 128-row slots of this call's ring.
        pub ring_slots: i32,
        /// 0: a single wave; else the lag of L2 behind L1 in units.
        pub lag_units: i32,
        /// N-blocks of an L1 and of an L2 task's m-block ([`FUSED_BLOCK_N`] columns each).
        pub n1: i32,
        pub n2: i32,
        pub max_blocks: i32,
        pub max_segments: i32,
    }
}

megamoe_cuda::device_struct! {
    #[device(namespace = "megamoe::layer")]
    /// The fused kernel's one parameter struct: the two GEMMs' mainloops, the L1 epilogue, and
    /// where everything of the call lives.
    #[repr(C, align(64))]
    #[derive(Clone, Copy, Debug)]
    pub struct FusedParams {
        /// Pool rows x W1 (gate/up interleaved), K = H.
        pub l1: MainloopParams,
        /// Intermediate x W2, K = I.
        pub l2: MainloopParams,
        /// L1's epilogue: into the ring's L2 pool.
        pub swiglu: SwigluQuant,
        pub r: FusedRegions,
    }
}

megamoe_cuda::device_struct! {
    #[device(namespace = "megamoe::layer")]
    /// What the probe instantiation is told beyond the call: its timeline
    /// (impls/fused_trace.cuh) or 0, and a fault for rank `fault_rank`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct FusedProbe {
        /// The timeline ([`CtaTrace`]s, then [`TaskTrace`]s), or 0.
        pub trace: u64,
        /// The rank that takes `fault`.
        pub fault_rank: u32,
        /// One of the `FUSED_*` faults (device: `FusedFault`).
        pub fault: u32,
        /// How long [`FUSED_SLOW_PEER`] sleeps.
        pub sleep_ns: u64,
    }
}

megamoe_cuda::device_struct! {
    #[device(namespace = "megamoe::layer")]
    /// The probe instantiation's parameters: the call's, the timeline and an injected fault.
    #[repr(C, align(64))]
    #[derive(Clone, Copy, Debug)]
    pub struct FusedProbeParams {
        pub fused: FusedParams,
        pub probe: FusedProbe,
    }
}

megamoe_cuda::device_struct! {
    #[device(namespace = "megamoe::layer")]
    /// One CTA's part of the timeline: the times (globaltimer ns) its phases end.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct CtaTrace {
        pub start: u64,
        pub routed: u64,
        pub planned: u64,
        pub tasks_done: u64,
        pub rows_written: u64,
        pub end: u64,
        /// Combine items (tokens, or their column chunks at decode sizes) its consumer warps
        /// combined while they waited for every rank's rows.
        pub combined_early: u64,
        /// Its thread 0 between the tasks and the wait: past its system-scope fence, and past
        /// the consumers' barrier and its rows-written signal.
        pub fenced: u64,
        pub raised: u64,
    }
}

megamoe_cuda::device_struct! {
    #[device(namespace = "megamoe::layer")]
    /// One task's part of the timeline (globaltimer ns).
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct TaskTrace {
        /// The producer: the block-counter wait, all stages issued.
        pub wait_start: u64,
        pub wait_end: u64,
        pub issued: u64,
        /// Each consumer warpgroup: task start, mainloop end, epilogue end.
        pub wg: [[u64; 3]; 2],
        pub kind: u32,
        pub block: u32,
    }
}

megamoe_cuda::device_struct! {
    #[device(namespace = "megamoe::layer")]
    /// The call's plan as the kernel built it (the `plan` region).
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct PlanHeader {
        pub n_blocks: u32,
        pub n_segments: u32,
        pub n_tasks: u32,
        /// 0, or the `FusedError` that made every rank skip the call.
        pub status: u32,
        /// The stream's first task no CTA has claimed (each producer claims its next task with
        /// an atomic add, so tasks are claimed in stream order).
        pub next_task: u32,
    }
}

megamoe_cuda::device_struct! {
    #[device(namespace = "megamoe::layer")]
    /// One m-block of the plan (the `blocks` region).
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct BlockInfo {
        /// Local expert.
        pub expert: u32,
        /// Inside the expert's rows (ordered by source rank, then token).
        pub first_row: u32,
        pub rows: u32,
        pub pad: u32,
    }
}

megamoe_cuda::device_struct! {
    #[device(namespace = "megamoe::layer")]
    /// One segment of the task stream (the `segments` region): tasks of one kind over
    /// consecutive m-blocks.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct Segment {
        /// A `TaskKind`.
        pub kind: u32,
        pub first_block: u32,
        pub n_blocks: u32,
        pub first_task: u32,
    }
}

megamoe_cuda::device_struct! {
    #[device(namespace = "megamoe::layer")]
    /// Counters of one m-block (the `block_flags` region), zeroed by every call before its grid
    /// barrier.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct BlockFlags {
        /// Rows of the block in its ring slot.
        pub rows_pulled: u32,
        /// L1 warpgroup-tasks done (2 per task).
        pub l1_done: u32,
        /// L2 warpgroup-tasks done (2 per task).
        pub l2_done: u32,
        /// 1 once the block's first L1 task is handed out (its producer reached it).
        pub l1_started: u32,
    }
}

megamoe_cuda::device_struct! {
    #[device(namespace = "megamoe::layer")]
    /// A local expert's L2 warpgroup-tasks (the `expert_l2` region): done (zeroed by every call
    /// before its grid barrier, like the block counters) and owed (its m-blocks · n2 · 2,
    /// written by the plan).
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct ExpertL2 {
        pub done: u32,
        pub owed: u32,
    }
}

// The sizes megamoe-core's fused layout gives the regions of these records.
const _: () = assert!(std::mem::size_of::<PlanHeader>() == PLAN_HEADER_BYTES);
const _: () = assert!(std::mem::size_of::<BlockInfo>() == PLAN_ENTRY_BYTES);
const _: () = assert!(std::mem::size_of::<Segment>() == PLAN_ENTRY_BYTES);
const _: () = assert!(std::mem::size_of::<BlockFlags>() == PLAN_ENTRY_BYTES);
const _: () = assert!(std::mem::size_of::<ExpertL2>() == EXPERT_L2_BYTES);

/// The faults of the probe instantiation (device: `FusedFault`).
pub const FUSED_NO_FAULT: u32 = 0;
/// The rank publishes its routing, then stops.
#[cfg_attr(not(feature = "harness"), allow(dead_code))] // injected by the selftest only
pub const FUSED_STOP_AFTER_ROUTING: u32 = 1;
/// The rank stops after half of its tasks.
#[cfg_attr(not(feature = "harness"), allow(dead_code))] // injected by the selftest only
pub const FUSED_STOP_MID_TASKS: u32 = 2;
/// The rank runs every task, then stops before signalling its L2 rows.
#[cfg_attr(not(feature = "harness"), allow(dead_code))] // injected by the selftest only
pub const FUSED_STOP_MID_COMBINE: u32 = 3;
/// The rank publishes T = t_cap + 1.
#[cfg_attr(not(feature = "harness"), allow(dead_code))] // injected by the selftest only
pub const FUSED_CORRUPT_COUNT: u32 = 4;
/// The rank sleeps `sleep_ns` before publishing its routing, then goes on.
#[cfg_attr(not(feature = "harness"), allow(dead_code))] // injected by the selftest only
pub const FUSED_SLOW_PEER: u32 = 5;

/// Error codes the fused kernel leaves in its buffer's error record (device: `FusedError`).
pub const FUSED_BAD_BOUND: u32 = 4;
pub const FUSED_RING_OVERFLOW: u32 = 5;

/// The names of the fused kernel's own waits (`FusedWait` in
/// device/megamoe_layer/comm/flags.cuh), beside the GEMM's and megamoe-ep's signal waits.
pub const FUSED_WAITS: WaitNames = WaitNames {
    first: 0x300,
    names: &[
        "an L1 task waiting for its m-block's pulled rows",
        "an L2 task waiting for its m-block's L1 tasks",
        "the pull waiting for a ring slot's previous m-block to finish L2",
        "the grid barrier after the call's plan",
        "the pull waiting for the L1 frontier to come within pull_ahead blocks",
        "the releaser waiting for a consumer warpgroup's slice of a task",
        "the producer waiting for the consumers to read a task slot",
        "a consumer warp waiting for the producer to hand over its next task",
    ],
};

/// Columns of a fused task's tile: a warpgroup's two 128-column waves.
pub const FUSED_BLOCK_N: usize = 256;

/// The device headers generated from this crate's declarations, beside the staging kernel's
/// (crate::generated_headers lists them all).
pub fn generated_headers() -> Vec<GeneratedHeader> {
    vec![
        swiglu_quant_header(),
        split_l1_header(),
        fused_params_header(),
    ]
}

const NAMESPACE: &str = "megamoe::layer";

fn swiglu_quant_header() -> GeneratedHeader {
    GeneratedHeader {
        path: "megamoe_layer/epilogue/swiglu_quant_params.cuh",
        source: file!(),
        about: &[" The SwiGLU epilogue's parameters (epilogue/swiglu_quant.cuh)."],
        includes: &[],
        namespace: NAMESPACE,
        preamble: &[],
        items: vec![SwigluQuant::declaration()],
    }
}

fn split_l1_header() -> GeneratedHeader {
    GeneratedHeader {
        path: "megamoe_layer/impls/split_l1.cuh",
        source: file!(),
        about: &[
            " The split layer's L1 kernel: the grouped GEMM over the dispatched pool (x · W1ᵀ,",
            " W1's gate and up blocks interleaved) with the SwiGLU + weight + re-quantization",
            " epilogue.",
        ],
        includes: &[
            "megamoe_gemm/impls/grouped_gemm.cuh",
            "megamoe_layer/epilogue/swiglu_quant.cuh",
        ],
        namespace: NAMESPACE,
        preamble: &[],
        items: vec![SplitL1Params::declaration()],
    }
}

fn fused_params_header() -> GeneratedHeader {
    let mut items = fused_constants();
    items.extend(fused_codes());
    items.extend([
        FusedRegions::declaration(),
        FusedParams::declaration(),
        FusedProbe::declaration(),
        FusedProbeParams::declaration(),
        PlanHeader::declaration(),
        BlockInfo::declaration(),
        Segment::declaration(),
        BlockFlags::declaration(),
        ExpertL2::declaration(),
        CtaTrace::declaration(),
        TaskTrace::declaration(),
    ]);
    GeneratedHeader {
        path: "megamoe_layer/impls/fused_params.cuh",
        source: file!(),
        about: &[
            " The fused kernel's host/device interface: its one parameter struct (the two GEMMs'",
            " mainloops, the L1 epilogue, and where everything of the call lives), its codes,",
            " waits and shapes, and the timeline of its probe instantiation.",
        ],
        includes: &[
            "megamoe_gemm/mma/mainloop_params.cuh",
            "megamoe_layer/epilogue/swiglu_quant.cuh",
        ],
        namespace: NAMESPACE,
        preamble: &[],
        items,
    }
}

/// The fused kernel's shapes: what its tiles and task stream are made of.
fn fused_constants() -> Vec<Item> {
    vec![
        Item::constant(" Ranks a buffer can have.", "kMaxRanks", "int", MAX_RANKS),
        Item::constant(" Slots per token.", "kMaxTopk", "int", MAX_TOPK),
        Item::constant(
            " Rows of an m-block and of a ring slot.",
            "kBlockM",
            "u32",
            SLOT_ROWS,
        ),
        Item::constant(
            " Columns of a task's tile.",
            "kBlockN",
            "u32",
            FUSED_BLOCK_N,
        ),
        Item::constant(
            " M-blocks of a unit of the task stream.",
            "kUnitBlocks",
            "u32",
            UNIT_BLOCKS,
        ),
        Item::constant(
            " Units of a group of the task stream.",
            "kGroupUnits",
            "u32",
            GROUP_UNITS,
        ),
        Item::constant(
            " Blocks the pull runs ahead of the L1 frontier where a block reuses a slot.",
            "kPullAheadBlocks",
            "u32",
            PULL_AHEAD_BLOCKS,
        ),
    ]
}

/// The fused kernel's faults, error codes, waits and task kinds.
fn fused_codes() -> Vec<Item> {
    vec![
        Item::enumeration(
            " Faults the probe instantiation injects on one rank (the selftest's fault checks).",
            "FusedFault",
            "u32",
            &[
                ("kNoFault", FUSED_NO_FAULT.into()),
                ("kStopAfterRouting", FUSED_STOP_AFTER_ROUTING.into()),
                ("kStopMidTasks", FUSED_STOP_MID_TASKS.into()),
                ("kStopMidCombine", FUSED_STOP_MID_COMBINE.into()),
                ("kCorruptCount", FUSED_CORRUPT_COUNT.into()),
                ("kSlowPeer", FUSED_SLOW_PEER.into()),
            ],
        ),
        Item::enumeration(
            " Error codes of the buffer's error record (megamoe-ep's `ErrorRecord`).",
            "FusedError",
            "u32",
            &[
                ("kBadBound", FUSED_BAD_BOUND.into()),
                ("kRingOverflow", FUSED_RING_OVERFLOW.into()),
            ],
        ),
        Item::waits(
            " The kernel's own waits, in this crate's range of wait ids (comm/flags.cuh).",
            "FusedWait",
            &FUSED_WAITS,
            &[
                "kWaitRowsPulled",
                "kWaitL1Done",
                "kWaitSlotFree",
                "kWaitGrid",
                "kWaitPullTurn",
                "kWaitSlicesDone",
                "kWaitTaskSlot",
                "kWaitTaskReady",
            ],
        ),
        Item::enumeration(
            " A task's GEMM (megamoe-core's `TaskKind`).",
            "TaskKind",
            "u32",
            &[("kL1", TaskKind::L1 as i64), ("kL2", TaskKind::L2 as i64)],
        ),
    ]
}

impl SwigluQuant {
    /// The L1 epilogue of `spec` into the e4m3 rows at `out` and their scales at `out_scales`
    /// (`rows` rows), each row weighted by its f32 at `weights`.
    pub fn new(spec: &LayerSpec, out: u64, out_scales: u64, weights: u64, rows: usize) -> Self {
        SwigluQuant {
            out,
            out_scales,
            weights,
            rows_ld: rows as u32,
            inter: spec.shape.inter as u32,
            group: spec.group as u32,
            has_clamp: spec.clamp.is_some() as u32,
            clamp: spec.clamp.unwrap_or(0.0),
            reserved: [0; 5],
        }
    }
}

impl FusedRegions {
    /// The regions of a fused layer of `spec` over `layout`, whose buffer's base on each rank
    /// is `peer_base`; the rank's own fields (rank, output, wait record, deadline) and the
    /// call's ([`FusedRegions::set_call`]) are left 0.
    pub fn new(
        spec: &LayerSpec,
        layout: &SymmetricLayout,
        off: &FusedOffsets,
        peer_base: [u64; MAX_RANKS],
    ) -> Self {
        let (shape, ranks, t_cap) = (&spec.shape, spec.ranks, layout.ring.t_cap);
        FusedRegions {
            peer_base,
            off_epochs: off.epochs,
            off_signals: off.signals,
            off_error: off.error,
            off_x: off.x,
            off_x_scales: off.x_scales,
            off_topk_idx: off.topk_idx,
            off_topk_weights: off.topk_weights,
            off_counts: off.counts,
            off_send_list: off.send_list,
            off_l1_pool: off.l1_pool,
            off_l1_scales: off.l1_pool_scales,
            off_ring_weights: off.ring_weights,
            off_row_dest: off.row_dest,
            off_plan: off.plan,
            off_src_base: off.src_base,
            off_blocks: off.blocks,
            off_segments: off.segments,
            off_block_flags: off.block_flags,
            off_expert_l2: off.expert_l2,
            off_expert_done: off.expert_done,
            off_grid_barrier: off.grid_barrier,
            off_combine: off.combine,
            ranks: ranks as i32,
            hidden: shape.hidden as i32,
            inter: shape.inter as i32,
            experts: shape.experts as i32,
            topk: shape.topk as i32,
            t_cap: t_cap as i32,
            ring_rows: layout.pool_rows as i32,
            n1: (2 * shape.inter / FUSED_BLOCK_N) as i32,
            n2: (shape.hidden / FUSED_BLOCK_N) as i32,
            max_blocks: fused_max_blocks(shape, ranks, t_cap) as i32,
            max_segments: fused_max_segments(shape, ranks, t_cap) as i32,
            ..FusedRegions::default()
        }
    }

    /// The call's fields: this rank's `tokens` and `bound`, the order (`lag_units`, 0 for a
    /// single wave, and `ring_slots`) and how far the pull runs ahead (megamoe-core's
    /// `rules::pull_ahead`, from this rank's tokens).
    pub fn set_call(
        &mut self,
        shape: &Shape,
        tokens: usize,
        bound: usize,
        lag_units: usize,
        ring_slots: usize,
    ) {
        self.tokens = tokens as i32;
        self.bound = bound.min(i32::MAX as usize) as i32;
        self.lag_units = lag_units as i32;
        self.ring_slots = ring_slots as i32;
        self.pull_ahead = rules::pull_ahead(shape, self.ranks as usize, tokens) as u64;
    }
}

/// The fused kernel's ring depth for G: the deepest that fits beside a stage's scales.
pub fn fused_stages(group: usize) -> usize {
    max_stages(SLOT_ROWS, FUSED_BLOCK_N, group.min(128))
}

/// The fused kernel's translation unit for G and the GEMMs' accumulation; `probe`: the
/// instantiation that can record its timeline (`megamoe bench layer --trace`) and inject a
/// fault (the selftest).
pub fn fused_spec(group: usize, accumulation: Accumulation, probe: bool) -> KernelSpec {
    let stages = fused_stages(group);
    let rescaled = accumulation == Accumulation::Rescaled;
    let name = format!(
        "layer_fused_s{stages}_g{group}{}{}",
        if rescaled { "_rescaled" } else { "" },
        if probe { "_probe" } else { "" }
    );
    let (params, call) = if probe {
        ("FusedProbeParams", "p.fused, p.probe")
    } else {
        ("FusedParams", "p, megamoe::layer::FusedProbe{}")
    };
    let source = format!(
        "#include <megamoe_layer/impls/fused.cuh>\n\
         static_assert(megamoe::gemm::SmemLayout<{SLOT_ROWS}, {FUSED_BLOCK_N}, {stages}, {group}>::kBytes + 1024\n\
         \x20             == {smem}, \"the host's shared-memory plan\");\n\
         extern \"C\" __global__ void __launch_bounds__({threads}, 1)\n\
         {name}(const __grid_constant__ megamoe::layer::{params} p) {{\n\
         \x20   megamoe::layer::fused_moe<{stages}, {group}, {rescaled}, {probe}>({call});\n\
         }}\n",
        threads = megamoe_gemm::kernel::THREADS,
        smem = fused_smem_bytes(group),
    );
    KernelSpec {
        name: name.clone(),
        entry: name,
        source,
        headers: vec![
            megamoe_gemm::kernel::HEADERS,
            megamoe_ep::params::HEADERS,
            HEADERS,
        ],
        options: vec![],
    }
}

/// Dynamic shared memory of the fused kernel: the GEMM's plan for its stages, plus the 1 KiB
/// alignment slack.
pub fn fused_smem_bytes(group: usize) -> usize {
    megamoe_gemm::heuristics::smem_bytes(
        SLOT_ROWS,
        FUSED_BLOCK_N,
        fused_stages(group),
        group.min(128),
    ) + 1024
}

/// The L1 GEMM's problem over the pool: N = 2I (gate and up interleaved), K = H.
pub fn l1_problem(
    hidden: usize,
    inter: usize,
    local_experts: usize,
    rows_per_expert: usize,
    accumulation: Accumulation,
) -> GemmProblem {
    GemmProblem {
        experts: local_experts,
        n: 2 * inter,
        k: hidden,
        group_size: 128,
        layout: Layout::Contiguous { pad: POOL_PAD },
        out: OutDtype::Bf16,
        rows_per_expert,
        accumulation,
    }
}

/// The L1 kernel's one configuration: 128 x 256 tiles, whose two waves per warpgroup are one
/// gate block and its up block (src/weights.rs), the deepest ring that fits, one CTA per SM.
pub fn l1_config(sms: usize, accumulation: Accumulation) -> GemmConfig {
    GemmConfig {
        block_m: 128,
        block_n: 256,
        stages: max_stages(128, 256, 128),
        group_size: 128,
        masked: false,
        out: OutDtype::Bf16,
        tma_store: false,
        group_m: 8,
        cluster_m: 1,
        accumulation,
        ctas: sms,
    }
}

/// The L1 kernel's translation unit.
pub fn split_l1_spec(config: &GemmConfig) -> KernelSpec {
    let rescaled = config.accumulation == Accumulation::Rescaled;
    let name = format!(
        "layer_split_l1_s{}{}",
        config.stages,
        if rescaled { "_rescaled" } else { "" }
    );
    let source = format!(
        "#include <megamoe_layer/impls/split_l1.cuh>\n\
         extern \"C\" __global__ void __launch_bounds__({threads}, 1)\n\
         {name}(const __grid_constant__ megamoe::layer::SplitL1Params p) {{\n\
         \x20   megamoe::gemm::grouped_gemm_fp8<128, 256, {stages}, 128, false, 1, {rescaled},\n\
         \x20                                   megamoe::gemm::TileScheduler<128, 256, false, 1>,\n\
         \x20                                   megamoe::layer::SwigluQuant>(p.gemm, p.epilogue);\n\
         }}\n",
        threads = megamoe_gemm::kernel::THREADS,
        stages = config.stages,
    );
    KernelSpec {
        name: name.clone(),
        entry: name,
        source,
        headers: vec![megamoe_gemm::kernel::HEADERS, HEADERS],
        options: vec![],
    }
}

/// Every configuration of the split L1 and fused kernels (crate::kernel_specs adds the staging
/// kernel's).
pub fn kernel_specs() -> Vec<KernelSpec> {
    let mut specs = Vec::new();
    for accumulation in Accumulation::ALL {
        specs.push(split_l1_spec(&l1_config(132, accumulation)));
        for probe in [false, true] {
            for group in [128, 64] {
                specs.push(fused_spec(group, accumulation, probe));
            }
        }
    }
    specs
}

/// Blocks of one rank's launch that waits on other ranks (the split form's dispatch and combine,
/// the fused kernel): the caller's choice, else every SM of the rank's share of its GPU (in the
/// split form nothing runs beside them: measured faster than megamoe-ep's default,
/// docs/PERF.md); never more than the GPU's SMs over the ranks placed on it, so every rank's
/// blocks are resident at once and no waiting block keeps another rank's from running.
pub(crate) fn comm_sms(requested: Option<usize>, ranks: usize, gpus: usize, sms: usize) -> usize {
    let per_gpu = ranks.div_ceil(gpus.min(ranks));
    let fit = (sms / per_gpu).max(1);
    requested.unwrap_or(fit).clamp(1, fit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn communication_blocks_of_every_virtual_rank_fit_on_the_gpu() {
        assert_eq!(comm_sms(None, 1, 1, 132), 132);
        assert_eq!(comm_sms(Some(24), 1, 1, 132), 24);
        assert_eq!(comm_sms(Some(200), 1, 1, 132), 132);
        assert_eq!(comm_sms(None, 8, 1, 132), 16);
        assert_eq!(comm_sms(Some(64), 8, 2, 132), 33);
        assert_eq!(comm_sms(Some(0), 2, 2, 132), 1);
    }

    #[test]
    fn every_included_header_is_embedded() {
        for (name, body) in HEADERS {
            for line in body.lines() {
                if let Some(inc) = line.trim().strip_prefix("#include <megamoe_layer/") {
                    let inc = format!("megamoe_layer/{}", inc.trim_end_matches('>'));
                    assert!(
                        HEADERS.iter().any(|(n, _)| *n == inc),
                        "{name} includes {inc}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_l1_tile_holds_a_gate_block_and_its_up_block() {
        let c = l1_config(132, Accumulation::PerBlock);
        assert_eq!((c.block_m, c.block_n), (128, 256));
        assert_eq!(POOL_PAD % c.block_m, 0);
        assert!(
            megamoe_gemm::heuristics::smem_bytes(128, 256, c.stages, 128) + 1024
                <= megamoe_gemm::heuristics::MAX_SMEM_BYTES
        );
    }
}
