//! The split layer (SPEC §4): per call and per rank, on the rank's stream,
//!
//! 1. bf16 input only: the library's quantizer writes e4m3 rows and per-128 scales into the
//!    rank's symmetric input region (FP8 input is uploaded there as it is);
//! 2. dispatch (megamoe-ep): every rank pulls the tokens routed to its experts into the pool,
//!    grouped by local expert, segments padded to 128 rows, scales group-major, each row's
//!    routing weight beside it;
//! 3. L1 (src/kernel.rs): pool · W1ᵀ, SwiGLU, weight, re-quantization per G into the local
//!    intermediate;
//! 4. L2: intermediate · W2ᵀ, bf16 rows into the pool's positions of the symmetric L2 output;
//! 5. combine (megamoe-ep): every rank pulls its tokens' rows and sums them in ascending slot
//!    order in f32, one rounding (SPEC §3 step 5).
//!
//! Only dispatch and combine wait on other ranks, each wait with a deadline. Ranks on one GPU
//! (virtual ranks) share its SMs: dispatch and combine are launched on at most
//! `SMs / ranks on the GPU` blocks per rank, so every rank's blocks of a call fit on the GPU
//! at once and no rank's waiting blocks can keep another rank's from running; the GEMMs wait on
//! nobody and finish on whatever SMs are free.

use half::bf16;
use megamoe_core::weights::RankWeightsFp8;
use megamoe_cuda::{jit, AllGather, DeviceBuffer, Gpu, Kernel, Quantizer, WaitRecord};
use megamoe_ep::{
    CombineOrder, EpConfig, EpWorld, Handle, InjectedFault, IoRegion, RowDtype, SyncMode,
};
use megamoe_gemm::grouped::{check_wait_record, gemm_params, launch_config};
use megamoe_gemm::heuristics::{choose, GemmConfig, GemmProblem, Layout, OutDtype};
use megamoe_gemm::{GemmPointers, GroupedGemm};
use std::ops::Range;

use crate::call::{check_call, download_outputs, Activations, RankInput};
use crate::error::Result;
use crate::kernel::{comm_sms, l1_config, l1_problem, split_l1_spec, SplitL1Params, SwigluQuant};
use crate::spec::{LayerSpec, POOL_PAD};
use crate::weights::{self, DeviceWeights};

#[cfg(feature = "harness")]
mod inspect;

/// The launches of one call, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The quantizer (bf16 input only), then dispatch into the pool.
    Dispatch,
    /// L1 GEMM + SwiGLU + weight + re-quantization.
    L1,
    /// L2 GEMM into the L2 output rows.
    L2,
    /// Every rank sums its tokens' rows in slot order.
    Combine,
}

impl Phase {
    pub const ALL: [Phase; 4] = [Phase::Dispatch, Phase::L1, Phase::L2, Phase::Combine];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Dispatch => "dispatch",
            Phase::L1 => "L1+SwiGLU",
            Phase::L2 => "L2",
            Phase::Combine => "combine",
        }
    }
}

/// A call whose inputs are on the device: what [`SplitLayer::launch`] runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Staged {
    /// T of every local rank ([`SplitLayer::local_ranks`]).
    pub tokens: Vec<usize>,
    /// Which ranks' inputs the quantizer must convert first.
    bf16: Vec<bool>,
}

/// The buffers and kernels of one rank.
struct RankState {
    gpu: Gpu,
    /// W1 (interleaved) and its scales: read by the L1 kernel through its params, and by the
    /// benchmark's GEMM-only arm.
    #[cfg_attr(not(feature = "harness"), expect(dead_code))]
    w1: DeviceBuffer,
    #[cfg_attr(not(feature = "harness"), expect(dead_code))]
    s1: DeviceBuffer,
    /// W2, its scales, and the intermediate (e4m3 `[pool rows, I]`, f32 `[I/G, pool rows]`:
    /// L1's output, L2's input): read by the kernels through their params only.
    _buffers: [DeviceBuffer; 4],
    /// bf16 `[T_max, H]`: staging of bf16 input for the quantizer.
    x_bf16: DeviceBuffer,
    quantizer: Quantizer,
    l1: Kernel,
    l1_params: SplitL1Params,
    l1_error: DeviceBuffer,
    /// L2 launches, one per configuration the heuristics can pick for this layer (they pick by
    /// the call's rows per expert).
    l2: Vec<GroupedGemm>,
}

/// The split MoE layer on a world of real or virtual ranks, all of them in this process or one
/// ([`SplitLayer::for_rank`]).
pub struct SplitLayer {
    pub spec: LayerSpec,
    ep: EpWorld,
    handle: Handle,
    /// The ranks this process holds, `ep.local_ranks()` in order.
    ranks: Vec<RankState>,
    l1_config: GemmConfig,
    /// The L1 kernel's name, for errors.
    l1_name: String,
    /// Cumulative rows received per local expert, per rank (ranks of other processes stay 0),
    /// over every forward.
    expert_counts: Vec<Vec<u64>>,
}

impl SplitLayer {
    /// Builds the layer: checks `spec`, allocates every buffer (see [`LayerSpec::bytes`]),
    /// compiles and loads the kernels, and loads each rank's weights from `weights(rank)` (SPEC
    /// §2 layouts; W1's gate and up blocks are interleaved on the way, src/weights.rs).
    pub fn new(
        spec: LayerSpec,
        weights: impl Fn(usize) -> megamoe_core::Result<RankWeightsFp8>,
    ) -> Result<SplitLayer> {
        SplitLayer::build(spec, weights, None, None)
    }

    /// Rank `rank` of a world of `spec.ranks` processes (one rank each, as under torchrun), on
    /// GPU `device`: every process builds its rank with the same `spec`, and the symmetric
    /// buffers' handles go through `exchange`, which every process calls in the same order.
    /// `weights(rank)` is asked for this rank only; calls take and return this rank's tensors
    /// alone.
    pub fn for_rank(
        spec: LayerSpec,
        weights: impl Fn(usize) -> megamoe_core::Result<RankWeightsFp8>,
        rank: usize,
        device: usize,
        exchange: Box<dyn AllGather>,
    ) -> Result<SplitLayer> {
        // Before the GPU is asked for its SM count (the fused kind's world checks it first).
        megamoe_cuda::check_rank(rank, spec.ranks)?;
        SplitLayer::build(spec, weights, None, Some((rank, device, exchange)))
    }

    /// `one_rank`: this process's rank, its GPU and the handle exchange (else every rank).
    fn build(
        spec: LayerSpec,
        weights: impl Fn(usize) -> megamoe_core::Result<RankWeightsFp8>,
        fault: Option<(std::time::Duration, InjectedFault)>,
        one_rank: Option<(usize, usize, Box<dyn AllGather>)>,
    ) -> Result<SplitLayer> {
        spec.validate()?;
        let (h, i) = (spec.shape.hidden, spec.shape.inter);
        let el = spec.shape.local_experts(spec.ranks);
        let rows = spec.pool_rows();
        let (ep, sms) = ep_world(&spec, fault, one_rank)?;
        let handle = ep.new_handle()?;
        let l1_config = l1_config(sms, spec.accumulation);
        let l1_compiled = jit::compile(&split_l1_spec(&l1_config))?;

        let mut ranks = Vec::with_capacity(ep.local_ranks().len());
        for r in ep.local_ranks() {
            let gpu = ep.rank(r).gpu.clone();
            let DeviceWeights { w1, s1, w2, s2 } =
                weights::upload(&gpu, r, &weights, &spec.shape, el)?;
            let acts = gpu.alloc_zeroed(rows * i)?;
            let act_scales = gpu.alloc_zeroed(rows * (i / spec.group) * 4)?;
            let x_bf16 = gpu.alloc(spec.max_tokens * h * 2)?;
            let ptrs = ep.ptrs(r);
            let pool = ep.handle_ptrs(&handle, r);
            let l1_operands = GemmPointers {
                a: ptrs.out_rows,
                scale_a: ptrs.out_scales,
                b: w1.ptr(),
                scale_b: s1.ptr(),
                expert_rows: pool.padded,
                out: acts.ptr(),
            };
            let (l1_params, l1_error) = l1_params(
                &spec,
                &gpu,
                &l1_config,
                l1_operands,
                &act_scales,
                ptrs.out_probs,
            )?;
            let l2_operands = GemmPointers {
                a: acts.ptr(),
                scale_a: act_scales.ptr(),
                b: w2.ptr(),
                scale_b: s2.ptr(),
                expert_rows: pool.padded,
                out: ptrs.comb_rows,
            };
            let l2 = l2_gemms(&spec, &gpu, sms, l2_operands)?;
            ranks.push(RankState {
                quantizer: Quantizer::new(&gpu)?,
                l1: gpu.load(&l1_compiled)?,
                gpu,
                w1,
                s1,
                _buffers: [w2, s2, acts, act_scales],
                x_bf16,
                l1_params,
                l1_error,
                l2,
            });
        }
        Ok(SplitLayer {
            expert_counts: vec![vec![0; el]; spec.ranks],
            spec,
            ep,
            handle,
            ranks,
            l1_config,
            l1_name: l1_compiled.name.clone(),
        })
    }

    /// The forward pass: one bf16 `[T, H]` output per rank. Every input is checked before
    /// anything is written; a bad one is an error naming the rank and the argument.
    /// `num_tokens_bound`, when given, must be at least every rank's T and at most T_max.
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
    ) -> Result<Staged> {
        let staged = self.stage(inputs, num_tokens_bound)?;
        self.launch(&staged)?;
        self.finish()?;
        self.count_received()?;
        Ok(staged)
    }

    /// Cumulative rows received per local expert (index: rank, then local expert), over every
    /// [`Self::forward`] of this layer: what load balancers read.
    pub fn expert_counts(&self) -> &[Vec<u64>] {
        &self.expert_counts
    }

    /// Checks every local rank's inputs, then uploads them.
    pub fn stage(&self, inputs: &[RankInput], num_tokens_bound: Option<usize>) -> Result<Staged> {
        let tokens = check_call(&self.spec, self.local_ranks(), inputs, num_tokens_bound)?;
        let layout = self.ep.layout;
        let mut bf16 = Vec::with_capacity(inputs.len());
        for (((r, rank), input), &t) in self.local().zip(inputs).zip(&tokens) {
            self.ep
                .upload_routing(r, t, input.topk_idx, input.topk_weights)?;
            match input.x {
                Activations::Bf16(x) => {
                    rank.x_bf16.upload(x)?;
                    bf16.push(true);
                }
                Activations::Fp8 { data, scales } => {
                    let buf = self.ep.buffer(r);
                    buf.upload_at(layout.in_rows, data)?;
                    buf.upload_at(layout.in_scales, scales)?;
                    bf16.push(false);
                }
                Activations::Device(x) => {
                    let buf = self.ep.buffer(r);
                    let places = [
                        (&rank.x_bf16, 0),
                        (buf, layout.in_rows),
                        (buf, layout.in_scales),
                    ];
                    bf16.push(x.copy_into(&rank.gpu, places, self.spec.shape.hidden)?);
                }
            }
        }
        Ok(Staged { tokens, bf16 })
    }

    /// Queues a staged call on every local rank's stream (no host synchronization; errors of the
    /// device side are reported by [`Self::finish`]).
    pub fn launch(&mut self, staged: &Staged) -> Result<()> {
        for phase in Phase::ALL {
            self.launch_phase(staged, phase)?;
        }
        Ok(())
    }

    /// Queues one phase of a staged call on every rank's stream (the benchmark times them one
    /// by one; each reads what the previous phase of an earlier call left).
    pub fn launch_phase(&mut self, staged: &Staged, phase: Phase) -> Result<()> {
        let row_bound = self.spec.pool_rows();
        match phase {
            Phase::Dispatch => {
                let layout = self.ep.layout;
                for ((r, rank), (&bf16, &tokens)) in
                    self.local().zip(staged.bf16.iter().zip(&staged.tokens))
                {
                    if bf16 {
                        let buf = self.ep.buffer(r);
                        rank.quantizer.launch_at(
                            &rank.gpu,
                            &rank.x_bf16,
                            (buf, layout.in_rows),
                            (buf, layout.in_scales),
                            tokens,
                            self.spec.shape.hidden,
                        )?;
                    }
                }
                self.ep.dispatch_with_permute(
                    &staged.tokens,
                    POOL_PAD,
                    SyncMode::NonBlocking { row_bound },
                    &mut self.handle,
                )?;
            }
            Phase::L1 => {
                for rank in &self.ranks {
                    rank.gpu
                        .launch(&rank.l1, &launch_config(&self.l1_config), &rank.l1_params)?;
                }
            }
            Phase::L2 => {
                let l2 = self.l2_index(staged)?;
                for rank in &self.ranks {
                    rank.l2[l2].launch(&rank.gpu)?;
                }
            }
            Phase::Combine => {
                self.ep.combine(
                    &self.handle,
                    false,
                    CombineOrder::Slot,
                    SyncMode::NonBlocking { row_bound },
                )?;
            }
        }
        Ok(())
    }

    /// Waits for every local rank and reports the first failure of the calls since the last finish:
    /// a device wait past its deadline (naming the rank and the wait) or a rejected input.
    pub fn finish(&self) -> Result<()> {
        // The EP sync waits for every rank's stream, the GEMMs' launches included.
        self.ep.sync()?;
        for rank in &self.ranks {
            let record = rank.l1_error.download::<WaitRecord>()?[0];
            check_wait_record(record, &self.l1_name)?;
            for l2 in &rank.l2 {
                l2.check_synchronized()?;
            }
        }
        Ok(())
    }

    /// The GPU handle of local rank `rank` (by its global number): its stream, its timers.
    pub fn gpu(&self, rank: usize) -> &Gpu {
        &self.ranks[rank - self.local_ranks().start].gpu
    }

    /// The ranks this process holds: every rank, or one ([`Self::for_rank`]).
    pub fn local_ranks(&self) -> Range<usize> {
        self.ep.local_ranks()
    }

    /// Every local rank's global number and state.
    fn local(&self) -> impl Iterator<Item = (usize, &RankState)> {
        self.local_ranks().zip(&self.ranks)
    }

    /// Downloads the outputs of the last finished call, one per local rank.
    pub fn outputs(&self, staged: &Staged) -> Result<Vec<Vec<bf16>>> {
        let first = self.local_ranks().start;
        download_outputs(&staged.tokens, self.spec.shape.hidden, |i| {
            self.output(first + i)
        })
    }

    /// Where local rank `rank`'s (its global number) output of the last finished call is: bf16 `[T, H]` from a byte
    /// offset of a buffer.
    pub(crate) fn output(&self, rank: usize) -> (&DeviceBuffer, usize) {
        (self.ep.io(rank), self.ep.io_offset(IoRegion::Y))
    }

    fn count_received(&mut self) -> Result<()> {
        for r in self.local_ranks() {
            let rows = self.ep.received_rows(&self.handle, r)?;
            for (c, n) in self.expert_counts[r].iter_mut().zip(rows) {
                *c += n as u64;
            }
        }
        Ok(())
    }

    /// Which of the ranks' L2 launches runs `staged`: the GEMM heuristics' choice for the
    /// call's rows per expert.
    fn l2_index(&self, staged: &Staged) -> Result<usize> {
        let problem = l2_problem(&self.spec, self.rows_per_expert(staged));
        let config = choose(&problem, self.l1_config.ctas)?;
        Ok(self.ranks[0]
            .l2
            .iter()
            .position(|g| g.config == config)
            .expect("every configuration the heuristics pick is built in new()"))
    }

    /// The call's mean rows per expert, which picks the GEMMs' tiles: every rank's slots over
    /// the experts. A process of one rank knows its own T only and counts every rank at its
    /// own (so ranks may pick differently; the tile changes the speed, never the bits).
    fn rows_per_expert(&self, staged: &Staged) -> usize {
        let local_slots = staged.tokens.iter().sum::<usize>() * self.spec.shape.topk;
        let slots = local_slots * self.spec.ranks / staged.tokens.len().max(1);
        slots / self.spec.shape.experts
    }
}

/// The world of dispatch and combine under `spec`: every rank in this process, or `one_rank`
/// (its rank, its GPU and the handle exchange), with `fault` injected (the selftest's); and
/// the SM count of its GPUs.
fn ep_world(
    spec: &LayerSpec,
    fault: Option<(std::time::Duration, InjectedFault)>,
    one_rank: Option<(usize, usize, Box<dyn AllGather>)>,
) -> Result<(EpWorld, usize)> {
    let mut ep_config = EpConfig::new(spec.ep_spec(), RowDtype::Fp8);
    ep_config.group_major_scales = true;
    // A process of one rank shares its GPU with no rank of its own (processes that share a
    // GPU take turns on it).
    let (local, gpus, device) = match &one_rank {
        Some((_, device, _)) => (1, 1, *device),
        None => (spec.ranks, megamoe_cuda::device_count()?.max(1), 0),
    };
    let sms = Gpu::new(device)?.props().sm_count as usize;
    ep_config.num_sms = comm_sms(spec.comm_sms, local, gpus, sms);
    if let Some((deadline, fault)) = fault {
        ep_config.deadline = deadline;
        ep_config.fault = Some(fault);
    }
    let ep = match one_rank {
        Some((rank, device, exchange)) => EpWorld::for_rank(ep_config, rank, device, exchange)?,
        None => EpWorld::new(ep_config)?,
    };
    Ok((ep, sms))
}

/// One rank's L1 params: the GEMM over `operands` (dispatched rows times W1 into the
/// intermediate), with the SwiGLU epilogue quantizing into the intermediate and its scales
/// `act_scales`, weighted by the dispatched rows' `probs`; and the GEMM's error record.
fn l1_params(
    spec: &LayerSpec,
    gpu: &Gpu,
    config: &GemmConfig,
    operands: GemmPointers,
    act_scales: &DeviceBuffer,
    probs: u64,
) -> Result<(SplitL1Params, DeviceBuffer)> {
    let (h, i) = (spec.shape.hidden, spec.shape.inter);
    let el = spec.shape.local_experts(spec.ranks);
    let rows = spec.pool_rows();
    let problem = l1_problem(h, i, el, POOL_PAD, spec.accumulation);
    let (gemm, error) = gemm_params(gpu, &problem, config, rows, operands)?;
    let params = SplitL1Params {
        gemm,
        epilogue: SwigluQuant::new(spec, operands.out, act_scales.ptr(), probs, rows),
    };
    Ok((params, error))
}

/// One rank's L2 launches over `operands` on `gpu`, one per configuration of [`l2_configs`].
fn l2_gemms(
    spec: &LayerSpec,
    gpu: &Gpu,
    sms: usize,
    operands: GemmPointers,
) -> Result<Vec<GroupedGemm>> {
    let rows = spec.pool_rows();
    l2_configs(spec, sms)?
        .into_iter()
        .map(|(problem, config)| Ok(GroupedGemm::new(gpu, problem, config, rows, operands)?))
        .collect()
}

/// The L2 GEMM's problem: the intermediate (K = I, scales per G) times W2 (N = H), bf16 rows.
fn l2_problem(spec: &LayerSpec, rows_per_expert: usize) -> GemmProblem {
    GemmProblem {
        experts: spec.shape.local_experts(spec.ranks),
        n: spec.shape.hidden,
        k: spec.shape.inter,
        group_size: spec.group,
        layout: Layout::Contiguous { pad: POOL_PAD },
        out: OutDtype::Bf16,
        rows_per_expert,
        accumulation: spec.accumulation,
    }
}

/// Every L2 configuration the GEMM heuristics can pick for `spec`, whatever the call's rows
/// per expert (they switch tiles at 64 rows per expert), with its problem.
fn l2_configs(spec: &LayerSpec, sms: usize) -> Result<Vec<(GemmProblem, GemmConfig)>> {
    let mut out: Vec<(GemmProblem, GemmConfig)> = Vec::new();
    for rows_per_expert in [1, POOL_PAD] {
        let problem = l2_problem(spec, rows_per_expert);
        let config = choose(&problem, sms)?;
        if !out.iter().any(|(_, c)| *c == config) {
            out.push((problem, config));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::tests::Unreachable;
    use megamoe_core::Preset;

    #[test]
    fn a_bad_spec_is_rejected_before_any_exchange() {
        let shape = Preset::by_name("tiny").unwrap().shape;
        let spec = LayerSpec::new(shape, 3, 64); // 16 experts over 3 ranks
        let no_weights = |_| unreachable!("no weights are read for a rejected spec");
        assert!(SplitLayer::for_rank(spec, no_weights, 0, 0, Box::new(Unreachable)).is_err());
    }

    /// A serving engine builds the layer on one thread and runs it on a worker thread.
    #[test]
    fn a_layer_can_move_to_another_thread() {
        fn send<T: Send>() {}
        send::<SplitLayer>();
    }
}
