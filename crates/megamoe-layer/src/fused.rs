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
use megamoe_core::plan::buffer::MAX_RANKS;
use megamoe_core::plan::layout::FusedOffsets;
use megamoe_core::plan::rules::{call_order, Order, SLOT_ROWS};
use megamoe_core::plan::SymmetricLayout;
use megamoe_core::weights::RankWeightsFp8;
use megamoe_core::Error;
use megamoe_cuda::wait::{deadline_ns, DEFAULT_DEADLINE};
use megamoe_cuda::{
    jit, AllGather, DeviceBuffer, Gpu, Kernel as CudaKernel, LaunchConfig, Quantizer, Rank,
    SymmetricBuffer, WaitNames, World,
};
use megamoe_ep::params::ErrorRecord;
use megamoe_gemm::grouped::MainloopOperands;
use megamoe_gemm::kernel::THREADS;

use crate::call::{
    check_call, check_device_tokens, check_lengths, download_outputs, Activations,
    DeviceRankTensors, IndexType, RankInput,
};
use crate::error::{LayerError, Result};
use crate::kernel::{
    comm_sms, fused_smem_bytes, fused_spec, FusedParams, FusedProbe, FusedProbeParams,
    FusedRegions, SwigluQuant, FUSED_BAD_BOUND, FUSED_BLOCK_N, FUSED_NO_FAULT, FUSED_RING_OVERFLOW,
    FUSED_WAITS,
};
use crate::spec::LayerSpec;
use crate::stage::{StageParams, Stager};
use crate::weights::{self, DeviceWeights};

#[cfg(feature = "harness")]
mod inspect;
mod probe;
mod trace;

#[cfg(feature = "harness")]
pub(crate) use probe::Fault;
use probe::Probe;
pub use trace::{KindTrace, TraceReport};
use trace::{CTA_TRACE_BYTES, TASK_TRACE_BYTES};

/// The fused kernel's signal kinds (device: `FusedSignal`), numbered like megamoe-ep's waits.
const SIGNAL_WAITS: WaitNames = WaitNames {
    first: 0x200,
    names: &[
        "every rank's routing published",
        "every rank's L2 rows written back",
    ],
};

/// Every wait the fused kernel may record: its own, its signals', the GEMM mainloop's.
const ALL_WAITS: [&WaitNames; 3] = [&FUSED_WAITS, &SIGNAL_WAITS, &megamoe_gemm::grouped::WAITS];

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
    _weights: DeviceWeights,
    x_bf16: DeviceBuffer,
    y: DeviceBuffer,
    quantizer: Quantizer,
    /// The traced kernel's timeline (impls/fused_trace.cuh), when the layer records one.
    trace: Option<DeviceBuffer>,
    /// The staging of calls the host does not read ([`FusedLayer::launch_device`]).
    stage: Stager,
}

impl FusedRank {
    /// Rank `rank`'s weights, output, staging and parameters over `regions`; `trace_ctas`: a
    /// timeline for launches of that many CTAs.
    fn new(
        spec: &LayerSpec,
        weights: impl Fn(usize) -> megamoe_core::Result<RankWeightsFp8>,
        rank: &Rank,
        kernel: Arc<CudaKernel>,
        regions: FusedRegions,
        offsets: &FusedOffsets,
        trace_ctas: Option<usize>,
    ) -> Result<FusedRank> {
        let gpu = rank.gpu.clone();
        let el = spec.shape.local_experts(spec.ranks);
        let weights = weights::upload(&gpu, rank.rank, weights, &spec.shape, el)?;
        let hidden = spec.shape.hidden;
        let y = gpu.alloc_zeroed(regions.t_cap as usize * hidden * 2)?;
        let trace = match trace_ctas {
            Some(ctas) => Some(gpu.alloc_zeroed(trace_bytes(&regions, ctas))?),
            None => None,
        };
        Ok(FusedRank {
            params: fused_params(spec, rank, regions, offsets, &weights, y.ptr())?,
            stage: Stager::new(&gpu)?,
            quantizer: Quantizer::new(&gpu)?,
            x_bf16: gpu.alloc(spec.max_tokens * hidden * 2)?,
            kernel,
            gpu,
            _weights: weights,
            y,
            trace,
        })
    }
}

/// Rank `rank`'s parameters: both GEMMs' mainloops over the ring's pools and the rank's
/// weights, the SwiGLU epilogue into the L2 pool, and `regions` with the rank's own fields
/// (its output `y`, its wait record, which every wait of the kernel shares).
fn fused_params(
    spec: &LayerSpec,
    rank: &Rank,
    regions: FusedRegions,
    off: &FusedOffsets,
    w: &DeviceWeights,
    y: u64,
) -> Result<FusedParams> {
    let base = regions.peer_base[rank.rank];
    let (h, i) = (spec.shape.hidden, spec.shape.inter);
    let rows = regions.ring_rows as usize;
    let (record, timeout_ns) = (rank.wait_record(), deadline_ns(rank.deadline()));
    let mainloop = |a, scale_a, b: &DeviceBuffer, scale_b: &DeviceBuffer, n, k, group| {
        let operands = MainloopOperands {
            a: base + a,
            rows,
            scale_a: base + scale_a,
            scale_a_dims: [rows, k / group],
            b: b.ptr(),
            scale_b: scale_b.ptr(),
            experts: spec.shape.local_experts(spec.ranks),
            n,
            k,
            group,
        };
        operands.params([SLOT_ROWS, FUSED_BLOCK_N], record, timeout_ns)
    };
    let (l2_pool, l2_scales) = (base + off.l2_pool, base + off.l2_pool_scales);
    Ok(FusedParams {
        l1: mainloop(off.l1_pool, off.l1_pool_scales, &w.w1, &w.s1, 2 * i, h, 128)?,
        l2: mainloop(
            off.l2_pool,
            off.l2_pool_scales,
            &w.w2,
            &w.s2,
            h,
            i,
            spec.group,
        )?,
        swiglu: SwigluQuant::new(spec, l2_pool, l2_scales, base + off.ring_weights, rows),
        r: FusedRegions {
            y,
            wait_record: record,
            deadline_ns: timeout_ns,
            rank: rank.rank as i32,
            ..regions
        },
    })
}

/// Bytes of the timeline of a launch of `ctas` CTAs: a [`CtaTrace`] per CTA, then per CTA
/// [`TaskTrace`] slots for twice its even share of the largest call's tasks, as CTAs claim
/// their tasks (impls/fused_trace.cuh).
fn trace_bytes(regions: &FusedRegions, ctas: usize) -> usize {
    let tasks =
        2 * (regions.max_blocks as usize * (regions.n1 + regions.n2) as usize).div_ceil(ctas);
    ctas * (CTA_TRACE_BYTES + tasks * TASK_TRACE_BYTES)
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

/// The fused MoE layer on a world of real or virtual ranks.
pub struct FusedLayer {
    pub spec: LayerSpec,
    pub layout: SymmetricLayout,
    /// The regions of `layout`.
    offsets: FusedOffsets,
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

    /// `probe`: load the probe instantiation (with [`FusedOptions::trace`] or an injected fault).
    fn build(
        spec: LayerSpec,
        weights: impl Fn(usize) -> megamoe_core::Result<RankWeightsFp8>,
        options: FusedOptions,
        layout: SymmetricLayout,
        probe: bool,
        world: World,
    ) -> Result<FusedLayer> {
        let sms = world.ranks()[0].gpu.props().sm_count as usize;
        let ctas = comm_sms(options.ctas, world.ranks().len(), world.gpu_count(), sms);
        // A programmatic dependent launch: the kernel's set-up runs while the previous kernel on
        // the stream (the quantizer, or the last call) finishes; it waits for it before reading.
        let launch = LaunchConfig::new(ctas as u32, THREADS)
            .with_dynamic_smem(fused_smem_bytes(spec.group) as u32)
            .with_pdl(true);
        let compiled = jit::compile(&fused_spec(spec.group, spec.accumulation, probe))?;
        let kernels = world.load(&compiled)?;
        let buffers = world.alloc_symmetric(layout.total_bytes as usize)?;
        let offsets = layout.fused.expect("a fused layout has the fused regions");
        let mut peer_base = [0u64; MAX_RANKS];
        for (r, p) in peer_base.iter_mut().enumerate().take(spec.ranks) {
            *p = buffers.ptr(r);
        }
        let regions = FusedRegions::new(&spec, &layout, &offsets, peer_base);
        let trace_ctas = options.trace.then_some(ctas);
        let ranks = world
            .local_ranks()
            .zip(kernels)
            .map(|(r, kernel)| {
                let rank = world.rank(r);
                FusedRank::new(&spec, &weights, rank, kernel, regions, &offsets, trace_ctas)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(FusedLayer {
            expert_counts: vec![vec![0; spec.shape.local_experts(spec.ranks)]; spec.ranks],
            spec,
            layout,
            offsets,
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
        let off = &self.offsets;
        let mut bf16 = Vec::with_capacity(inputs.len());
        for ((r, rank), input) in self.local_ranks().zip(&self.ranks).zip(inputs) {
            let buf = self.buffers.local(r);
            buf.upload_at(off.topk_idx as usize, input.topk_idx)?;
            buf.upload_at(off.topk_weights as usize, input.topk_weights)?;
            match input.x {
                Activations::Bf16(x) => {
                    rank.x_bf16.upload(x)?;
                    bf16.push(true);
                }
                Activations::Fp8 { data, scales } => {
                    buf.upload_at(off.x as usize, data)?;
                    buf.upload_at(off.x_scales as usize, scales)?;
                    bf16.push(false);
                }
                Activations::Device(x) => {
                    let (x_off, scales_off) = (off.x as usize, off.x_scales as usize);
                    let places = [(&rank.x_bf16, 0), (buf, x_off), (buf, scales_off)];
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
            self.offsets.x as usize,
            self.offsets.x_scales as usize,
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
            p.r.set_call(
                &self.spec.shape,
                staged.tokens[i],
                staged.bounds[i],
                staged.lag_units,
                staged.ring_slots,
            );
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
                    probe: FusedProbe {
                        trace: rank.trace.as_ref().map_or(0, |t| t.ptr()),
                        fault_rank: probe.fault_rank,
                        fault: probe.fault,
                        sleep_ns: probe.sleep_ns,
                    },
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
        check_device_tokens(&self.spec, local.clone(), tensors, num_tokens_bound)?;
        let bound = num_tokens_bound.unwrap_or(self.layout.ring.t_cap);
        let (lag_units, ring_slots) = self.order(bound);
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
            self.stage_device(gpu, r, rank, t)?;
            let mut p = rank.params;
            p.r.set_call(&self.spec.shape, t.x.tokens(), bound, lag_units, ring_slots);
            p.r.y = t.y;
            p.r.recv_stats = t.recv_stats.unwrap_or(0);
            self.launch_kernel(gpu, rank, p)?;
            if !single {
                gpu.release_to(stream)?;
            }
        }
        Ok(())
    }

    /// Queues on `gpu`'s stream the staging of local rank `r`'s device tensors `t` into its
    /// input regions: bf16 rows copied and quantized into place, e4m3 rows and the routing
    /// copied (and the routing's values checked) by the staging kernel.
    fn stage_device(
        &self,
        gpu: &Gpu,
        r: usize,
        rank: &FusedRank,
        t: &DeviceRankTensors,
    ) -> Result<()> {
        let (h, k) = (self.spec.shape.hidden, self.spec.shape.topk);
        // The input regions' offsets, as the rank's kernel parameters hold them.
        let p = &rank.params.r;
        let (x, xs, ids, weights) = (p.off_x, p.off_x_scales, p.off_topk_idx, p.off_topk_weights);
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
                experts: self.spec.shape.experts as i32,
                idx64: (t.topk_idx_type == IndexType::I64) as i32,
            };
            rank.stage.launch(gpu, stage)?;
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
        let off = self.offsets.error as usize;
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
    fn every_wait_id_has_a_name() {
        for id in 0x300..=0x307 {
            assert!(FUSED_WAITS.name(id).is_some(), "{id:#x}");
        }
        for id in 0x200..0x202 {
            assert!(SIGNAL_WAITS.name(id).is_some(), "{id:#x}");
        }
    }
}
