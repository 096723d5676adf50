//! Device sources of the layer (embedded), the kernels' parameter structs and the
//! configurations the layer runs. The split L1 kernel is the grouped GEMM of megamoe-gemm with
//! the SwiGLU + weight + re-quantization epilogue of device/megamoe_layer/epilogue/; the split
//! L2 kernel is megamoe-gemm's own (bf16 rows through TMA stores). The fused kernel
//! (device/megamoe_layer/impls/fused.cuh) runs the same mainloop and epilogue pieces over one
//! ring of stages.

use megamoe_cuda::jit::Headers;
use megamoe_cuda::{KernelSpec, Pod};
use megamoe_gemm::heuristics::{max_stages, GemmConfig, GemmProblem, Layout, OutDtype};
use megamoe_gemm::params::{GroupedGemmParams, MainloopParams};

use crate::spec::POOL_PAD;

/// This crate's device headers, included as `<megamoe_layer/...>`.
pub const HEADERS: Headers = megamoe_cuda::header_set!(
    "device",
    [
        "megamoe_layer/comm/combine.cuh",
        "megamoe_layer/comm/flags.cuh",
        "megamoe_layer/comm/pull.cuh",
        "megamoe_layer/epilogue/scatter_rows.cuh",
        "megamoe_layer/epilogue/swiglu_quant.cuh",
        "megamoe_layer/impls/fused.cuh",
        "megamoe_layer/impls/fused_params.cuh",
        "megamoe_layer/impls/fused_trace.cuh",
        "megamoe_layer/impls/split_l1.cuh",
        "megamoe_layer/impls/stage.cuh",
        "megamoe_layer/scheduler/task_queue.cuh",
        "megamoe_layer/scheduler/task_stream.cuh",
    ]
);

/// The SwiGLU epilogue's parameters (device: `megamoe::layer::SwigluQuant`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SwigluQuant {
    /// e4m3 `[rows, I]`.
    pub out: u64,
    /// f32 `[I/G, rows_ld]`.
    pub out_scales: u64,
    /// f32 `[rows]`: each pool row's routing weight.
    pub weights: u64,
    pub rows_ld: u32,
    pub inter: u32,
    pub group: u32,
    pub has_clamp: u32,
    pub clamp: f32,
    pub reserved: [u32; 5],
}

/// The L1 kernel's one parameter struct (device: `megamoe::layer::SplitL1Params`).
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
pub struct SplitL1Params {
    pub gemm: GroupedGemmParams,
    pub epilogue: SwigluQuant,
}

const _: () = assert!(std::mem::size_of::<SwigluQuant>() == 64);
const _: () = assert!(std::mem::size_of::<SplitL1Params>() == 704 + 64);
const _: () = assert!(std::mem::align_of::<SplitL1Params>() == 64);
const _: () = assert!(std::mem::offset_of!(SplitL1Params, epilogue) == 704);
const _: () = assert!(std::mem::offset_of!(SwigluQuant, rows_ld) == 24);
const _: () = assert!(std::mem::offset_of!(SwigluQuant, clamp) == 40);
// SAFETY: plain data (tensor maps, integers, a float), sizes and offsets asserted above and in
// split_l1.cuh.
unsafe impl Pod for SplitL1Params {}

/// Where a fused call's data lives (device: `megamoe::layer::FusedRegions`): byte offsets of
/// megamoe-core's fused `SymmetricLayout`, the same in every rank's buffer, and the call's
/// sizes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FusedRegions {
    pub peer_base: [u64; 8],
    pub off_epochs: u64,
    pub off_signals: u64,
    pub off_error: u64,
    pub off_x: u64,
    pub off_x_scales: u64,
    pub off_topk_idx: u64,
    pub off_topk_weights: u64,
    pub off_counts: u64,
    pub off_send_list: u64,
    pub off_l1_pool: u64,
    pub off_l1_scales: u64,
    pub off_ring_weights: u64,
    pub off_row_dest: u64,
    pub off_plan: u64,
    pub off_src_base: u64,
    pub off_blocks: u64,
    pub off_segments: u64,
    pub off_block_flags: u64,
    pub off_expert_l2: u64,
    pub off_expert_done: u64,
    pub off_grid_barrier: u64,
    pub off_combine: u64,
    /// bf16 `[T, H]` output (local).
    pub y: u64,
    pub wait_record: u64,
    pub deadline_ns: u64,
    /// megamoe-core's `PULL_AHEAD_BLOCKS`: the pull of block b waits until the first L1 task of
    /// block b − pull_ahead is handed out.
    pub pull_ahead: u64,
    /// i32 `[E_l]`: the rows each local expert receives in the call are added to it; 0: none.
    pub recv_stats: u64,
    pub rank: i32,
    pub ranks: i32,
    pub hidden: i32,
    pub inter: i32,
    pub experts: i32,
    pub topk: i32,
    pub t_cap: i32,
    pub tokens: i32,
    pub bound: i32,
    pub ring_rows: i32,
    pub ring_slots: i32,
    /// 0: a single wave; else the lag of L2 behind L1 in units.
    pub lag_units: i32,
    pub n1: i32,
    pub n2: i32,
    pub max_blocks: i32,
    pub max_segments: i32,
}

/// The fused kernel's one parameter struct (device: `megamoe::layer::FusedParams`).
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
pub struct FusedParams {
    pub l1: MainloopParams,
    pub l2: MainloopParams,
    pub swiglu: SwigluQuant,
    pub r: FusedRegions,
}

/// The probe instantiation's parameters (device: `megamoe::layer::FusedProbeParams`): the
/// timeline and an injected fault.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
pub struct FusedProbeParams {
    pub fused: FusedParams,
    /// The timeline ([`crate::fused::TraceReport`]), or 0.
    pub trace: u64,
    /// The rank that takes `fault`.
    pub fault_rank: u32,
    /// One of the `FUSED_*` faults below.
    pub fault: u32,
    /// How long [`FUSED_SLOW_PEER`] sleeps.
    pub sleep_ns: u64,
}

/// The faults of the probe instantiation (device: `FusedFault`).
pub const FUSED_NO_FAULT: u32 = 0;
/// The rank publishes its routing, then stops.
pub const FUSED_STOP_AFTER_ROUTING: u32 = 1;
/// The rank stops after half of its tasks.
pub const FUSED_STOP_MID_TASKS: u32 = 2;
/// The rank runs every task, then stops before signalling its L2 rows.
pub const FUSED_STOP_MID_COMBINE: u32 = 3;
/// The rank publishes T = t_cap + 1.
pub const FUSED_CORRUPT_COUNT: u32 = 4;
/// The rank sleeps `sleep_ns` before publishing its routing, then goes on.
pub const FUSED_SLOW_PEER: u32 = 5;

const _: () = assert!(std::mem::size_of::<FusedRegions>() == 35 * 8 + 16 * 4);
const _: () = assert!(std::mem::offset_of!(FusedRegions, y) == 8 * (8 + 22));
const _: () = assert!(std::mem::offset_of!(FusedRegions, rank) == 280);
const _: () = assert!(std::mem::offset_of!(FusedRegions, max_segments) == 340);
// 448 · 2 + 64 + 344, rounded up to the struct's 64-byte alignment.
const _: () = assert!(std::mem::size_of::<FusedParams>() == 1344);
const _: () = assert!(std::mem::offset_of!(FusedProbeParams, trace) == 1344);
const _: () = assert!(std::mem::offset_of!(FusedProbeParams, fault) == 1356);
const _: () = assert!(std::mem::offset_of!(FusedProbeParams, sleep_ns) == 1360);
// 1344 + 24, rounded up to the struct's 64-byte alignment.
const _: () = assert!(std::mem::size_of::<FusedProbeParams>() == 1408);
const _: () = assert!(std::mem::offset_of!(FusedParams, swiglu) == 896);
const _: () = assert!(std::mem::offset_of!(FusedParams, r) == 960);
// SAFETY: plain data (tensor maps, integers, floats), sizes and offsets asserted above and in
// fused_params.cuh.
unsafe impl Pod for FusedParams {}
// SAFETY: as FusedParams, and integers.
unsafe impl Pod for FusedProbeParams {}

/// Error codes the fused kernel leaves in its buffer's error record (device: `FusedError`).
pub const FUSED_BAD_BOUND: u32 = 4;
pub const FUSED_RING_OVERFLOW: u32 = 5;

/// Threads of the fused kernel: two consumer warpgroups, the producer and pull warpgroup.
pub const FUSED_THREADS: u32 = 384;

/// The fused kernel's ring depth for G: the deepest that fits beside a stage's scales.
pub fn fused_stages(group: usize) -> usize {
    max_stages(128, 256, group.min(128))
}

/// The fused kernel's translation unit for G; `probe`: the instantiation that can record its
/// timeline (`megamoe bench layer --trace`) and inject a fault (the selftest).
pub fn fused_spec(group: usize, probe: bool) -> KernelSpec {
    let stages = fused_stages(group);
    let name = format!(
        "layer_fused_s{stages}_g{group}{}",
        if probe { "_probe" } else { "" }
    );
    let (params, call) = if probe {
        ("FusedProbeParams", "p.fused, p.probe")
    } else {
        ("FusedParams", "p, megamoe::layer::FusedProbe{}")
    };
    let source = format!(
        "#include <megamoe_layer/impls/fused.cuh>\n\
         extern \"C\" __global__ void __launch_bounds__({FUSED_THREADS}, 1)\n\
         {name}(const __grid_constant__ megamoe::layer::{params} p) {{\n\
         \x20   megamoe::layer::fused_moe<{stages}, {group}, {probe}>({call});\n\
         }}\n",
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
    megamoe_gemm::heuristics::smem_bytes(128, 256, fused_stages(group), group.min(128)) + 1024
}

/// The L1 GEMM's problem over the pool: N = 2I (gate and up interleaved), K = H.
pub fn l1_problem(
    hidden: usize,
    inter: usize,
    local_experts: usize,
    rows_per_expert: usize,
) -> GemmProblem {
    GemmProblem {
        experts: local_experts,
        n: 2 * inter,
        k: hidden,
        group_size: 128,
        layout: Layout::Contiguous { pad: POOL_PAD },
        out: OutDtype::Bf16,
        rows_per_expert,
    }
}

/// The L1 kernel's one configuration: 128 x 256 tiles, whose two waves per warpgroup are one
/// gate block and its up block (src/weights.rs), the deepest ring that fits, one CTA per SM.
pub fn l1_config(sms: usize) -> GemmConfig {
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
        ctas: sms,
    }
}

/// The L1 kernel's translation unit.
pub fn split_l1_spec(config: &GemmConfig) -> KernelSpec {
    let name = format!("layer_split_l1_s{}", config.stages);
    let source = format!(
        "#include <megamoe_layer/impls/split_l1.cuh>\n\
         extern \"C\" __global__ void __launch_bounds__({threads}, 1)\n\
         {name}(const __grid_constant__ megamoe::layer::SplitL1Params p) {{\n\
         \x20   megamoe::gemm::grouped_gemm_fp8<128, 256, {stages}, 128, false, 1,\n\
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

/// Registry hook: every kernel configuration this crate launches.
pub fn kernel_specs() -> Vec<KernelSpec> {
    vec![
        split_l1_spec(&l1_config(132)),
        fused_spec(128, false),
        fused_spec(64, false),
        fused_spec(128, true),
        fused_spec(64, true),
        crate::stage::stage_spec(),
    ]
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
        let c = l1_config(132);
        assert_eq!((c.block_m, c.block_n), (128, 256));
        assert_eq!(POOL_PAD % c.block_m, 0);
        assert!(
            megamoe_gemm::heuristics::smem_bytes(128, 256, c.stages, 128) + 1024
                <= megamoe_gemm::heuristics::MAX_SMEM_BYTES
        );
    }
}
