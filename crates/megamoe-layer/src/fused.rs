//! The fused layer (SPEC §4 fused): per call and per rank, on the rank's stream,
//!
//! 1. bf16 input only: the library's quantizer writes e4m3 rows and per-128 scales into the
//!    rank's symmetric input region (FP8 input is uploaded there as it is);
//! 2. one persistent launch (device/megamoe_layer/impls/fused.cuh): the routing is published
//!    and exchanged, every rank pulls the rows of its experts into a ring of 128-row slots, runs
//!    L1 with SwiGLU + weight + re-quantization into the ring and L2 with each row scattered in
//!    bf16 to its token's rank, in the order of the planner's task stream (L2 trails L1 by the
//!    lag of megamoe-core's rules), then sums its own tokens' rows in slot order.
//!
//! Every rank decides the call's order from the bound alone (`megamoe_core::plan::rules`), so
//! all ranks replay the same stream; the kernel checks the bounds every rank published and, on
//! a mismatch, every rank skips the call and reports it. Ranks on one GPU (virtual ranks) share
//! its SMs: every rank's launch takes at most `SMs / ranks on the GPU` CTAs, one per SM, so
//! every CTA of every rank is resident at once and no wait can starve.

use std::sync::Arc;

use half::bf16;
use megamoe_core::plan::rules::{call_order, Order, RingSizing, SLOT_ROWS};
use megamoe_core::plan::{Kernel, StreamParams, SymmetricLayout, Task, TaskKind};
use megamoe_core::weights::RankWeightsFp8;
use megamoe_core::Error;
use megamoe_cuda::wait::{deadline_ns, DEFAULT_DEADLINE};
use megamoe_cuda::{
    jit, AllGather, DeviceBuffer, Gpu, Kernel as CudaKernel, LaunchConfig, Quantizer,
    SymmetricBuffer, WaitNames, World,
};
use megamoe_ep::params::ErrorRecord;
use megamoe_gemm::grouped::gemm_params;
use megamoe_gemm::heuristics::{GemmConfig, GemmProblem, Layout, OutDtype};
use megamoe_gemm::GemmPointers;

use crate::call::{
    check_bound, check_call, check_lengths, Activations, DeviceRankTensors, IndexType, RankInput,
};
use crate::error::{LayerError, Result};
use crate::inputs::{append_staged, download_outputs};
use crate::kernel::{
    comm_sms, fused_smem_bytes, fused_spec, l1_config, FusedParams, FusedProbeParams, FusedRegions,
    SwigluQuant, FUSED_BAD_BOUND, FUSED_CORRUPT_COUNT, FUSED_NO_FAULT, FUSED_RING_OVERFLOW,
    FUSED_SLOW_PEER, FUSED_STOP_AFTER_ROUTING, FUSED_STOP_MID_COMBINE, FUSED_STOP_MID_TASKS,
    FUSED_THREADS,
};
use crate::spec::{LayerSpec, POOL_PAD};
use crate::stage::{StageParams, Stager};
use crate::weights;

/// The names of the fused kernel's own waits (`FusedWait` in
/// device/megamoe_layer/comm/flags.cuh), beside the GEMM's and megamoe-ep's signal waits.
pub const WAITS: WaitNames = WaitNames {
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

/// The fused kernel's signal kinds (device: `FusedSignal`), numbered like megamoe-ep's waits.
const SIGNAL_WAITS: WaitNames = WaitNames {
    first: 0x200,
    names: &[
        "every rank's routing published",
        "every rank's L2 rows written back",
    ],
};

/// Every wait the fused kernel may record: its own, its signals', the GEMM mainloop's.
const ALL_WAITS: [&WaitNames; 3] = [&WAITS, &SIGNAL_WAITS, &megamoe_gemm::grouped::WAITS];

/// A call whose inputs are on the device: what [`FusedLayer::launch`] runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FusedStaged {
    /// T of every local rank ([`FusedLayer::local_ranks`]).
    pub tokens: Vec<usize>,
    /// Every local rank's `num_tokens_bound` as the kernel checks it (equal unless a test injects a
    /// mismatch).
    bounds: Vec<usize>,
    bf16: Vec<bool>,
    /// The call's order and ring, from the bound.
    lag_units: usize,
    ring_slots: usize,
}

impl FusedStaged {
    /// The call's stream order: lag in units, or None for a single wave.
    pub fn lag_units(&self) -> Option<usize> {
        (self.lag_units > 0).then_some(self.lag_units)
    }

    /// Ring slots (128-row m-blocks) the call may have live at once.
    pub fn ring_slots(&self) -> usize {
        self.ring_slots
    }
}

struct FusedRank {
    gpu: Gpu,
    kernel: Arc<CudaKernel>,
    params: FusedParams,
    /// W1 (interleaved), its scales, W2, its scales: read through the params only.
    _weights: [DeviceBuffer; 4],
    x_bf16: DeviceBuffer,
    y: DeviceBuffer,
    quantizer: Quantizer,
    /// The traced kernel's timeline (impls/fused_trace.cuh), when the layer records one.
    trace: Option<DeviceBuffer>,
    /// The staging of calls the host does not read ([`FusedLayer::launch_device`]).
    stage: Stager,
}

/// How a fused layer is built beyond its spec.
#[derive(Clone, Copy, Debug)]
pub struct FusedOptions {
    /// Budget of every device wait.
    pub deadline: std::time::Duration,
    /// Run the kernel instantiation that records its timeline ([`FusedLayer::trace_report`]).
    pub trace: bool,
    /// CTAs of each rank's launch, one per SM (default: every SM of its GPU, divided among the
    /// ranks this process runs on it). Processes that share a GPU each take a share of its
    /// SMs only when they say so here.
    pub ctas: Option<usize>,
}

impl Default for FusedOptions {
    fn default() -> Self {
        FusedOptions {
            deadline: DEFAULT_DEADLINE,
            trace: false,
            ctas: None,
        }
    }
}

/// Bytes of the device's `CtaTrace` and `TaskTrace` (impls/fused_trace.cuh).
const CTA_TRACE_BYTES: usize = 56;
const TASK_TRACE_BYTES: usize = 80;

/// Where one call's time went on one rank, from the traced kernel's timeline (µs).
#[derive(Clone, Copy, Debug, Default)]
pub struct TraceReport {
    /// Median over CTAs of each phase: routing exchange, plan (to the grid barrier), tasks,
    /// wait for every rank's rows, combine.
    pub phases_us: [f64; 5],
    /// Per task kind (L1, L2): tasks, and the mean of the producer's wait on the block counter,
    /// the consumers' gap before the task (from the previous task's end), mainloop and epilogue;
    /// and the median mainloop, which a few long waits for data do not move.
    pub kinds: [KindTrace; 2],
    /// Σ mainloop / Σ (tasks phase) over the consumer warpgroups: how busy the tensor cores' feeders were.
    pub mainloop_share: f64,
    /// Tokens combined early: by CTAs done with their tasks, while they waited for every rank's
    /// rows (counted in the wait phase), over all CTAs.
    pub combined_early: u64,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct KindTrace {
    pub tasks: usize,
    pub producer_wait_us: f64,
    pub gap_us: f64,
    pub mainloop_us: f64,
    pub epilogue_us: f64,
    pub mainloop_median_us: f64,
}

/// The fused MoE layer on a world of real or virtual ranks.
pub struct FusedLayer {
    pub spec: LayerSpec,
    pub layout: SymmetricLayout,
    world: World,
    buffers: SymmetricBuffer,
    /// The ranks this process holds, `world.local_ranks()` in order.
    ranks: Vec<FusedRank>,
    launch: LaunchConfig,
    expert_counts: Vec<Vec<u64>>,
    /// A device wait expired: the buffers' counters no longer agree, the layer must be rebuilt.
    broken: bool,
    /// The probe instantiation runs instead of the default kernel (a timeline, a fault).
    probe: Option<Probe>,
    /// A layer of one local rank queues [`Self::launch_device`]'s work on the caller's stream
    /// itself (no event each way): that stream's handle, and the rank's GPU handle on it.
    caller: Option<(u64, Gpu)>,
}

/// What the probe instantiation is told beyond the call (device: `FusedProbeParams`).
#[derive(Clone, Copy, Debug)]
struct Probe {
    fault_rank: u32,
    fault: u32,
    sleep_ns: u64,
}

/// A fault the selftest injects on one rank (device: `FusedFault`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// The rank publishes its routing, then stops.
    StopAfterRouting,
    /// The rank stops after half of its tasks.
    StopMidTasks,
    /// The rank runs every task (its L2 rows are written), then stops before signalling them.
    StopMidCombine,
    /// The rank publishes T = t_cap + 1, a count no call has.
    CorruptCount,
    /// The rank sleeps this long before publishing its routing, then goes on.
    SlowPeer(std::time::Duration),
}

fn region(layout: &SymmetricLayout, name: &str) -> u64 {
    layout
        .region(name)
        .unwrap_or_else(|| panic!("the fused layout has a `{name}` region"))
        .offset
}

impl FusedLayer {
    /// Builds the layer: checks `spec`, allocates every buffer (see [`LayerSpec::bytes`]),
    /// compiles and loads the kernel, and loads each rank's weights from `weights(rank)` (SPEC
    /// §2 layouts; W1's gate and up blocks are interleaved on the way, src/weights.rs).
    pub fn new(
        spec: LayerSpec,
        weights: impl Fn(usize) -> megamoe_core::Result<RankWeightsFp8>,
    ) -> Result<FusedLayer> {
        FusedLayer::with_deadline(spec, weights, DEFAULT_DEADLINE)
    }

    /// [`Self::new`] with every device wait bounded by `deadline` instead of the default 5 s.
    pub fn with_deadline(
        spec: LayerSpec,
        weights: impl Fn(usize) -> megamoe_core::Result<RankWeightsFp8>,
        deadline: std::time::Duration,
    ) -> Result<FusedLayer> {
        let options = FusedOptions {
            deadline,
            ..FusedOptions::default()
        };
        FusedLayer::with_options(spec, weights, options)
    }

    /// [`Self::new`] with `options`.
    pub fn with_options(
        spec: LayerSpec,
        weights: impl Fn(usize) -> megamoe_core::Result<RankWeightsFp8>,
        options: FusedOptions,
    ) -> Result<FusedLayer> {
        spec.validate()?;
        let world = World::with_deadline(spec.ranks, options.deadline)?;
        let probe = options.trace;
        FusedLayer::build(spec, weights, options, spec.fused_layout()?, probe, world)
    }

    /// Rank `rank` of a world of `spec.ranks` processes (one rank each, as under torchrun), on
    /// GPU `device`: every process builds its rank with the same `spec` and `options`, and the
    /// symmetric buffers' handles go through `exchange`, which every process calls in the same
    /// order. `weights(rank)` is asked for this rank only; calls take this rank's input alone.
    pub fn for_rank(
        spec: LayerSpec,
        weights: impl Fn(usize) -> megamoe_core::Result<RankWeightsFp8>,
        options: FusedOptions,
        rank: usize,
        device: usize,
        exchange: Box<dyn AllGather>,
    ) -> Result<FusedLayer> {
        spec.validate()?;
        let layout = spec.fused_layout()?;
        let world = World::one_rank(rank, spec.ranks, device, options.deadline, exchange)?;
        FusedLayer::build(spec, weights, options, layout, options.trace, world)
    }

    /// The layer whose rank `rank` takes `fault` on every call (the selftest's fault checks).
    pub(crate) fn with_fault(
        spec: LayerSpec,
        weights: impl Fn(usize) -> megamoe_core::Result<RankWeightsFp8>,
        deadline: std::time::Duration,
        rank: usize,
        fault: Fault,
    ) -> Result<FusedLayer> {
        spec.validate()?;
        let options = FusedOptions {
            deadline,
            ..FusedOptions::default()
        };
        let world = World::with_deadline(spec.ranks, deadline)?;
        let mut layer =
            FusedLayer::build(spec, weights, options, spec.fused_layout()?, true, world)?;
        let (fault, sleep_ns) = match fault {
            Fault::StopAfterRouting => (FUSED_STOP_AFTER_ROUTING, 0),
            Fault::StopMidTasks => (FUSED_STOP_MID_TASKS, 0),
            Fault::StopMidCombine => (FUSED_STOP_MID_COMBINE, 0),
            Fault::CorruptCount => (FUSED_CORRUPT_COUNT, 0),
            Fault::SlowPeer(d) => (FUSED_SLOW_PEER, deadline_ns(d)),
        };
        layer.probe = Some(Probe {
            fault_rank: rank as u32,
            fault,
            sleep_ns,
        });
        Ok(layer)
    }

    /// The layer with its ring clamped to the full pool, so it never wraps: the selftest's
    /// reference for the ring.
    pub(crate) fn full_pool(
        spec: LayerSpec,
        weights: impl Fn(usize) -> megamoe_core::Result<RankWeightsFp8>,
    ) -> Result<FusedLayer> {
        spec.validate()?;
        let ring = RingSizing::full_pool(&spec.shape, spec.ranks, spec.max_tokens);
        let layout =
            SymmetricLayout::with_ring(Kernel::Fused, &spec.shape, spec.ranks, spec.group, ring)?;
        let options = FusedOptions::default();
        let world = World::with_deadline(spec.ranks, options.deadline)?;
        FusedLayer::build(spec, weights, options, layout, false, world)
    }

    /// `probe`: load the probe instantiation (with [`FusedOptions::trace`] or an injected fault).
    fn build(
        spec: LayerSpec,
        weights: impl Fn(usize) -> megamoe_core::Result<RankWeightsFp8>,
        options: FusedOptions,
        layout: SymmetricLayout,
        probe: bool,
        world: World,
    ) -> Result<FusedLayer> {
        let (h, i, e, k) = (
            spec.shape.hidden,
            spec.shape.inter,
            spec.shape.experts,
            spec.shape.topk,
        );
        let el = spec.shape.local_experts(spec.ranks);
        let sms = world.ranks()[0].gpu.props().sm_count as usize;
        let ctas = comm_sms(options.ctas, world.ranks().len(), world.gpu_count(), sms);
        // A programmatic dependent launch: the kernel's set-up runs while the previous kernel on
        // the stream (the quantizer, or the last call) finishes; it waits for it before reading.
        let launch = LaunchConfig::new(ctas as u32, FUSED_THREADS)
            .with_dynamic_smem(fused_smem_bytes(spec.group) as u32)
            .with_pdl(true);
        let compiled = jit::compile(&fused_spec(spec.group, spec.accumulation, probe))?;
        let kernels = world.load(&compiled)?;
        let buffers = world.alloc_symmetric(layout.total_bytes as usize)?;
        let ring_rows = layout.pool_rows;
        let t_cap = layout.ring.t_cap;
        let mut peer_base = [0u64; 8];
        for (r, p) in peer_base.iter_mut().enumerate().take(spec.ranks) {
            *p = buffers.ptr(r);
        }
        let off = |name| region(&layout, name);
        let config = l1_config(ctas, spec.accumulation);
        let mut ranks = Vec::with_capacity(world.ranks().len());
        for (r, kernel) in world.local_ranks().zip(kernels) {
            let w = weights(r).map_err(|e| LayerError::input(r, e))?;
            weights::check(&w, &spec.shape, el).map_err(|e| LayerError::input(r, e))?;
            let (w1, s1) = weights::interleave_w1(&w.w1, &w.s1, &spec.shape, el);
            let rank = world.rank(r);
            let gpu = rank.gpu.clone();
            let w1 = gpu.alloc_from(&w1)?;
            let s1 = gpu.alloc_from(&s1)?;
            let w2 = gpu.alloc_from(&w.w2)?;
            let s2 = gpu.alloc_from(&w.s2)?;
            let base = buffers.ptr(r);
            let mainloop = |n, kk, group, a: u64, scale_a: u64, b: u64, scale_b: u64| {
                let problem = GemmProblem {
                    experts: el,
                    n,
                    k: kk,
                    group_size: group,
                    layout: Layout::Contiguous { pad: POOL_PAD },
                    out: OutDtype::Bf16,
                    rows_per_expert: POOL_PAD,
                    accumulation: spec.accumulation,
                };
                let config = GemmConfig {
                    group_size: group,
                    ..config
                };
                let (params, _record) = gemm_params(
                    &gpu,
                    &problem,
                    &config,
                    ring_rows,
                    GemmPointers {
                        a,
                        scale_a,
                        b,
                        scale_b,
                        // The mainloop reads neither (the fused kernel has its own schedule and
                        // epilogues); the output map only needs a valid address.
                        expert_rows: 0,
                        out: a,
                    },
                )?;
                let mut m = params.mainloop;
                m.error = rank.wait_record();
                m.timeout_ns = deadline_ns(rank.deadline());
                Ok::<_, LayerError>(m)
            };
            let l1 = mainloop(
                2 * i,
                h,
                128,
                base + off("l1_pool"),
                base + off("l1_pool_scales"),
                w1.ptr(),
                s1.ptr(),
            )?;
            let l2 = mainloop(
                h,
                i,
                spec.group,
                base + off("l2_pool"),
                base + off("l2_pool_scales"),
                w2.ptr(),
                s2.ptr(),
            )?;
            let y = gpu.alloc_zeroed(t_cap * h * 2)?;
            let max_blocks =
                megamoe_core::plan::layout::fused_max_blocks(&spec.shape, spec.ranks, t_cap);
            let (n1, n2) = (2 * i / 256, h / 256);
            let trace = if options.trace {
                let tasks = (max_blocks * (n1 + n2)).div_ceil(ctas);
                Some(gpu.alloc_zeroed(ctas * (CTA_TRACE_BYTES + tasks * TASK_TRACE_BYTES))?)
            } else {
                None
            };
            let params = FusedParams {
                l1,
                l2,
                swiglu: SwigluQuant {
                    out: base + off("l2_pool"),
                    out_scales: base + off("l2_pool_scales"),
                    weights: base + off("ring_weights"),
                    rows_ld: ring_rows as u32,
                    inter: i as u32,
                    group: spec.group as u32,
                    has_clamp: spec.clamp.is_some() as u32,
                    clamp: spec.clamp.unwrap_or(0.0),
                    reserved: [0; 5],
                },
                r: FusedRegions {
                    peer_base,
                    off_epochs: off("epochs"),
                    off_signals: off("signals"),
                    off_error: off("error"),
                    off_x: off("x"),
                    off_x_scales: off("x_scales"),
                    off_topk_idx: off("topk_idx"),
                    off_topk_weights: off("topk_weights"),
                    off_counts: off("counts"),
                    off_send_list: off("send_list"),
                    off_l1_pool: off("l1_pool"),
                    off_l1_scales: off("l1_pool_scales"),
                    off_ring_weights: off("ring_weights"),
                    off_row_dest: off("row_dest"),
                    off_plan: off("plan"),
                    off_src_base: off("src_base"),
                    off_blocks: off("blocks"),
                    off_segments: off("segments"),
                    off_block_flags: off("block_flags"),
                    off_expert_l2: off("expert_l2"),
                    off_expert_done: off("expert_done"),
                    off_grid_barrier: off("grid_barrier"),
                    off_combine: off("combine"),
                    y: y.ptr(),
                    wait_record: rank.wait_record(),
                    deadline_ns: deadline_ns(rank.deadline()),
                    pull_ahead: megamoe_core::plan::rules::PULL_AHEAD_BLOCKS as u64,
                    recv_stats: 0,
                    rank: r as i32,
                    ranks: spec.ranks as i32,
                    hidden: h as i32,
                    inter: i as i32,
                    experts: e as i32,
                    topk: k as i32,
                    t_cap: t_cap as i32,
                    tokens: 0,
                    bound: 0,
                    ring_rows: ring_rows as i32,
                    ring_slots: 0,
                    lag_units: 0,
                    n1: n1 as i32,
                    n2: n2 as i32,
                    max_blocks: max_blocks as i32,
                    max_segments: megamoe_core::plan::layout::fused_max_segments(
                        &spec.shape,
                        spec.ranks,
                        t_cap,
                    ) as i32,
                },
            };
            ranks.push(FusedRank {
                stage: Stager::new(&gpu)?,
                quantizer: Quantizer::new(&gpu)?,
                x_bf16: gpu.alloc(spec.max_tokens * h * 2)?,
                kernel,
                gpu,
                params,
                _weights: [w1, s1, w2, s2],
                y,
                trace,
            });
        }
        Ok(FusedLayer {
            expert_counts: vec![vec![0; el]; spec.ranks],
            spec,
            layout,
            world,
            buffers,
            ranks,
            launch,
            broken: false,
            probe: probe.then_some(Probe {
                fault_rank: 0,
                fault: FUSED_NO_FAULT,
                sleep_ns: 0,
            }),
            caller: None,
        })
    }

    /// The forward pass: one input and one bf16 `[T, H]` output per local rank
    /// ([`Self::local_ranks`]: every rank, or this process's one). Every input is checked before
    /// anything is written; a bad one is an error naming the rank and the argument.
    /// `num_tokens_bound`, when given, must be at least every rank's T and at most T_max (the
    /// kernel checks the ranks of other processes, and every rank rejects a mismatch); a
    /// smaller bound runs the call in the order (and ring) of that bound.
    pub fn forward(
        &mut self,
        inputs: &[RankInput],
        num_tokens_bound: Option<usize>,
    ) -> Result<Vec<Vec<bf16>>> {
        let staged = self.run(inputs, num_tokens_bound)?;
        self.outputs(&staged)
    }

    /// [`Self::forward`] up to the outputs, which stay on the device ([`Self::output`]).
    pub(crate) fn run(
        &mut self,
        inputs: &[RankInput],
        num_tokens_bound: Option<usize>,
    ) -> Result<FusedStaged> {
        let staged = self.stage(inputs, num_tokens_bound)?;
        self.launch(&staged)?;
        self.finish()?;
        Ok(staged)
    }

    /// Cumulative rows received per local expert (index: rank, then local expert), over every
    /// staged call of this layer: what load balancers read. A layer of one rank per process
    /// counts the rows its own rank sent.
    pub fn expert_counts(&self) -> &[Vec<u64>] {
        &self.expert_counts
    }

    /// Checks every local rank's input, then uploads them.
    pub fn stage(
        &mut self,
        inputs: &[RankInput],
        num_tokens_bound: Option<usize>,
    ) -> Result<FusedStaged> {
        let tokens = check_call(&self.spec, self.local_ranks(), inputs, num_tokens_bound)?;
        let bound = num_tokens_bound.unwrap_or(self.layout.ring.t_cap);
        self.upload(inputs, tokens, vec![bound; self.ranks.len()])
    }

    /// [`Self::stage`] with one bound per rank and no host check of the bounds: the device
    /// check is what a multi-process world relies on (the selftest's fault checks).
    pub(crate) fn stage_with_bounds(
        &mut self,
        inputs: &[RankInput],
        bounds: &[usize],
    ) -> Result<FusedStaged> {
        let tokens = check_call(&self.spec, self.local_ranks(), inputs, None)?;
        self.upload(inputs, tokens, bounds.to_vec())
    }

    fn upload(
        &mut self,
        inputs: &[RankInput],
        tokens: Vec<usize>,
        bounds: Vec<usize>,
    ) -> Result<FusedStaged> {
        self.check_usable()?;
        let s = &self.spec;
        let (e, el) = (s.shape.experts, s.shape.local_experts(s.ranks));
        // The order of the call, from the first local rank's bound (every rank computes the
        // same from its own).
        let (lag_units, ring_slots) = self.order(bounds[0]);
        let off = |name| region(&self.layout, name) as usize;
        let mut bf16 = Vec::with_capacity(inputs.len());
        for ((r, rank), input) in self.local_ranks().zip(&self.ranks).zip(inputs) {
            let buf = self.buffers.local(r);
            buf.upload_at(off("topk_idx"), input.topk_idx)?;
            buf.upload_at(off("topk_weights"), input.topk_weights)?;
            match input.x {
                Activations::Bf16(x) => {
                    rank.x_bf16.upload(x)?;
                    bf16.push(true);
                }
                Activations::Fp8 { data, scales } => {
                    buf.upload_at(off("x"), data)?;
                    buf.upload_at(off("x_scales"), scales)?;
                    bf16.push(false);
                }
                Activations::Device(x) => {
                    let places = [(&rank.x_bf16, 0), (buf, off("x")), (buf, off("x_scales"))];
                    bf16.push(x.copy_into(&rank.gpu, places, s.shape.hidden)?);
                }
            }
        }
        for input in inputs {
            for &ex in input.topk_idx.iter().filter(|&&ex| ex >= 0) {
                let ex = ex as usize;
                self.expert_counts[ex / el][ex % el] += 1;
            }
        }
        debug_assert_eq!(self.expert_counts.len() * el, e);
        Ok(FusedStaged {
            tokens,
            bounds,
            bf16,
            lag_units,
            ring_slots,
        })
    }

    /// The order of a call of bound `bound`: (lag units, 0 for a single wave; ring slots).
    fn order(&self, bound: usize) -> (usize, usize) {
        let s = &self.spec;
        let ring = self.layout.ring;
        let order = call_order(&s.shape, s.ranks, &ring, bound.min(ring.t_cap).max(1), 128);
        let lag_units = match order.order {
            Order::SingleWave => 0,
            Order::Lagged { lag_units } => lag_units,
        };
        (lag_units, order.ring_slots)
    }

    fn check_usable(&self) -> Result<()> {
        if self.broken {
            return Err(Error::Value {
                arg: "layer",
                value: "broken".into(),
                reason: "a device wait of an earlier call expired; build a new layer".into(),
            }
            .into());
        }
        Ok(())
    }

    /// Queues a staged call on every local rank's stream (no host synchronization; errors of the
    /// device side are reported by [`Self::finish`]).
    pub fn launch(&mut self, staged: &FusedStaged) -> Result<()> {
        self.launch_ranks(staged, &vec![true; self.ranks.len()])
    }

    /// [`Self::launch`] on the local ranks marked in `ranks` only: the others never arrive (the
    /// selftest's fault check of a rank that stops).
    pub(crate) fn launch_ranks(&mut self, staged: &FusedStaged, ranks: &[bool]) -> Result<()> {
        self.check_usable()?;
        let (h, x, xs) = (
            self.spec.shape.hidden,
            region(&self.layout, "x") as usize,
            region(&self.layout, "x_scales") as usize,
        );
        for (i, (r, rank)) in self.local_ranks().zip(&self.ranks).enumerate() {
            if staged.bf16[i] && ranks[i] {
                let buf = self.buffers.local(r);
                rank.quantizer.launch_at(
                    &rank.gpu,
                    &rank.x_bf16,
                    (buf, x),
                    (buf, xs),
                    staged.tokens[i],
                    h,
                )?;
            }
        }
        for (i, rank) in self.ranks.iter().enumerate().filter(|(i, _)| ranks[*i]) {
            let mut p = rank.params;
            p.r.tokens = staged.tokens[i] as i32;
            p.r.bound = staged.bounds[i].min(i32::MAX as usize) as i32;
            p.r.lag_units = staged.lag_units as i32;
            p.r.ring_slots = staged.ring_slots as i32;
            self.launch_kernel(&rank.gpu, rank, p)?;
        }
        Ok(())
    }

    /// Queues rank `rank`'s fused kernel with `p` on `gpu`'s stream (the probe instantiation's
    /// when it runs).
    fn launch_kernel(&self, gpu: &Gpu, rank: &FusedRank, p: FusedParams) -> Result<()> {
        match self.probe {
            None => gpu.launch(&rank.kernel, &self.launch, &p)?,
            Some(probe) => {
                let probed = FusedProbeParams {
                    fused: p,
                    trace: rank.trace.as_ref().map_or(0, |t| t.ptr()),
                    fault_rank: probe.fault_rank,
                    fault: probe.fault,
                    sleep_ns: probe.sleep_ns,
                };
                gpu.launch(&rank.kernel, &self.launch, &probed)?
            }
        }
        Ok(())
    }

    /// Queues one call of every local rank after the caller's streams, with no host
    /// synchronization and no read of the tensors' values (a CUDA graph may capture it):
    /// `tensors[i]` and `streams[i]` are local rank i's, as [`crate::MoeLayer::forward_device`] takes
    /// them; each rank's output is written to its `y` directly, and `streams[i]` waits for it.
    /// A layer of one local rank queues the work on `streams[0]` itself; ranks sharing a process
    /// run on their own streams (they wait on each other), joined to the callers' with an event
    /// each way.
    /// The host checks the shapes and the bound (every T at most the bound, the bound at most
    /// T_max) and reports a routing fault the device recorded in an earlier call (a `topk_idx`
    /// or `topk_weights` error naming the rank; the call then queues nothing). The device
    /// checks the values: a token with an expert id outside [-1, E), an expert twice, or a
    /// routed slot's weight not finite gets a zero output row and is recorded (the first such
    /// slot, reported by the next call or by [`Self::check`]); every other token's output is
    /// that of a clean call. Bounds that differ between ranks and expired waits are reported
    /// by [`Self::check`]. The host-side [`Self::expert_counts`] do not count these calls
    /// (`recv_stats` counts on the device).
    ///
    /// # Safety
    /// That of [`crate::MoeLayer::forward_device`], and the addresses stay valid until the calls
    /// queued here have run (the caller's stream has passed them).
    pub unsafe fn launch_device(
        &mut self,
        tensors: &[DeviceRankTensors],
        num_tokens_bound: Option<usize>,
        streams: &[u64],
    ) -> Result<()> {
        self.check_usable()?;
        let local = self.local_ranks();
        check_lengths(local.len(), tensors.len(), streams.len())?;
        self.take_route_faults()?;
        let s = self.spec;
        let (h, k) = (s.shape.hidden, s.shape.topk);
        let mut tokens = Vec::with_capacity(tensors.len());
        for (r, t) in local.clone().zip(tensors) {
            let got = t.x.tokens();
            if got > s.max_tokens {
                let e = Error::Capacity {
                    arg: "x",
                    got,
                    capacity: s.max_tokens,
                };
                return Err(LayerError::input(r, e));
            }
            tokens.push(got);
        }
        check_bound(&s, &tokens, num_tokens_bound)?;
        let bound = num_tokens_bound.unwrap_or(self.layout.ring.t_cap);
        let (lag_units, ring_slots) = self.order(bound);
        // The input regions' offsets, as every rank's kernel parameters hold them.
        let r0 = &self.ranks[0].params.r;
        let (x, xs, ids, weights) = (
            r0.off_x,
            r0.off_x_scales,
            r0.off_topk_idx,
            r0.off_topk_weights,
        );
        let single = self.ranks.len() == 1;
        if single && self.caller.as_ref().map(|c| c.0) != Some(streams[0]) {
            // SAFETY: the caller's contract: a live stream of the rank's device's primary
            // context, alive while calls are queued on it.
            self.caller = Some((streams[0], unsafe {
                self.ranks[0].gpu.on_stream(streams[0])
            }));
        }
        for (((r, rank), t), &stream) in local.zip(&self.ranks).zip(tensors).zip(streams) {
            let gpu = match &self.caller {
                Some((_, caller)) if single => caller,
                _ => {
                    rank.gpu.wait_for(stream)?;
                    &rank.gpu
                }
            };
            let (buf, base) = (self.buffers.local(r), self.buffers.ptr(r));
            let tokens = t.x.tokens();
            // e4m3 rows are copied by the staging kernel; bf16 rows are quantized into place.
            let (rows, scales) = t.x.fp8().unwrap_or((0, 0));
            if rows == 0 {
                let places = [(&rank.x_bf16, 0), (buf, x as usize), (buf, xs as usize)];
                t.x.copy_into(gpu, places, h)?;
                let (x, xs) = ((buf, x as usize), (buf, xs as usize));
                rank.quantizer
                    .launch_at(gpu, &rank.x_bf16, x, xs, tokens, h)?;
            }
            if tokens > 0 {
                let stage = StageParams {
                    topk_idx: t.topk_idx,
                    topk_weights: t.topk_weights,
                    out_idx: base + ids,
                    out_weights: base + weights,
                    fault: 0,
                    x: rows,
                    x_scales: scales,
                    out_x: base + x,
                    out_x_scales: base + xs,
                    x_bytes: if rows == 0 { 0 } else { (tokens * h) as u64 },
                    tokens: tokens as i32,
                    topk: k as i32,
                    experts: s.shape.experts as i32,
                    idx64: (t.topk_idx_type == IndexType::I64) as i32,
                };
                rank.stage.launch(gpu, stage)?;
            }
            let mut p = rank.params;
            p.r.tokens = tokens as i32;
            p.r.bound = bound as i32;
            p.r.lag_units = lag_units as i32;
            p.r.ring_slots = ring_slots as i32;
            p.r.y = t.y;
            p.r.recv_stats = t.recv_stats.unwrap_or(0);
            self.launch_kernel(gpu, rank, p)?;
            if !single {
                gpu.release_to(stream)?;
            }
        }
        Ok(())
    }

    /// Reports (and clears) the routing faults the device recorded for the local ranks: the
    /// first as a `topk_idx` or `topk_weights` error naming its rank.
    fn take_route_faults(&self) -> Result<()> {
        let mut first = None;
        for (r, rank) in self.local_ranks().zip(&self.ranks) {
            if let Some(fault) = rank.stage.take() {
                first.get_or_insert((r, fault));
            }
        }
        match first {
            None => Ok(()),
            Some((rank, fault)) => Err(LayerError::OnDevice {
                rank,
                source: fault.to_error(self.spec.shape.experts),
            }),
        }
    }

    /// Waits for the local ranks' devices (every stream: calls queued on the callers' streams
    /// and graph replays included) and reports the first failure since the last check or
    /// finish: a device wait past its deadline, a call every rank rejected, then a routing
    /// fault of a call from [`Self::launch_device`] (see [`Self::finish`]).
    pub fn check(&mut self) -> Result<()> {
        // The calls ran on the callers' streams, or as graph replays on any stream.
        for rank in &self.ranks {
            rank.gpu.synchronize_device()?;
        }
        self.finish()?;
        self.take_route_faults()
    }

    /// Waits for every local rank and reports the first failure of the calls since the last finish:
    /// a device wait past its deadline (naming the rank and the wait; the layer must then be
    /// rebuilt) or a call every rank rejected (a bound mismatch; the layer stays usable).
    pub fn finish(&mut self) -> Result<()> {
        for rank in &self.ranks {
            rank.gpu.synchronize()?;
        }
        for rank in self.world.ranks() {
            if let Err(e) = rank.check_waits(&ALL_WAITS) {
                self.broken = true;
                return Err(e.into());
            }
        }
        let off = region(&self.layout, "error") as usize;
        let mut first = None;
        let mut rejected = 0;
        for r in self.local_ranks() {
            let mut rec = [ErrorRecord::default()];
            let buf = self.buffers.local(r);
            buf.download_into(off, &mut rec)?;
            if rec[0].code != 0 {
                buf.upload_at(off, &[ErrorRecord::default()])?;
                first.get_or_insert((r, rec[0]));
                rejected += 1;
            }
        }
        let Some((rank, rec)) = first else {
            return Ok(());
        };
        let rejected = format!("{rejected} of {} ranks rejected the call", self.ranks.len());
        Err(match rec.code {
            FUSED_BAD_BOUND => LayerError::OnDevice {
                rank,
                source: Error::Value {
                    arg: "num_tokens_bound",
                    value: rec.expected.to_string(),
                    reason: format!(
                        "rank {} published {} (its bound, or its T above it); bounds must be \
                         equal on every rank, at least every rank's T and at most T_max; no \
                         rank ran the call ({rejected})",
                        rec.peer, rec.seen
                    ),
                },
            },
            _ => LayerError::Rejected {
                rank,
                reason: format!("{} ({rejected})", describe(rec)),
            },
        })
    }

    /// Every local rank's expired wait, if any (after a failed [`Self::finish`]).
    pub(crate) fn expired_waits(&self) -> Result<Vec<Option<megamoe_cuda::Error>>> {
        let mut out = Vec::new();
        for rank in self.world.ranks() {
            out.push(match rank.check_waits(&ALL_WAITS) {
                Ok(()) => None,
                Err(e @ megamoe_cuda::Error::WaitTimeout { .. }) => Some(e),
                Err(e) => return Err(e.into()),
            });
        }
        Ok(out)
    }

    /// The GPU handle of local rank `rank` (its stream, its timers).
    pub fn gpu(&self, rank: usize) -> &Gpu {
        &self.local(rank).gpu
    }

    /// The ranks this process holds: every rank, or one ([`Self::for_rank`]).
    pub fn local_ranks(&self) -> std::ops::Range<usize> {
        self.world.local_ranks()
    }

    fn local(&self, rank: usize) -> &FusedRank {
        &self.ranks[rank - self.local_ranks().start]
    }

    /// CTAs of each rank's launch.
    pub fn ctas(&self) -> u32 {
        self.launch.grid.0
    }

    /// Downloads the outputs of the last finished call, one per local rank.
    pub fn outputs(&self, staged: &FusedStaged) -> Result<Vec<Vec<bf16>>> {
        download_outputs(&staged.tokens, self.spec.shape.hidden, |i| {
            (&self.ranks[i].y, 0)
        })
    }

    /// Where local rank `rank`'s output of the last finished call is: bf16 `[T, H]` from a
    /// byte offset of a buffer.
    pub(crate) fn output(&self, rank: usize) -> (&DeviceBuffer, usize) {
        (&self.local(rank).y, 0)
    }

    /// Every local rank's staged inputs as bytes: the input rows and scales, the routing, the bf16
    /// staging (the selftest's "nothing written before validation" check).
    pub(crate) fn input_bytes(&self) -> Result<Vec<u8>> {
        let off = |name| region(&self.layout, name) as usize;
        let mut out = Vec::new();
        for (r, rank) in self.local_ranks().zip(&self.ranks) {
            let buf = self.buffers.local(r);
            let places = [
                (buf, off("x")),
                (buf, off("x_scales")),
                (buf, off("topk_idx")),
                (buf, off("topk_weights")),
                (&rank.x_bf16, 0),
            ];
            append_staged(&self.spec, places, &mut out)?;
        }
        Ok(out)
    }

    /// Rank `rank`'s plan of the last finished call: m-blocks, stream segments, tasks, status.
    pub(crate) fn plan_header(&self, rank: usize) -> Result<[u32; 4]> {
        let mut h = [0u32; 4];
        self.buffers
            .local(rank)
            .download_into(region(&self.layout, "plan") as usize, &mut h)?;
        Ok(h)
    }

    /// Rank `rank`'s plan of the last finished call as its kernel built it, in megamoe-core's
    /// terms: the stream params of `staged`'s order and ring, each m-block's (local expert, first
    /// row, rows), and the task stream the segments expand to. What `Stream::build` gives for
    /// the same rows (the selftest compares them).
    pub(crate) fn device_stream(
        &self,
        rank: usize,
        staged: &FusedStaged,
    ) -> Result<(StreamParams, Vec<[u32; 3]>, Vec<Task>)> {
        let [n_blocks, n_segments, _, _] = self.plan_header(rank)?;
        let buf = self.buffers.local(rank);
        let mut blocks = vec![0u32; 4 * n_blocks as usize];
        buf.download_into(region(&self.layout, "blocks") as usize, &mut blocks)?;
        let mut segments = vec![0u32; 4 * n_segments as usize];
        buf.download_into(region(&self.layout, "segments") as usize, &mut segments)?;
        let r = &self.local(rank).params.r;
        let (n1, n2) = (r.n1 as u32, r.n2 as u32);
        let mut tasks = Vec::new();
        for seg in segments.chunks_exact(4) {
            let (kind, n_tiles) = match seg[0] {
                0 => (TaskKind::L1, n1),
                _ => (TaskKind::L2, n2),
            };
            for n in 0..n_tiles {
                tasks.extend((seg[1]..seg[1] + seg[2]).map(|block| Task { kind, block, n }));
            }
        }
        let order = match staged.lag_units() {
            Some(lag_units) => Order::Lagged { lag_units },
            None => Order::SingleWave,
        };
        let params = StreamParams::fused(
            order,
            SLOT_ROWS,
            n1 as usize,
            n2 as usize,
            staged.ring_slots,
        );
        let blocks = blocks.chunks_exact(4).map(|b| [b[0], b[1], b[2]]).collect();
        Ok((params, blocks, tasks))
    }

    /// Where rank `rank`'s last finished call spent its time (a layer built with
    /// [`FusedOptions::trace`]).
    pub fn trace_report(&self, rank: usize) -> Result<TraceReport> {
        let Some(buf) = &self.local(rank).trace else {
            return Err(Error::Value {
                arg: "trace",
                value: "off".into(),
                reason: "the layer was built without FusedOptions::trace".into(),
            }
            .into());
        };
        let words = buf.download::<u64>()?;
        let ctas = self.ctas() as usize;
        let per_cta = (words.len() - ctas * CTA_TRACE_BYTES / 8) / ctas / (TASK_TRACE_BYTES / 8);
        Ok(trace_report(&words, ctas, per_cta))
    }

    /// Records one staged call (quantizer and kernel) on every local rank's stream as a CUDA
    /// graph per rank. A replay runs the call on whatever inputs were staged since, which must have
    /// the same T per rank and the same bound as `staged`.
    pub fn capture(&mut self, staged: &FusedStaged) -> Result<FusedGraph> {
        self.check_usable()?;
        let mut graphs = Vec::with_capacity(self.ranks.len());
        for rank in &self.ranks {
            rank.gpu.begin_capture()?;
        }
        let launched = self.launch(staged);
        for rank in &self.ranks {
            match rank.gpu.end_capture() {
                Ok(g) => graphs.push(g),
                Err(e) if launched.is_ok() => return Err(e.into()),
                Err(_) => {}
            }
        }
        launched?;
        Ok(FusedGraph {
            graphs,
            staged: staged.clone(),
        })
    }

    /// Replays `graph` on every local rank's stream (checked afterwards by [`Self::finish`]).
    pub fn replay(&mut self, graph: &FusedGraph, staged: &FusedStaged) -> Result<()> {
        self.check_usable()?;
        if staged.tokens != graph.staged.tokens || staged.bounds != graph.staged.bounds {
            return Err(Error::Value {
                arg: "staged",
                value: format!("T {:?}", staged.tokens),
                reason: format!(
                    "the graph was captured for T {:?} and bounds {:?}",
                    graph.staged.tokens, graph.staged.bounds
                ),
            }
            .into());
        }
        for (rank, g) in self.ranks.iter().zip(&graph.graphs) {
            rank.gpu.launch_graph(g)?;
        }
        Ok(())
    }
}

/// One captured call per rank (see [`FusedLayer::capture`]).
pub struct FusedGraph {
    graphs: Vec<megamoe_cuda::Graph>,
    staged: FusedStaged,
}

/// The report of one timeline: `words` = [ctas] CtaTrace (6 times, then the tokens combined
/// early) then [ctas][per_cta] TaskTrace, as u64 (a TaskTrace's last word holds kind and block;
/// slots never written are zero).
fn trace_report(words: &[u64], ctas: usize, per_cta: usize) -> TraceReport {
    const CTA_WORDS: usize = CTA_TRACE_BYTES / 8;
    let cta = |c: usize| &words[c * CTA_WORDS..(c + 1) * CTA_WORDS];
    let us = |a: u64, b: u64| b.saturating_sub(a) as f64 * 1e-3;
    let mut phases = [const { Vec::new() }; 5];
    let mut report = TraceReport::default();
    for c in 0..ctas {
        let t = cta(c);
        for (p, v) in phases.iter_mut().enumerate() {
            v.push(us(t[p], t[p + 1]));
        }
        report.combined_early += t[6];
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    for (p, v) in phases.iter_mut().enumerate() {
        report.phases_us[p] = median(v);
    }
    let tasks = &words[ctas * CTA_WORDS..];
    let (mut mainloop_total, mut busy_total) = (0.0, 0.0);
    let mut mainloops = [Vec::new(), Vec::new()];
    for c in 0..ctas {
        busy_total += 2.0 * us(cta(c)[2], cta(c)[3]);
        let mut prev_end = [cta(c)[2]; 2];
        for j in 0..per_cta {
            let t = &tasks[(c * per_cta + j) * 10..][..10];
            if t[3] == 0 {
                break; // this CTA had no more tasks
            }
            let kind = ((t[9] & 0xffff_ffff) as usize).min(1);
            let k = &mut report.kinds[kind];
            k.tasks += 1;
            k.producer_wait_us += us(t[0], t[1]);
            for (wg, end) in prev_end.iter_mut().enumerate() {
                let w = &t[3 + 3 * wg..][..3];
                k.gap_us += us(*end, w[0]) / 2.0;
                k.mainloop_us += us(w[0], w[1]) / 2.0;
                mainloops[kind].push(us(w[0], w[1]));
                k.epilogue_us += us(w[1], w[2]) / 2.0;
                mainloop_total += us(w[0], w[1]);
                *end = w[2];
            }
        }
    }
    for (k, m) in report.kinds.iter_mut().zip(&mut mainloops) {
        k.mainloop_median_us = median(m);
        let n = k.tasks.max(1) as f64;
        k.producer_wait_us /= n;
        k.gap_us /= n;
        k.mainloop_us /= n;
        k.epilogue_us /= n;
    }
    report.mainloop_share = mainloop_total / busy_total.max(1e-9);
    report
}

/// What a rejected call's error record means.
fn describe(rec: ErrorRecord) -> String {
    match rec.code {
        FUSED_RING_OVERFLOW => format!(
            "the call's {} m-blocks do not fit its single-wave ring of {} slots",
            rec.seen, rec.expected
        ),
        code => format!("error code {code}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::tests::Unreachable;

    #[test]
    fn a_rank_outside_the_world_is_rejected_before_any_exchange() {
        let shape = megamoe_core::Preset::by_name("tiny").unwrap().shape;
        let spec = LayerSpec::new(shape, 2, 64);
        let no_weights = |_| unreachable!("no weights are read for a rejected rank");
        let err = FusedLayer::for_rank(
            spec,
            no_weights,
            FusedOptions::default(),
            2,
            0,
            Box::new(Unreachable),
        )
        .err()
        .expect("rank 2 of 2 is rejected")
        .to_string();
        assert!(
            err.contains("`rank`: 2 is not below the world size 2"),
            "{err}"
        );
    }

    #[test]
    fn a_fused_layer_can_move_to_another_thread() {
        fn send<T: Send>() {}
        send::<FusedLayer>();
    }

    #[test]
    fn a_timeline_reads_as_phases_and_per_kind_means() {
        // Two CTAs, two task slots each; CTA 1 ran one task. Times in ns.
        // Each CTA: 6 phase times, then the tokens it combined early.
        let (ctas, per_cta) = (2, 2);
        let mut w = vec![0u64; ctas * 7 + ctas * per_cta * 10];
        w[..7].copy_from_slice(&[0, 1_000, 3_000, 103_000, 104_000, 110_000, 0]);
        w[7..14].copy_from_slice(&[0, 1_000, 3_000, 53_000, 104_000, 110_000, 5]);
        let task = |wait: [u64; 3], wg0: [u64; 3], wg1: [u64; 3], kind: u64| {
            let mut t = vec![wait[0], wait[1], wait[2]];
            t.extend(wg0);
            t.extend(wg1);
            t.push(kind | 7 << 32);
            t
        };
        let base = ctas * 7;
        // CTA 0: an L1 task (40 µs mainloop, 5 µs epilogue), then an L2 task after a 2 µs gap.
        w[base..base + 10].copy_from_slice(&task(
            [3_000, 4_000, 4_500],
            [3_000, 43_000, 48_000],
            [3_000, 43_000, 48_000],
            0,
        ));
        w[base + 10..base + 20].copy_from_slice(&task(
            [44_000, 46_000, 47_000],
            [50_000, 98_000, 103_000],
            [50_000, 98_000, 103_000],
            1,
        ));
        // CTA 1: one L1 task.
        w[base + 20..base + 30].copy_from_slice(&task(
            [3_000, 3_000, 3_500],
            [3_000, 43_000, 53_000],
            [3_000, 43_000, 53_000],
            0,
        ));
        let r = trace_report(&w, ctas, per_cta);
        assert_eq!(r.phases_us[0], 1.0);
        assert_eq!(r.phases_us[1], 2.0);
        assert_eq!(r.phases_us[2], 100.0); // median of 100 and 50
        assert_eq!(r.phases_us[3], 51.0); // median of 1 and 51
        assert_eq!(r.combined_early, 5);
        assert_eq!((r.kinds[0].tasks, r.kinds[1].tasks), (2, 1));
        assert_eq!(r.kinds[0].producer_wait_us, 0.5);
        assert_eq!(r.kinds[0].mainloop_us, 40.0);
        assert_eq!(r.kinds[0].epilogue_us, 7.5);
        assert_eq!(r.kinds[1].gap_us, 2.0);
        assert_eq!(r.kinds[1].mainloop_us, 48.0);
        assert_eq!(
            (r.kinds[0].mainloop_median_us, r.kinds[1].mainloop_median_us),
            (40.0, 48.0)
        );
        // (2·40 + 2·48 + 2·40) / (2·100 + 2·50)
        assert!((r.mainloop_share - 256.0 / 300.0).abs() < 1e-12);
    }

    #[test]
    fn every_wait_id_has_a_name() {
        for id in 0x300..=0x307 {
            assert!(WAITS.name(id).is_some(), "{id:#x}");
        }
        for id in 0x200..0x202 {
            assert!(SIGNAL_WAITS.name(id).is_some(), "{id:#x}");
        }
    }
}
