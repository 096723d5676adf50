//! The expert-parallel world: megamoe-cuda's [`World`] (one stream per rank, virtual ranks when
//! ranks outnumber GPUs), one symmetric buffer, and the calls of SPEC §5 on the local ranks at
//! once: every rank of the world ([`EpWorld::new`], one process), or the one rank of this
//! process ([`EpWorld::for_rank`], one process per rank, peers' buffers mapped over CUDA IPC;
//! every process then makes the same calls). Every call is asynchronous per rank, so one host
//! thread queues each local rank's launch on that rank's stream and a blocking call then waits
//! for every local stream; modules are loaded and buffers allocated once, at construction.
//! Per-rank arguments and results (token counts, dispatch sizes) are the local ranks', in rank
//! order.

use std::sync::Arc;
use std::time::Duration;

use megamoe_core::routing::check_topk_idx;
use megamoe_core::Error;
use megamoe_cuda::wait::{deadline_ns, DEFAULT_DEADLINE};
use megamoe_cuda::{
    jit, AllGather, DeviceBuffer, Graph, Kernel, LaunchConfig, Rank, SymmetricBuffer, World,
};

use crate::error::EpError;
use crate::layout::{BufferLayout, BufferSpec, HandleLayout, RowDtype, MAX_RANKS};
use crate::params::{
    self, CombineOrder, CombineParams, CombineProbeParams, DispatchParams, DispatchProbeParams,
    ErrorRecord, FaultSpec, InjectedFault, Layout, THREADS,
};

/// How a call synchronizes with the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncMode {
    /// Waits for the call, checks every rank and reports the exact output sizes.
    Blocking,
    /// Returns at once (capturable in a CUDA graph); each rank's rows must fit `row_bound`, and an
    /// overflow (no rows moved) or any other failure is reported by the next [`EpWorld::sync`].
    NonBlocking { row_bound: usize },
}

#[derive(Clone, Debug)]
pub struct EpConfig {
    pub spec: BufferSpec,
    pub dtype: RowDtype,
    /// SMs (blocks) each rank's kernels use.
    pub num_sms: usize,
    /// Budget of every device-side wait.
    pub deadline: Duration,
    /// FP8 dispatch output scales group-major, `[H/128, max_rows]` (the grouped GEMM's
    /// activation-scale layout), instead of row-major `[rows, H/128]`.
    pub group_major_scales: bool,
    /// A fault to inject (the selftest's fault checks): the world then runs the probe
    /// instantiations of dispatch and combine; None (the default) runs the default kernels.
    pub fault: Option<InjectedFault>,
}

/// Default SMs per rank for dispatch and combine (measured: docs/PERF.md).
pub const DEFAULT_NUM_SMS: usize = 24;

impl EpConfig {
    pub fn new(spec: BufferSpec, dtype: RowDtype) -> Self {
        EpConfig {
            spec,
            dtype,
            num_sms: DEFAULT_NUM_SMS,
            deadline: DEFAULT_DEADLINE,
            group_major_scales: false,
            fault: None,
        }
    }
}

/// Where one local rank's combine writes: y (bf16 `[T, H]`) and, in dispatch's backward, the
/// prob gradients (f32 `[T, K]`).
#[derive(Clone, Copy, Debug)]
pub struct CombineOutputs {
    pub y: u64,
    pub grad_probs: u64,
}

/// Device pointers of one rank's inputs and outputs for the calls.
#[derive(Clone, Copy, Debug)]
pub struct RankPtrs {
    /// Dispatch input rows `[T_max, row_bytes]` (symmetric: peers read them).
    pub x: u64,
    /// Dispatch input scales `[T_max, H/128]` (FP8).
    pub x_scales: u64,
    /// `[T_max, K]` i32 and f32.
    pub topk_idx: u64,
    pub probs: u64,
    /// Dispatch output: rows `[rows, row_bytes]`, scales, probs `[rows]`.
    pub out_rows: u64,
    pub out_scales: u64,
    pub out_probs: u64,
    /// Combine input: bf16 rows `[rows, H]` in their permuted positions, and (dispatch backward)
    /// the gradient of each row's prob `[rows]`.
    pub comb_rows: u64,
    pub comb_prob_grads: u64,
    /// Combine output `[T_max, H]` bf16, and prob gradients `[T_max, K]` f32.
    pub y: u64,
    pub grad_probs: u64,
}

/// Per-rank routing state of one dispatch (the local ranks'), reused by its combine and both
/// backwards.
pub struct Handle {
    blocks: Vec<DeviceBuffer>,
    tokens: Vec<usize>,
    ready: bool,
}

/// One captured graph per rank.
pub struct WorldGraph {
    graphs: Vec<Graph>,
}

/// Device addresses of one rank's part of a handle, for kernels that consume a dispatch.
#[derive(Clone, Copy, Debug)]
pub struct HandlePtrs {
    /// i32 `[E_l]`: each local expert's padded segment size.
    pub padded: u64,
    /// i32 `[E_l]`: each local expert's received (unpadded) rows.
    pub counts: u64,
}

/// What a blocking dispatch reports per rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dispatched {
    pub rows: usize,
    pub tokens_per_expert: Vec<u32>,
}

pub struct EpWorld {
    pub config: EpConfig,
    pub layout: BufferLayout,
    hlayout: HandleLayout,
    io_offsets: [usize; 4],
    world: World,
    /// The symmetric buffer every rank's kernels read and write (layout: [`BufferLayout`]).
    buffers: SymmetricBuffer,
    /// Each local rank's local inputs and outputs (layout: [`IoRegion`]). This and the kernels
    /// are indexed by local rank (`at`).
    io: Vec<DeviceBuffer>,
    dispatch: Vec<Arc<Kernel>>,
    combine: Vec<Arc<Kernel>>,
    /// The NCCL baseline's row gather (the benchmark's).
    #[cfg(feature = "harness")]
    pub(crate) gather: Vec<Arc<Kernel>>,
    /// ptxas's registers/spills of the kernels.
    pub compile_report: String,
}

impl EpWorld {
    /// Bytes of symmetric memory each rank allocates for `spec` (the size query).
    pub fn buffer_bytes(spec: &BufferSpec) -> usize {
        BufferLayout::new(spec).size
    }

    /// Every rank of the world in this process.
    pub fn new(config: EpConfig) -> Result<Self, EpError> {
        check_config(&config)?;
        let world = World::with_deadline(config.spec.ranks, config.deadline)?;
        Self::on(config, world)
    }

    /// Rank `rank` of a world of `config.spec.ranks` processes, on GPU `device`; the symmetric
    /// buffers' handles go through `exchange` (called by every process in the same order).
    /// Every process of the world must build its rank with the same `config`.
    pub fn for_rank(
        config: EpConfig,
        rank: usize,
        device: usize,
        exchange: Box<dyn AllGather>,
    ) -> Result<Self, EpError> {
        check_config(&config)?;
        if rank >= config.spec.ranks {
            return Err(EpError::input(
                rank,
                value(
                    "rank",
                    &rank.to_string(),
                    &format!("must be below the {} ranks of the world", config.spec.ranks),
                ),
            ));
        }
        let world = World::one_rank(rank, config.spec.ranks, device, config.deadline, exchange)?;
        Self::on(config, world)
    }

    fn on(config: EpConfig, world: World) -> Result<Self, EpError> {
        let spec = config.spec;
        let mut compile_report = String::new();
        let mut load = |spec: megamoe_cuda::KernelSpec| -> Result<Vec<Arc<Kernel>>, EpError> {
            let compiled = jit::compile(&spec)?;
            compile_report += &format!("{}: {}\n", compiled.name, compiled.report);
            Ok(world.load(&compiled)?)
        };
        let probe = config.fault.is_some();
        let dispatch = load(params::dispatch_kernel(probe))?;
        let combine = load(params::combine_kernel(probe))?;
        #[cfg(feature = "harness")]
        let gather = load(params::gather_kernel())?;
        let layout = BufferLayout::new(&spec);
        let hlayout = HandleLayout::new(&spec);
        let (t, k, h) = (spec.max_tokens, spec.topk, spec.hidden);
        let mut io_offsets = [0usize; 4];
        let mut io_bytes = 0;
        for (i, bytes) in [t * k * 4, t * k * 4, t * h * 2, t * k * 4]
            .into_iter()
            .enumerate()
        {
            io_offsets[i] = io_bytes;
            io_bytes += bytes.div_ceil(256) * 256;
        }
        let buffers = world.alloc_symmetric(layout.size)?;
        let io = world
            .ranks()
            .iter()
            .map(|r| r.gpu.alloc(io_bytes))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(EpWorld {
            config,
            layout,
            hlayout,
            io_offsets,
            world,
            buffers,
            io,
            dispatch,
            combine,
            #[cfg(feature = "harness")]
            gather,
            compile_report,
        })
    }

    /// Ranks of the whole world.
    pub fn ranks(&self) -> usize {
        self.world.size()
    }

    /// The ranks of this process.
    pub fn local_ranks(&self) -> std::ops::Range<usize> {
        self.world.local_ranks()
    }

    /// Index of local rank `rank` in the per-local-rank vectors.
    fn at(&self, rank: usize) -> usize {
        rank - self.world.local_ranks().start
    }

    pub fn physical_gpus(&self) -> usize {
        self.world.gpu_count()
    }

    pub fn ptrs(&self, rank: usize) -> RankPtrs {
        let b = self.buffers.ptr(rank);
        let io = self.io[self.at(rank)].ptr();
        let l = &self.layout;
        RankPtrs {
            x: b + l.in_rows as u64,
            x_scales: b + l.in_scales as u64,
            topk_idx: io + self.io_offsets[0] as u64,
            probs: io + self.io_offsets[1] as u64,
            out_rows: b + l.out_rows as u64,
            out_scales: b + l.out_scales as u64,
            out_probs: b + l.out_probs as u64,
            comb_rows: b + l.comb_rows as u64,
            comb_prob_grads: b + l.comb_prob_grads as u64,
            y: io + self.io_offsets[2] as u64,
            grad_probs: io + self.io_offsets[3] as u64,
        }
    }

    /// Device address of rank `rank`'s error code (u32: 0 while no call since the last
    /// [`Self::sync`] failed, else the first failure's code; a non-blocking call that overflowed
    /// its row bound sets it), for a copy the device orders after the calls.
    pub fn error_code_ptr(&self, rank: usize) -> u64 {
        self.buffers.ptr(rank) + self.layout.error as u64
    }

    /// The rank's symmetric buffer and its local in/out block, for uploads and downloads.
    pub fn buffer(&self, rank: usize) -> &DeviceBuffer {
        self.buffers.local(rank)
    }
    pub fn io(&self, rank: usize) -> &DeviceBuffer {
        &self.io[self.at(rank)]
    }
    pub fn io_offset(&self, which: IoRegion) -> usize {
        self.io_offsets[which as usize]
    }
    /// Rank `rank` of the runtime's world: its GPU handle (stream, timers) and wait record.
    pub fn rank(&self, rank: usize) -> &Rank {
        self.world.rank(rank)
    }

    /// Device addresses of rank `rank`'s part of `handle`.
    pub fn handle_ptrs(&self, handle: &Handle, rank: usize) -> HandlePtrs {
        let b = handle.blocks[self.at(rank)].ptr();
        HandlePtrs {
            padded: b + self.hlayout.padded as u64,
            counts: b + self.hlayout.counts as u64,
        }
    }

    /// Rows each local expert of rank `rank` received in the dispatch that filled `handle`
    /// (unpadded), downloaded.
    pub fn received_rows(&self, handle: &Handle, rank: usize) -> Result<Vec<i32>, EpError> {
        let mut rows = vec![0i32; self.config.spec.local_experts()];
        handle.blocks[self.at(rank)].download_into(self.hlayout.counts, &mut rows)?;
        Ok(rows)
    }

    /// Uploads one rank's routing (`topk_idx`, `probs`, `[tokens, K]` each) from the host, for
    /// calls whose rows are already in the buffer.
    pub fn upload_routing(
        &self,
        rank: usize,
        tokens: usize,
        topk_idx: &[i32],
        probs: &[f32],
    ) -> Result<(), EpError> {
        check_capacity(&self.config, rank, tokens)?;
        check_routing(&self.config, rank, tokens, topk_idx, probs)?;
        self.write_routing(rank, topk_idx, probs)
    }

    /// Uploads one rank's dispatch inputs from the host (rows checked against the buffer's dtype).
    pub fn upload_inputs(
        &self,
        rank: usize,
        tokens: usize,
        rows: Rows,
        topk_idx: &[i32],
        probs: &[f32],
    ) -> Result<(), EpError> {
        let (bytes, scales) = check_inputs(&self.config, rank, tokens, rows, topk_idx, probs)?;
        self.write_routing(rank, topk_idx, probs)?;
        let buf = self.buffer(rank);
        buf.upload_at(self.layout.in_rows, bytes)?;
        buf.upload_at(self.layout.in_scales, scales)?;
        Ok(())
    }

    fn write_routing(&self, rank: usize, topk_idx: &[i32], probs: &[f32]) -> Result<(), EpError> {
        let io = self.io(rank);
        io.upload_at(self.io_offsets[0], topk_idx)?;
        io.upload_at(self.io_offsets[1], probs)?;
        Ok(())
    }

    pub fn new_handle(&self) -> Result<Handle, EpError> {
        let blocks = self
            .world
            .ranks()
            .iter()
            .map(|r| r.gpu.alloc(self.hlayout.size))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Handle {
            tokens: vec![0; blocks.len()],
            blocks,
            ready: false,
        })
    }

    fn kernel_layout(&self, rank: usize, handle: &Handle) -> Layout {
        let s = &self.config.spec;
        let (l, h) = (&self.layout, &self.hlayout);
        let mut peer_base = [0u64; MAX_RANKS];
        for (r, p) in peer_base.iter_mut().enumerate().take(s.ranks) {
            *p = self.buffers.ptr(r);
        }
        Layout {
            peer_base,
            handle: handle.blocks[self.at(rank)].ptr(),
            deadline_ns: deadline_ns(self.config.deadline),
            wait_record: self.rank(rank).wait_record(),
            off_epochs: l.epochs as u64,
            off_signals: l.signals as u64,
            off_status: l.status as u64,
            off_counts: l.counts as u64,
            off_meta: l.meta as u64,
            off_in_rows: l.in_rows as u64,
            off_in_scales: l.in_scales as u64,
            off_out_rows: l.out_rows as u64,
            off_out_scales: l.out_scales as u64,
            off_out_probs: l.out_probs as u64,
            off_comb_rows: l.comb_rows as u64,
            off_comb_prob_grads: l.comb_prob_grads as u64,
            off_error: l.error as u64,
            h_recv_slot: h.recv_slot as u64,
            h_send_row: h.send_row as u64,
            h_idx: h.idx as u64,
            h_padded: h.padded as u64,
            h_counts: h.counts as u64,
            h_seg_base: h.seg_base as u64,
            h_src_tokens: h.src_tokens as u64,
            h_total_rows: h.total_rows as u64,
            rank: rank as i32,
            ranks: s.ranks as i32,
            experts: s.experts as i32,
            topk: s.topk as i32,
            hidden: s.hidden as i32,
            max_tokens: s.max_tokens as i32,
            max_rows: s.max_rows() as i32,
            _pad0: 0,
        }
    }

    fn row_bound(&self, mode: SyncMode) -> Result<usize, EpError> {
        let max = self.config.spec.max_rows();
        match mode {
            SyncMode::Blocking => Ok(max),
            SyncMode::NonBlocking { row_bound } if row_bound <= max => Ok(row_bound),
            SyncMode::NonBlocking { row_bound } => Err(EpError::input(
                0,
                value(
                    "row_bound",
                    &row_bound.to_string(),
                    &format!("exceeds the buffer's {max} rows"),
                ),
            )),
        }
    }

    /// dispatch_with_permute on every local rank: `tokens[i]` rows of the i-th local rank's `x`
    /// (and FP8 scales),
    /// `topk_idx` and `probs` (already in [`RankPtrs`]) go to their experts' owners, grouped by
    /// local expert, ordered by (source rank, token), each segment padded to `pad_multiple`.
    pub fn dispatch_with_permute(
        &self,
        tokens: &[usize],
        pad_multiple: usize,
        mode: SyncMode,
        handle: &mut Handle,
    ) -> Result<Option<Vec<Dispatched>>, EpError> {
        let s = &self.config.spec;
        check_tokens(&self.config, self.local_ranks(), tokens)?;
        if pad_multiple == 0 || pad_multiple > s.max_pad_multiple {
            return Err(EpError::input(
                0,
                value(
                    "pad_multiple",
                    &pad_multiple.to_string(),
                    &format!("must be in 1..={}", s.max_pad_multiple),
                ),
            ));
        }
        let row_bound = self.row_bound(mode)?;
        self.launch_input_rows(
            tokens,
            pad_multiple,
            row_bound,
            params::DISPATCH_FULL,
            handle,
        )?;
        handle.tokens = tokens.to_vec();
        handle.ready = true;
        if mode != SyncMode::Blocking {
            return Ok(None);
        }
        self.sync()?;
        let out = handle
            .blocks
            .iter()
            .map(|b| {
                let mut rows = [0i32];
                b.download_into(self.hlayout.total_rows, &mut rows)?;
                let mut padded = vec![0i32; s.local_experts()];
                b.download_into(self.hlayout.padded, &mut padded)?;
                Ok(Dispatched {
                    rows: rows[0] as usize,
                    tokens_per_expert: padded.into_iter().map(|v| v as u32).collect(),
                })
            })
            .collect::<Result<Vec<_>, EpError>>()?;
        Ok(Some(out))
    }

    /// combine_with_unpermute on every local rank: y_t (into `RankPtrs::y`) is the bf16 sum of
    /// token t's rows in `comb_rows` on their owners, in `order` (SPEC §5: `exact` or `per_rank`;
    /// `per_rank` overwrites the dispatch output rows, its scratch).
    pub fn combine_with_unpermute(
        &self,
        handle: &Handle,
        order: CombineOrder,
        mode: SyncMode,
    ) -> Result<(), EpError> {
        self.combine(handle, false, order, mode)
    }

    /// The combine of `comb_rows` into `RankPtrs::y` with the copies of a token summed in
    /// `order` (unweighted). With `prob_grads` (dispatch's backward) each slot's
    /// `comb_prob_grads` entry is read back into `grad_probs` `[T, K]`.
    pub fn combine(
        &self,
        handle: &Handle,
        prob_grads: bool,
        order: CombineOrder,
        mode: SyncMode,
    ) -> Result<(), EpError> {
        let outputs: Vec<CombineOutputs> = self
            .local_ranks()
            .map(|r| CombineOutputs {
                y: self.ptrs(r).y,
                grad_probs: self.ptrs(r).grad_probs,
            })
            .collect();
        self.combine_into(handle, prob_grads, order, mode, &outputs)
    }

    /// As [`Self::combine`], writing each local rank's `y` (bf16 `[T, H]`, rows contiguous) and
    /// `grad_probs` (f32 `[T, K]`) straight to the device addresses of `outputs` (one per local
    /// rank, in rank order; the caller checked they hold T rows), with no copy out.
    pub fn combine_into(
        &self,
        handle: &Handle,
        prob_grads: bool,
        order: CombineOrder,
        mode: SyncMode,
        outputs: &[CombineOutputs],
    ) -> Result<(), EpError> {
        self.check_handle(handle)?;
        if outputs.len() != self.local_ranks().len() {
            return Err(EpError::input(
                0,
                value(
                    "outputs",
                    &outputs.len().to_string(),
                    "must hold one entry per local rank",
                ),
            ));
        }
        for r in self.local_ranks() {
            let out = outputs[self.at(r)];
            let p = CombineParams {
                l: self.kernel_layout(r, handle),
                y: out.y,
                grad_probs: out.grad_probs,
                with_prob_grads: prob_grads as i32,
                order: order as i32,
                ..Default::default()
            };
            let (gpu, kernel, config) = (
                &self.rank(r).gpu,
                &self.combine[self.at(r)],
                self.launch_config(),
            );
            match self.config.fault {
                None => gpu.launch(kernel, &config, &p)?,
                Some(f) => gpu.launch(
                    kernel,
                    &config,
                    &CombineProbeParams {
                        p,
                        fault: FaultSpec::from(f),
                    },
                )?,
            }
        }
        if mode == SyncMode::Blocking {
            self.sync()?;
        }
        Ok(())
    }

    /// Dispatch's backward: the row gradients (in `comb_rows`) are combined back to `[T, H]` in
    /// `order` (the forward combine's) and the prob gradients (in `comb_prob_grads`) scattered
    /// back to `[T, K]`.
    pub fn dispatch_backward(
        &self,
        handle: &Handle,
        order: CombineOrder,
        mode: SyncMode,
    ) -> Result<(), EpError> {
        self.combine(handle, true, order, mode)
    }

    /// Combine's backward: the output gradient (bf16 `[T, H]`, in `RankPtrs::x`) is dispatched
    /// along the handle's routing into `out_rows` (bf16, padding zeroed).
    pub fn combine_backward(&self, handle: &Handle, mode: SyncMode) -> Result<(), EpError> {
        self.check_handle(handle)?;
        let s = &self.config.spec;
        let tokens = handle.tokens.clone();
        self.launch_dispatch_on(
            self.local_ranks(),
            &tokens,
            1,
            s.hidden * 2,
            0,
            s.max_rows(),
            params::DISPATCH_CACHED,
            handle,
        )?;
        if mode == SyncMode::Blocking {
            self.sync()?;
        }
        Ok(())
    }

    /// The benchmark's "dispatch alone": the same exchange without the permute (one row per
    /// (source, token) with any local expert, at row `source · T_max + token`, no padding); the
    /// handle is refilled as by a dispatch with `pad_multiple`.
    pub fn dispatch_without_permute(
        &self,
        tokens: &[usize],
        pad_multiple: usize,
        handle: &Handle,
    ) -> Result<(), EpError> {
        check_tokens(&self.config, self.local_ranks(), tokens)?;
        self.launch_input_rows(
            tokens,
            pad_multiple,
            self.config.spec.max_rows(),
            params::DISPATCH_UNPERMUTED,
            handle,
        )
    }

    /// Launches the dispatch kernel on every local rank for the input rows (the buffer's dtype).
    fn launch_input_rows(
        &self,
        tokens: &[usize],
        pad_multiple: usize,
        row_bound: usize,
        mode: i32,
        handle: &Handle,
    ) -> Result<(), EpError> {
        let (h, dtype) = (self.config.spec.hidden, self.config.dtype);
        self.launch_dispatch_on(
            self.local_ranks(),
            tokens,
            pad_multiple,
            dtype.row_bytes(h),
            dtype.scales_per_row(h),
            row_bound,
            mode,
            handle,
        )
    }

    /// Launches the dispatch kernel on local `ranks` (all of them, except in the deadline
    /// check); `tokens[i]` is the i-th local rank's T.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn launch_dispatch_on(
        &self,
        ranks: std::ops::Range<usize>,
        tokens: &[usize],
        pad_multiple: usize,
        row_bytes: usize,
        scales_per_row: usize,
        row_bound: usize,
        mode: i32,
        handle: &Handle,
    ) -> Result<(), EpError> {
        for r in ranks {
            let p = DispatchParams {
                l: self.kernel_layout(r, handle),
                topk_idx: self.ptrs(r).topk_idx,
                probs: self.ptrs(r).probs,
                tokens: tokens[self.at(r)] as i32,
                pad_multiple: pad_multiple as i32,
                row_bytes: row_bytes as i32,
                scales_per_row: scales_per_row as i32,
                row_bound: row_bound as i32,
                mode,
                scales_stride: if self.config.group_major_scales && scales_per_row > 0 {
                    self.config.spec.max_rows() as i32
                } else {
                    0
                },
                ..Default::default()
            };
            debug_assert_eq!(
                p.topk_idx % 16,
                0,
                "the kernel reads topk_idx 16 bytes at a time"
            );
            let config = self
                .launch_config()
                .with_dynamic_smem(params::DISPATCH_DYNAMIC_SMEM);
            let (gpu, kernel) = (&self.rank(r).gpu, &self.dispatch[self.at(r)]);
            match self.config.fault {
                None => gpu.launch(kernel, &config, &p)?,
                Some(f) => gpu.launch(
                    kernel,
                    &config,
                    &DispatchProbeParams {
                        p,
                        fault: FaultSpec::from(f),
                    },
                )?,
            }
        }
        Ok(())
    }

    /// Records what `calls` launches on every local rank's stream into one CUDA graph per rank
    /// (the calls must be non-blocking); replaying it repeats the calls on whatever inputs the
    /// buffers then hold.
    pub fn capture(
        &self,
        calls: impl FnOnce(&EpWorld) -> Result<(), EpError>,
    ) -> Result<WorldGraph, EpError> {
        for r in self.world.ranks() {
            r.gpu.begin_capture()?;
        }
        let result = calls(self);
        let graphs = self
            .world
            .ranks()
            .iter()
            .map(|r| r.gpu.end_capture())
            .collect::<Result<Vec<_>, _>>()?;
        result?;
        Ok(WorldGraph { graphs })
    }

    /// Launches a captured graph on every local rank's stream (non-blocking; errors at
    /// [`Self::sync`]).
    pub fn replay(&self, graph: &WorldGraph) -> Result<(), EpError> {
        for (r, g) in self.world.ranks().iter().zip(&graph.graphs) {
            r.gpu.launch_graph(g)?;
        }
        Ok(())
    }

    /// One block per SM the call may use.
    fn launch_config(&self) -> LaunchConfig {
        LaunchConfig::new(self.config.num_sms as u32, THREADS)
    }

    fn check_handle(&self, handle: &Handle) -> Result<(), EpError> {
        if !handle.ready || handle.blocks.len() != self.world.ranks().len() {
            return Err(EpError::input(
                0,
                value("handle", "unfilled", "comes from a dispatch of this world"),
            ));
        }
        Ok(())
    }

    /// Waits for every local rank's stream, then reports the first failure of the calls since
    /// the last sync (rank order): a wait past its deadline (the world must then be rebuilt),
    /// else a call the device rejected (cleared: the world stays usable).
    pub fn sync(&self) -> Result<(), EpError> {
        for r in self.world.ranks() {
            r.gpu.synchronize()?;
        }
        for r in self.world.ranks() {
            r.check_waits(&[&crate::error::WAITS])?;
        }
        let mut first = None;
        let mut rejected = 0;
        for rank in self.local_ranks() {
            let mut rec = [ErrorRecord::default()];
            self.buffer(rank)
                .download_into(self.layout.error, &mut rec)?;
            if rec[0].code == params::ERR_OK {
                continue;
            }
            self.buffer(rank)
                .fill(self.layout.error, std::mem::size_of::<ErrorRecord>(), 0)?;
            rejected += 1;
            first.get_or_insert((rank, rec[0]));
        }
        match first {
            None => Ok(()),
            Some((rank, rec)) => Err(self.describe(rank, rec, rejected)?),
        }
    }

    /// Every local rank's expired wait (rank order; None where none expired): after a
    /// [`Self::sync`] that reported one, which rank waited for whom.
    pub fn expired_waits(&self) -> Result<Vec<Option<megamoe_cuda::Error>>, EpError> {
        let mut out = Vec::with_capacity(self.world.ranks().len());
        for r in self.world.ranks() {
            out.push(match r.check_waits(&[&crate::error::WAITS]) {
                Ok(()) => None,
                Err(e @ megamoe_cuda::Error::WaitTimeout { .. }) => Some(e),
                Err(e) => return Err(e.into()),
            });
        }
        Ok(out)
    }

    /// The error of rank `rank`'s record; `rejected`: ranks whose record was set.
    fn describe(&self, rank: usize, rec: ErrorRecord, rejected: usize) -> Result<EpError, EpError> {
        let s = &self.config.spec;
        Ok(match rec.code {
            params::ERR_BAD_COUNT => EpError::BadCount {
                rank,
                peer: rec.peer as usize,
                what: if rec.what as usize == s.experts {
                    "its token count T".into()
                } else {
                    format!("the rows of expert {}", rec.what)
                },
                seen: rec.seen,
                bound: rec.expected,
                rejected,
                ranks: self.ranks(),
            },
            params::ERR_OVERFLOW => EpError::Overflow {
                rank,
                needed: rec.seen,
                bound: rec.expected,
            },
            params::ERR_BAD_TOPK => {
                // The device names the first bad slot of rank `peer`; re-check that token's row
                // here (when that rank is local) to report it exactly as the host check would.
                let src = rec.peer as usize;
                let t = (rec.what >> 1) as usize / s.topk;
                let mut row = vec![0i32; s.topk];
                let err = if self.local_ranks().contains(&src) {
                    self.io(src)
                        .download_into(self.io_offsets[0] + t * s.topk * 4, &mut row)?;
                    check_topk_idx("topk_idx", s.shape(), &row).err()
                } else {
                    None
                };
                let err = err.map(|e| with_row(e, t)).unwrap_or_else(|| {
                    value(
                        "topk_idx",
                        &format!("row {t}"),
                        "was rejected on the device",
                    )
                });
                EpError::input(src, err)
            }
            other => EpError::Runtime(megamoe_cuda::Error::Invalid {
                arg: "error record",
                reason: format!("rank {rank}: unknown device error code {other}"),
            }),
        })
    }
}

/// The host checks of one rank's dispatch inputs, before anything is written: T within the
/// capacity, rows of the buffer's dtype and their lengths, then the routing's lengths. Returns
/// the row bytes and scales to upload.
fn check_inputs<'a>(
    config: &EpConfig,
    rank: usize,
    tokens: usize,
    rows: Rows<'a>,
    topk_idx: &[i32],
    probs: &[f32],
) -> Result<(&'a [u8], &'a [f32]), EpError> {
    let bad = |e| Err(EpError::input(rank, e));
    check_capacity(config, rank, tokens)?;
    let (bytes, scales): (&[u8], &[f32]) = match (rows, config.dtype) {
        (Rows::Bf16(x), RowDtype::Bf16) => (bytemuck_bf16(x), &[]),
        (Rows::Fp8 { data, scales }, RowDtype::Fp8) => (data, scales),
        (given, want) => {
            return bad(value(
                "x",
                given.dtype_name(),
                &format!("this buffer carries {want:?} rows"),
            ))
        }
    };
    let hidden = config.spec.hidden;
    for (arg, got, expected) in [
        ("x", bytes.len(), tokens * config.dtype.row_bytes(hidden)),
        (
            "x_scales",
            scales.len(),
            tokens * config.dtype.scales_per_row(hidden),
        ),
    ] {
        if got != expected {
            return bad(Error::Length { arg, got, expected });
        }
    }
    check_routing(config, rank, tokens, topk_idx, probs)?;
    Ok((bytes, scales))
}

fn check_capacity(config: &EpConfig, rank: usize, tokens: usize) -> Result<(), EpError> {
    let capacity = config.spec.max_tokens;
    if tokens > capacity {
        return Err(EpError::input(
            rank,
            Error::Capacity {
                arg: "tokens",
                got: tokens,
                capacity,
            },
        ));
    }
    Ok(())
}

fn check_routing(
    config: &EpConfig,
    rank: usize,
    tokens: usize,
    topk_idx: &[i32],
    probs: &[f32],
) -> Result<(), EpError> {
    let expected = tokens * config.spec.topk;
    for (arg, got) in [("topk_idx", topk_idx.len()), ("probs", probs.len())] {
        if got != expected {
            return Err(EpError::input(rank, Error::Length { arg, got, expected }));
        }
    }
    Ok(())
}

/// The world's settings, before anything is allocated.
fn check_config(config: &EpConfig) -> Result<(), EpError> {
    config.spec.validate().map_err(|e| EpError::input(0, e))?;
    if config.num_sms == 0 {
        return Err(EpError::input(
            0,
            value("num_sms", "0", "must be at least 1"),
        ));
    }
    Ok(())
}

/// One T per local rank (`local`), each within the capacity.
fn check_tokens(
    config: &EpConfig,
    local: std::ops::Range<usize>,
    tokens: &[usize],
) -> Result<(), EpError> {
    if tokens.len() != local.len() {
        return Err(EpError::input(
            local.start,
            Error::Length {
                arg: "tokens",
                got: tokens.len(),
                expected: local.len(),
            },
        ));
    }
    for (r, &t) in local.zip(tokens) {
        if t > config.spec.max_tokens {
            return Err(EpError::input(
                r,
                Error::Capacity {
                    arg: "tokens",
                    got: t,
                    capacity: config.spec.max_tokens,
                },
            ));
        }
    }
    Ok(())
}

/// Rows handed to [`EpWorld::upload_inputs`].
#[derive(Clone, Copy, Debug)]
pub enum Rows<'a> {
    Bf16(&'a [half::bf16]),
    Fp8 { data: &'a [u8], scales: &'a [f32] },
}

impl Rows<'_> {
    fn dtype_name(&self) -> &'static str {
        match self {
            Rows::Bf16(_) => "bf16 rows",
            Rows::Fp8 { .. } => "fp8 rows",
        }
    }
}

/// The bytes of a bf16 slice (little-endian, as the device stores them).
pub fn bytemuck_bf16(x: &[half::bf16]) -> &[u8] {
    // SAFETY: bf16 is a plain 2-byte value with no padding; u8 has alignment 1.
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast(), std::mem::size_of_val(x)) }
}

/// Which block of [`EpWorld::io`] a pointer of [`RankPtrs`] lives in.
#[derive(Clone, Copy, Debug)]
pub enum IoRegion {
    TopkIdx = 0,
    Probs = 1,
    Y = 2,
    GradProbs = 3,
}

fn value(arg: &'static str, value: &str, reason: &str) -> Error {
    Error::Value {
        arg,
        value: value.into(),
        reason: reason.into(),
    }
}

fn with_row(e: Error, row: usize) -> Error {
    match e {
        Error::ExpertOutOfRange {
            arg,
            slot,
            value,
            experts,
            ..
        } => Error::ExpertOutOfRange {
            arg,
            row,
            slot,
            value,
            experts,
        },
        Error::DuplicateExpert {
            arg,
            expert,
            first,
            second,
            ..
        } => Error::DuplicateExpert {
            arg,
            row,
            expert,
            first,
            second,
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn config(dtype: RowDtype) -> EpConfig {
        let spec = BufferSpec {
            ranks: 2,
            experts: 16,
            topk: 4,
            hidden: 256,
            max_tokens: 8,
            max_pad_multiple: 128,
        };
        EpConfig::new(spec, dtype)
    }

    /// An exchange that must never be reached.
    struct Unreachable;

    impl AllGather for Unreachable {
        fn all_gather(&mut self, _: &[u8]) -> megamoe_cuda::Result<Vec<Vec<u8>>> {
            panic!("the arguments should have been rejected before any exchange")
        }
    }

    #[test]
    fn one_rank_of_a_world_checks_its_arguments_before_touching_a_gpu() {
        let e = EpWorld::for_rank(config(RowDtype::Bf16), 2, 0, Box::new(Unreachable))
            .err()
            .expect("rank 2 of 2 is rejected")
            .to_string();
        assert!(e.starts_with("rank 2: `rank`"), "{e}");
        let mut bad = config(RowDtype::Fp8);
        bad.num_sms = 0;
        let e = EpWorld::for_rank(bad, 0, 0, Box::new(Unreachable))
            .err()
            .expect("0 SMs are rejected")
            .to_string();
        assert!(e.contains("`num_sms`"), "{e}");
    }

    proptest! {
        // Any T (past the capacity too), rows of either dtype against a buffer of either, any
        // lengths of rows, scales and routing: `check_inputs` returns the rows to upload exactly
        // when nothing is broken, else an error naming the rank and the first broken argument
        // (T, the rows' dtype, their length, the scales', topk_idx's, probs'), never a panic.
        #[test]
        fn dispatch_inputs_name_the_first_broken_argument(
            buffer_fp8 in any::<bool>(),
            rows_fp8 in any::<bool>(),
            rank in 0usize..2,
            tokens in 0usize..11,
            offsets in proptest::collection::vec(prop_oneof![4 => Just(0i64), 1 => -2i64..3], 4),
        ) {
            let dtype = if buffer_fp8 { RowDtype::Fp8 } else { RowDtype::Bf16 };
            let config = config(dtype);
            let (h, k) = (config.spec.hidden, config.spec.topk);
            let len = |n: usize, i: usize| (n as i64 + offsets[i]).max(0) as usize;
            let (x_len, scales_len) = if rows_fp8 {
                (len(tokens * h, 0), len(tokens * h / 128, 1))
            } else {
                (len(tokens * h, 0), 0)
            };
            let (idx_len, probs_len) = (len(tokens * k, 2), len(tokens * k, 3));
            let x = vec![half::bf16::ONE; x_len];
            let data = vec![0x38u8; x_len];
            let scales = vec![1.0f32; scales_len];
            let rows = if rows_fp8 {
                Rows::Fp8 { data: &data, scales: &scales }
            } else {
                Rows::Bf16(&x)
            };
            let row_bytes = if rows_fp8 { x_len } else { 2 * x_len };
            let want = if tokens > config.spec.max_tokens {
                Some("tokens")
            } else if rows_fp8 != buffer_fp8 || row_bytes != tokens * dtype.row_bytes(h) {
                Some("x")
            } else if scales_len != tokens * dtype.scales_per_row(h) {
                Some("x_scales")
            } else if idx_len != tokens * k {
                Some("topk_idx")
            } else if probs_len != tokens * k {
                Some("probs")
            } else {
                None
            };
            let idx = vec![0i32; idx_len];
            let probs = vec![0.5f32; probs_len];
            match (check_inputs(&config, rank, tokens, rows, &idx, &probs), want) {
                (Ok((bytes, s)), None) => {
                    prop_assert_eq!(bytes.len(), row_bytes);
                    prop_assert_eq!(s.len(), scales_len);
                }
                (Err(e), Some(arg)) => {
                    let text = e.to_string();
                    prop_assert!(text.starts_with(&format!("rank {rank}: `{arg}`")), "{arg}: {text}");
                }
                (got, want) => prop_assert!(false, "got {:?}, expected {:?}", got.map(|_| ()), want),
            }
        }

        // Any number of ranks' T, each within the capacity or not: `check_tokens` accepts exactly
        // one T per rank within the capacity, else names the count or the first rank past it.
        #[test]
        fn token_counts_name_the_rank_past_the_capacity(
            tokens in proptest::collection::vec(0usize..11, 0..4),
        ) {
            let config = config(RowDtype::Bf16);
            let got = check_tokens(&config, 0..2, &tokens).map_err(|e| e.to_string());
            if tokens.len() != 2 {
                prop_assert!(got.unwrap_err().starts_with("rank 0: `tokens` has"));
            } else if let Some(r) = tokens.iter().position(|&t| t > 8) {
                let text = got.unwrap_err();
                prop_assert!(text.starts_with(&format!("rank {r}: `tokens`")), "{}", text);
            } else {
                prop_assert!(got.is_ok());
            }
        }
    }
}
