//! Dispatch / combine with fused permute (SPEC §5) for PyTorch tensors, the CPU reference they
//! are checked against, and the CUDA IPC exchange of one process per GPU.
//!
//! Tensors cross as their metadata ([`TensorArg`]: data pointer, dtype, shape, contiguity,
//! device), read from the torch objects without linking libtorch; every tensor of a call is
//! checked before anything is copied or launched. A call runs on the ranks' own streams,
//! ordered after the caller's stream and back with one event each way: to the caller it is as
//! if it ran on its current stream, and ranks sharing a GPU (virtual ranks) still run together.
//! Tensors are copied into the world's symmetric buffer, where peers read them, and results
//! copied out; the calls block (the output sizes are known when they return).

use half::bf16;
use megamoe_core::permute::{
    combine_backward, combine_with_unpermute_in, dispatch_backward_in, dispatch_with_permute,
    Bf16Rows, CombineOrder as PlanOrder, Fp8Rows, PermuteHandle, PermuteRows, SyncMode as PlanMode,
};
use megamoe_core::preset::Shape;
use megamoe_cuda::interop::{IpcHandle, IpcMapping, IPC_HANDLE_BYTES};
use megamoe_cuda::{DeviceBuffer, Gpu};
use megamoe_ep::{
    BufferSpec, CombineOrder, EpConfig, EpError, EpWorld, Handle, RowDtype, SyncMode,
};

use crate::api::count;
use crate::error::{Error, Result};

impl From<EpError> for Error {
    fn from(e: EpError) -> Self {
        match e {
            EpError::Input { rank, source } => {
                let inner = Error::from(source);
                Error::Value(format!("rank {rank}: {}", inner.message()))
            }
            EpError::Overflow {
                rank,
                needed,
                bound,
            } => Error::Value(format!(
                "num_rows_bound: rank {rank}'s dispatch needs {needed} rows, the bound is \
                 {bound}; no rows were moved"
            )),
            other => Error::Runtime(other.to_string()),
        }
    }
}

/// What a call needs to know of one torch tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorArg {
    pub ptr: u64,
    /// As torch prints it: "torch.bfloat16".
    pub dtype: String,
    pub shape: Vec<i64>,
    pub contiguous: bool,
    /// CUDA device index; None for a tensor elsewhere (the CPU).
    pub cuda_device: Option<usize>,
}

pub const BF16: &str = "torch.bfloat16";
pub const F32: &str = "torch.float32";
pub const I32: &str = "torch.int32";
/// e4m3 codes come as float8_e4m3fn, or as their raw bytes.
pub const FP8: [&str; 2] = ["torch.float8_e4m3fn", "torch.uint8"];

impl TensorArg {
    /// Checks dtype, device, contiguity and shape (`None` dims are free); `arg` names the
    /// tensor in the error (`x[1]`).
    pub fn check(
        &self,
        arg: &str,
        dtypes: &[&str],
        shape: &[Option<usize>],
        device: usize,
    ) -> Result<()> {
        let bad = |reason: String| Err(Error::Value(format!("{arg}: {reason}")));
        if !dtypes.contains(&self.dtype.as_str()) {
            return bad(format!(
                "dtype {} where {} is needed",
                self.dtype,
                dtypes.join(" or ")
            ));
        }
        if self.cuda_device != Some(device) {
            let on = self
                .cuda_device
                .map_or("not on a CUDA device".into(), |d| format!("on cuda:{d}"));
            return bad(format!("{on}, expected cuda:{device} (the rank's GPU)"));
        }
        let want: Vec<String> = shape
            .iter()
            .map(|d| d.map_or("*".into(), |d| d.to_string()))
            .collect();
        let fits = self.shape.len() == shape.len()
            && self
                .shape
                .iter()
                .zip(shape)
                .all(|(&got, want)| got >= 0 && want.is_none_or(|w| got as usize == w));
        if !fits {
            return bad(format!(
                "shape {:?}, expected [{}]",
                self.shape,
                want.join(", ")
            ));
        }
        if !self.contiguous {
            return bad("is not contiguous (call .contiguous() first)".into());
        }
        Ok(())
    }

    /// The first dimension (after [`Self::check`]).
    pub fn rows(&self) -> usize {
        self.shape[0] as usize
    }
}

/// One tensor per rank, or an error naming the list.
fn per_rank<'a>(arg: &str, tensors: &'a [TensorArg], ranks: usize) -> Result<&'a [TensorArg]> {
    if tensors.len() != ranks {
        return Err(Error::Value(format!(
            "{arg}: {} tensors for {ranks} ranks (one per rank)",
            tensors.len()
        )));
    }
    Ok(tensors)
}

pub fn combine_order(order: &str) -> Result<CombineOrder> {
    CombineOrder::by_name(order).ok_or_else(|| {
        Error::Value(format!(
            "order: {order:?} must be \"per_rank\" or \"exact\""
        ))
    })
}

/// The arguments of the world's constructor, as Python passed them.
#[derive(Clone, Debug)]
pub struct WorldArgs<'a> {
    pub num_ranks: i64,
    pub num_experts: i64,
    pub num_topk: i64,
    pub hidden: i64,
    pub num_max_tokens_per_rank: i64,
    pub max_pad_multiple: i64,
    pub dtype: &'a str,
    pub num_sms: Option<i64>,
    pub deadline_ms: Option<i64>,
}

impl WorldArgs<'_> {
    /// The checked configuration (no GPU touched).
    pub fn config(&self) -> Result<EpConfig> {
        let spec = BufferSpec {
            ranks: count("num_ranks", self.num_ranks)?,
            experts: count("num_experts", self.num_experts)?,
            topk: count("num_topk", self.num_topk)?,
            hidden: count("hidden", self.hidden)?,
            max_tokens: count("num_max_tokens_per_rank", self.num_max_tokens_per_rank)?,
            max_pad_multiple: count("max_pad_multiple", self.max_pad_multiple)?,
        };
        spec.validate()?;
        let dtype = match self.dtype {
            "bf16" => RowDtype::Bf16,
            "fp8" => RowDtype::Fp8,
            other => {
                return Err(Error::Value(format!(
                    "dtype: {other:?} must be \"bf16\" or \"fp8\""
                )))
            }
        };
        let mut config = EpConfig::new(spec, dtype);
        if let Some(n) = self.num_sms {
            config.num_sms = count("num_sms", n)?;
            if config.num_sms == 0 {
                return Err(Error::Value("num_sms: must be at least 1".into()));
            }
        }
        if let Some(ms) = self.deadline_ms {
            config.deadline = std::time::Duration::from_millis(count("deadline_ms", ms)? as u64);
        }
        Ok(config)
    }
}

/// A dispatch's routing state on every rank, reused by its combine and both backwards;
/// allocated once ([`World::new_dispatch`]) and refilled by every [`World::dispatch`] into it,
/// so that a captured graph replays on the same one.
pub struct Dispatch {
    handle: Handle,
    /// The world that made it ([`World::id`]).
    world: usize,
    pub tokens: Vec<usize>,
    /// Rows per rank: exact after a blocking dispatch, the caller's bound after a non-blocking
    /// one (the rows past the dispatch's own are then left as they were).
    pub rows: Vec<usize>,
    /// Padded rows per local expert of every rank; None after a non-blocking dispatch (they
    /// stay on the device: [`World::read_dispatch`] copies them out).
    pub tokens_per_expert: Option<Vec<Vec<u32>>>,
}

impl Dispatch {
    /// The sync mode the dispatch ran with, which its combine and backwards keep.
    fn mode(&self) -> SyncMode {
        match self.tokens_per_expert {
            Some(_) => SyncMode::Blocking,
            None => SyncMode::NonBlocking {
                row_bound: self.rows.first().copied().unwrap_or(0),
            },
        }
    }
}

/// One process's world of ranks (virtual ranks where they outnumber the GPUs).
pub struct World {
    ep: EpWorld,
    id: usize,
}

static NEXT_WORLD: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl World {
    pub fn new(args: &WorldArgs) -> Result<World> {
        let config = args.config()?;
        Ok(World {
            ep: EpWorld::new(config)?,
            id: NEXT_WORLD.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        })
    }

    pub fn spec(&self) -> BufferSpec {
        self.ep.config.spec
    }

    pub fn dtype(&self) -> RowDtype {
        self.ep.config.dtype
    }

    /// The torch dtypes of the buffer's rows.
    fn row_dtypes(&self) -> &'static [&'static str] {
        match self.dtype() {
            RowDtype::Bf16 => &[BF16],
            RowDtype::Fp8 => &FP8,
        }
    }

    fn gpu(&self, rank: usize) -> &Gpu {
        &self.ep.rank(rank).gpu
    }

    /// The CUDA device of rank `rank`.
    pub fn device(&self, rank: usize) -> usize {
        self.gpu(rank).ordinal()
    }

    /// The CUDA context rank `rank`'s work runs in (its device's primary context).
    pub fn context_handle(&self, rank: usize) -> Result<u64> {
        Ok(self.gpu(rank).context_handle()?)
    }

    fn check_dispatch(&self, d: &Dispatch) -> Result<()> {
        if d.world != self.id {
            return Err(Error::Value(
                "handle: comes from a dispatch of another buffer".into(),
            ));
        }
        Ok(())
    }

    /// As [`Self::check_dispatch`], for calls that use what a dispatch left in it.
    fn check_filled(&self, d: &Dispatch) -> Result<()> {
        self.check_dispatch(d)?;
        if d.rows.len() != self.ep.ranks() {
            return Err(Error::Value("handle: no dispatch has filled it yet".into()));
        }
        Ok(())
    }

    /// Runs `body` with every rank's stream ordered after `streams[rank]` (the caller's
    /// current stream on that rank's device), and the caller's streams ordered after it.
    fn on_streams(&self, streams: &[u64], body: impl FnOnce() -> Result<()>) -> Result<()> {
        if streams.len() != self.ep.ranks() {
            return Err(Error::Value(format!(
                "streams: {} for {} ranks",
                streams.len(),
                self.ep.ranks()
            )));
        }
        for (r, &s) in streams.iter().enumerate() {
            self.gpu(r).wait_for(s)?;
        }
        let result = body();
        for (r, &s) in streams.iter().enumerate() {
            self.gpu(r).release_to(s)?;
        }
        result
    }

    /// Copies `bytes` from `src` to `dst` on rank `rank`'s stream.
    fn copy(&self, rank: usize, dst: u64, src: u64, bytes: usize) -> Result<()> {
        // SAFETY: every torch tensor was checked (device, shape, dtype, contiguity) to hold
        // `bytes`, and every buffer offset lies inside the world's allocations; the caller's
        // stream waits for these copies before it can free the tensors.
        unsafe { self.gpu(rank).copy_raw(dst, src, bytes)? };
        Ok(())
    }

    /// A routing state for [`Self::dispatch`] (device memory: allocate it before capturing).
    pub fn new_dispatch(&self) -> Result<Dispatch> {
        Ok(Dispatch {
            handle: self.ep.new_handle()?,
            world: self.id,
            tokens: vec![],
            rows: vec![],
            tokens_per_expert: Some(vec![]),
        })
    }

    /// Reports the first failure of the non-blocking calls since the last sync (an overflow of
    /// the row bound, bad routing, a wait past its deadline), after waiting for them and for
    /// what the caller's `streams` hold (a replayed graph runs there, not on the ranks' streams).
    pub fn sync(&self, streams: &[u64]) -> Result<()> {
        self.on_streams(streams, || Ok(self.ep.sync()?))
    }

    /// dispatch_with_permute into `d`: `x[r]` `[T_r, H]` (bf16, or e4m3 with `x_scales[r]`
    /// `[T_r, H/128]` f32), `topk_idx[r]` i32 and `probs[r]` f32 `[T_r, K]`. Blocking without
    /// `row_bound` (the sizes are then known); with it, non-blocking and capturable: every rank's
    /// rows must fit the bound, and a failure is reported by the next [`Self::sync`].
    /// [`Self::read_dispatch`] then copies the rows out.
    #[allow(clippy::too_many_arguments)]
    pub fn dispatch(
        &self,
        d: &mut Dispatch,
        x: &[TensorArg],
        x_scales: &[TensorArg],
        topk_idx: &[TensorArg],
        probs: &[TensorArg],
        pad_multiple: i64,
        row_bound: Option<i64>,
        streams: &[u64],
    ) -> Result<()> {
        self.check_dispatch(d)?;
        let s = self.spec();
        let mode = match row_bound {
            None => SyncMode::Blocking,
            Some(b) => {
                let b = count("num_rows_bound", b)?;
                if b > s.max_rows() {
                    return Err(Error::Value(format!(
                        "num_rows_bound: {b} exceeds the buffer's {} rows",
                        s.max_rows()
                    )));
                }
                SyncMode::NonBlocking { row_bound: b }
            }
        };
        let (h, k, ranks) = (s.hidden, s.topk, s.ranks);
        let dtype = self.dtype();
        let x = per_rank("x", x, ranks)?;
        let idx = per_rank("topk_idx", topk_idx, ranks)?;
        let probs = per_rank("probs", probs, ranks)?;
        let x_scales = match dtype {
            RowDtype::Fp8 => per_rank("x_scales", x_scales, ranks)?,
            RowDtype::Bf16 if x_scales.is_empty() => x_scales,
            RowDtype::Bf16 => {
                return Err(Error::Value(
                    "x_scales: given to a bf16 buffer (only fp8 rows carry scales)".into(),
                ))
            }
        };
        let pad_multiple = count("pad_multiple", pad_multiple)?;
        let mut tokens = Vec::with_capacity(ranks);
        for r in 0..ranks {
            let dev = self.device(r);
            x[r].check(&format!("x[{r}]"), self.row_dtypes(), &[None, Some(h)], dev)?;
            let t = x[r].rows();
            if t > s.max_tokens {
                return Err(Error::Value(format!(
                    "x[{r}]: {t} tokens exceed num_max_tokens_per_rank = {}",
                    s.max_tokens
                )));
            }
            if dtype == RowDtype::Fp8 {
                x_scales[r].check(
                    &format!("x_scales[{r}]"),
                    &[F32],
                    &[Some(t), Some(h / 128)],
                    dev,
                )?;
            }
            idx[r].check(&format!("topk_idx[{r}]"), &[I32], &[Some(t), Some(k)], dev)?;
            probs[r].check(&format!("probs[{r}]"), &[F32], &[Some(t), Some(k)], dev)?;
            tokens.push(t);
        }
        // Unfilled until the dispatch succeeds: a failed one leaves nothing to combine.
        d.rows.clear();
        let mut sizes = None;
        self.on_streams(streams, || {
            for r in 0..ranks {
                let p = self.ep.ptrs(r);
                let t = tokens[r];
                self.copy(r, p.x, x[r].ptr, t * dtype.row_bytes(h))?;
                if dtype == RowDtype::Fp8 {
                    self.copy(r, p.x_scales, x_scales[r].ptr, t * (h / 128) * 4)?;
                }
                self.copy(r, p.topk_idx, idx[r].ptr, t * k * 4)?;
                self.copy(r, p.probs, probs[r].ptr, t * k * 4)?;
            }
            sizes = self
                .ep
                .dispatch_with_permute(&tokens, pad_multiple, mode, &mut d.handle)?;
            Ok(())
        })?;
        d.tokens = tokens;
        match (sizes, mode) {
            (Some(sizes), _) => {
                d.rows = sizes.iter().map(|d| d.rows).collect();
                d.tokens_per_expert =
                    Some(sizes.into_iter().map(|d| d.tokens_per_expert).collect());
            }
            (None, SyncMode::NonBlocking { row_bound }) => {
                d.rows = vec![row_bound; ranks];
                d.tokens_per_expert = None;
            }
            (None, SyncMode::Blocking) => unreachable!("a blocking dispatch reports its sizes"),
        }
        Ok(())
    }

    /// Copies the rows of the last dispatch (`d`) out: `rows[r]` `[rows_r, H]` (the buffer's
    /// dtype), `scales[r]` `[rows_r, H/128]` f32 (fp8), `probs[r]` `[rows_r]` f32, and, when
    /// given, `tokens_per_expert[r]` i32 `[E_l]` (the padded rows of each local expert).
    #[allow(clippy::too_many_arguments)]
    pub fn read_dispatch(
        &self,
        d: &Dispatch,
        rows: &[TensorArg],
        scales: &[TensorArg],
        probs: &[TensorArg],
        tokens_per_expert: &[TensorArg],
        streams: &[u64],
    ) -> Result<()> {
        self.check_filled(d)?;
        let s = self.spec();
        let (h, ranks, dtype) = (s.hidden, s.ranks, self.dtype());
        let rows = per_rank("rows", rows, ranks)?;
        let probs = per_rank("probs", probs, ranks)?;
        let scales = match dtype {
            RowDtype::Fp8 => per_rank("scales", scales, ranks)?,
            RowDtype::Bf16 => scales,
        };
        let counts = match tokens_per_expert.is_empty() {
            true => tokens_per_expert,
            false => per_rank("tokens_per_expert", tokens_per_expert, ranks)?,
        };
        let local = s.local_experts();
        for r in 0..ranks {
            let (dev, n) = (self.device(r), d.rows[r]);
            if let Some(c) = counts.get(r) {
                c.check(
                    &format!("tokens_per_expert[{r}]"),
                    &[I32],
                    &[Some(local)],
                    dev,
                )?;
            }
            rows[r].check(
                &format!("rows[{r}]"),
                self.row_dtypes(),
                &[Some(n), Some(h)],
                dev,
            )?;
            if dtype == RowDtype::Fp8 {
                scales[r].check(
                    &format!("scales[{r}]"),
                    &[F32],
                    &[Some(n), Some(h / 128)],
                    dev,
                )?;
            }
            probs[r].check(&format!("probs[{r}]"), &[F32], &[Some(n)], dev)?;
        }
        self.on_streams(streams, || {
            for r in 0..ranks {
                let (p, n) = (self.ep.ptrs(r), d.rows[r]);
                self.copy(r, rows[r].ptr, p.out_rows, n * dtype.row_bytes(h))?;
                if dtype == RowDtype::Fp8 {
                    self.copy(r, scales[r].ptr, p.out_scales, n * (h / 128) * 4)?;
                }
                self.copy(r, probs[r].ptr, p.out_probs, n * 4)?;
                if let Some(c) = counts.get(r) {
                    let padded = self.ep.handle_ptrs(&d.handle, r).padded;
                    self.copy(r, c.ptr, padded, local * 4)?;
                }
            }
            Ok(())
        })
    }

    /// combine_with_unpermute (blocking) of `rows[r]` bf16 `[rows_r, H]` into `y[r]` bf16
    /// `[T_r, H]` in `order`. With `prob_grads` (`[rows_r]` f32) and `grad_probs` (`[T_r, K]`
    /// f32) it is dispatch's backward: the prob gradients are scattered back too.
    #[allow(clippy::too_many_arguments)]
    pub fn combine(
        &self,
        d: &Dispatch,
        rows: &[TensorArg],
        prob_grads: Option<(&[TensorArg], &[TensorArg])>,
        order: &str,
        y: &[TensorArg],
        streams: &[u64],
    ) -> Result<()> {
        self.check_filled(d)?;
        let order = combine_order(order)?;
        let s = self.spec();
        let (h, k, ranks) = (s.hidden, s.topk, s.ranks);
        let rows = per_rank("rows", rows, ranks)?;
        let y = per_rank("y", y, ranks)?;
        let grads = match prob_grads {
            Some((g, out)) => Some((
                per_rank("prob_grads", g, ranks)?,
                per_rank("grad_probs", out, ranks)?,
            )),
            None => None,
        };
        for r in 0..ranks {
            let (dev, n, t) = (self.device(r), d.rows[r], d.tokens[r]);
            rows[r].check(&format!("rows[{r}]"), &[BF16], &[Some(n), Some(h)], dev)?;
            y[r].check(&format!("y[{r}]"), &[BF16], &[Some(t), Some(h)], dev)?;
            if let Some((g, out)) = grads {
                g[r].check(&format!("prob_grads[{r}]"), &[F32], &[Some(n)], dev)?;
                out[r].check(
                    &format!("grad_probs[{r}]"),
                    &[F32],
                    &[Some(t), Some(k)],
                    dev,
                )?;
            }
        }
        self.on_streams(streams, || {
            for r in 0..ranks {
                let (p, n) = (self.ep.ptrs(r), d.rows[r]);
                self.copy(r, p.comb_rows, rows[r].ptr, n * h * 2)?;
                if let Some((g, _)) = grads {
                    self.copy(r, p.comb_prob_grads, g[r].ptr, n * 4)?;
                }
            }
            self.ep
                .combine(&d.handle, grads.is_some(), order, d.mode())?;
            for r in 0..ranks {
                let (p, t) = (self.ep.ptrs(r), d.tokens[r]);
                self.copy(r, y[r].ptr, p.y, t * h * 2)?;
                if let Some((_, out)) = grads {
                    self.copy(r, out[r].ptr, p.grad_probs, t * k * 4)?;
                }
            }
            Ok(())
        })
    }

    /// Combine's backward (blocking): `grad_y[r]` bf16 `[T_r, H]` dispatched along `d`'s
    /// routing into `grad_rows[r]` bf16 `[rows_r, H]` (padding rows zero).
    pub fn combine_backward(
        &self,
        d: &Dispatch,
        grad_y: &[TensorArg],
        grad_rows: &[TensorArg],
        streams: &[u64],
    ) -> Result<()> {
        self.check_filled(d)?;
        let s = self.spec();
        let (h, ranks) = (s.hidden, s.ranks);
        let grad_y = per_rank("grad_y", grad_y, ranks)?;
        let grad_rows = per_rank("grad_rows", grad_rows, ranks)?;
        for r in 0..ranks {
            let (dev, n, t) = (self.device(r), d.rows[r], d.tokens[r]);
            grad_y[r].check(&format!("grad_y[{r}]"), &[BF16], &[Some(t), Some(h)], dev)?;
            grad_rows[r].check(
                &format!("grad_rows[{r}]"),
                &[BF16],
                &[Some(n), Some(h)],
                dev,
            )?;
        }
        self.on_streams(streams, || {
            for (r, g) in grad_y.iter().enumerate() {
                self.copy(r, self.ep.ptrs(r).x, g.ptr, d.tokens[r] * h * 2)?;
            }
            self.ep.combine_backward(&d.handle, d.mode())?;
            for (r, g) in grad_rows.iter().enumerate() {
                self.copy(r, g.ptr, self.ep.ptrs(r).out_rows, d.rows[r] * h * 2)?;
            }
            Ok(())
        })
    }
}

/// Inputs of [`reference()`]: one entry per rank, little-endian bytes as torch stores them.
pub struct ReferenceInputs {
    pub hidden: usize,
    pub experts: usize,
    pub topk: usize,
    pub pad_multiple: usize,
    /// bf16 `[T, H]`, or e4m3 codes `[T, H]` with `x_scales` f32 `[T, H/128]`.
    pub x: Vec<Vec<u8>>,
    pub x_scales: Option<Vec<Vec<u8>>>,
    pub topk_idx: Vec<Vec<u8>>,
    pub probs: Vec<Vec<u8>>,
    /// Combine input and dispatch-backward row gradients: bf16 `[rows_r, H]`.
    pub rows: Vec<Vec<u8>>,
    /// Dispatch-backward prob gradients, f32 `[rows_r]`.
    pub prob_grads: Vec<Vec<u8>>,
    /// Combine-backward output gradient, bf16 `[T, H]`.
    pub grad_y: Vec<Vec<u8>>,
    pub order: String,
}

/// megamoe-core's answers for [`ReferenceInputs`], per rank, as bytes.
#[derive(Default)]
pub struct ReferenceOutputs {
    pub rows: Vec<Vec<u8>>,
    pub scales: Vec<Vec<u8>>,
    pub probs: Vec<Vec<u8>>,
    pub tokens_per_expert: Vec<Vec<usize>>,
    /// combine_with_unpermute of `rows` in `order`.
    pub y: Vec<Vec<u8>>,
    /// dispatch's backward of (`rows`, `prob_grads`) in `order`.
    pub grad_x: Vec<Vec<u8>>,
    pub grad_probs: Vec<Vec<u8>>,
    /// combine's backward of `grad_y`.
    pub grad_rows: Vec<Vec<u8>>,
}

fn floats(arg: &str, b: &[u8]) -> Result<Vec<f32>> {
    if b.len() % 4 != 0 {
        return Err(Error::Value(format!(
            "{arg}: {} bytes is not whole f32s",
            b.len()
        )));
    }
    Ok(b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect())
}

fn ints(arg: &str, b: &[u8]) -> Result<Vec<i32>> {
    Ok(floats(arg, b)?
        .into_iter()
        .map(|f| f.to_bits() as i32)
        .collect())
}

fn bf16s(arg: &str, b: &[u8], hidden: usize) -> Result<Bf16Rows> {
    if b.len() % (2 * hidden) != 0 {
        return Err(Error::Value(format!(
            "{arg}: {} bytes is not whole rows of {hidden} bf16",
            b.len()
        )));
    }
    Ok(Bf16Rows {
        rows: b.len() / (2 * hidden),
        hidden,
        values: b
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]))
            .collect(),
    })
}

fn bf16_bytes(r: &Bf16Rows) -> Vec<u8> {
    r.values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Decodes every rank's bytes of `arg` with `decode`.
fn each<T>(
    arg: &str,
    ranks: &[Vec<u8>],
    decode: impl Fn(&str, &[u8]) -> Result<T>,
) -> Result<Vec<T>> {
    ranks.iter().map(|b| decode(arg, b)).collect()
}

/// The reference dispatch of `x` into `out`, each rank's rows stored as the bytes (rows,
/// scales) that `to_bytes` gives; returns the handle the combine and backwards reuse.
fn reference_dispatch<M: PermuteRows>(
    shape: Shape,
    x: &[M],
    (idx, probs): (&[Vec<i32>], &[Vec<f32>]),
    pad_multiple: usize,
    out: &mut ReferenceOutputs,
    to_bytes: impl Fn(M) -> (Vec<u8>, Vec<u8>),
) -> Result<PermuteHandle> {
    let (dispatched, handle) =
        dispatch_with_permute(shape, x, idx, probs, pad_multiple, PlanMode::Blocking)?;
    for o in dispatched {
        let (rows, scales) = to_bytes(o.rows);
        out.rows.push(rows);
        out.scales.push(scales);
        out.probs.push(f32_bytes(&o.probs));
        out.tokens_per_expert.push(o.tokens_per_expert);
    }
    Ok(handle)
}

/// megamoe-core's CPU reference of dispatch, combine (in `order`) and both backwards.
pub fn reference(inp: &ReferenceInputs) -> Result<ReferenceOutputs> {
    let shape = Shape {
        hidden: inp.hidden,
        inter: 128,
        experts: inp.experts,
        topk: inp.topk,
    };
    let order = match combine_order(&inp.order)? {
        CombineOrder::PerRank => PlanOrder::PerRank,
        _ => PlanOrder::Exact,
    };
    let h = inp.hidden;
    let rows_of = |arg: &str, b: &[u8]| bf16s(arg, b, h);
    let idx = each("topk_idx", &inp.topk_idx, ints)?;
    let probs = each("probs", &inp.probs, floats)?;
    let routing = (idx.as_slice(), probs.as_slice());
    let pad = inp.pad_multiple;
    let mut out = ReferenceOutputs::default();
    let handle = match &inp.x_scales {
        None => {
            let x = each("x", &inp.x, rows_of)?;
            reference_dispatch(shape, &x, routing, pad, &mut out, |rows| {
                (bf16_bytes(&rows), vec![])
            })?
        }
        Some(scales) => {
            let x = inp
                .x
                .iter()
                .zip(scales)
                .map(|(codes, s)| {
                    Ok(Fp8Rows {
                        rows: codes.len() / h,
                        hidden: h,
                        codes: codes.clone(),
                        scales: floats("x_scales", s)?,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            reference_dispatch(shape, &x, routing, pad, &mut out, |rows| {
                (rows.codes, f32_bytes(&rows.scales))
            })?
        }
    };
    let rows = each("rows", &inp.rows, rows_of)?;
    let prob_grads = each("prob_grads", &inp.prob_grads, floats)?;
    let grad_y = each("grad_y", &inp.grad_y, rows_of)?;
    out.y = combine_with_unpermute_in(&rows, &handle, order)?
        .iter()
        .map(bf16_bytes)
        .collect();
    let grads = dispatch_backward_in(&rows, &prob_grads, &handle, order)?;
    out.grad_x = grads.x.iter().map(bf16_bytes).collect();
    out.grad_probs = grads.probs.iter().map(|p| f32_bytes(p)).collect();
    out.grad_rows = combine_backward(&grad_y, &handle)?
        .iter()
        .map(bf16_bytes)
        .collect();
    Ok(out)
}

/// Symmetric memory of one process per GPU: this process's `cuMemAlloc` buffer, and its peers'
/// buffers opened from their IPC handles (exchanged by the caller, e.g. over
/// torch.distributed).
pub struct IpcBuffer {
    gpu: Gpu,
    local: DeviceBuffer,
    /// Indexed by rank; None for this process's own rank.
    peers: Vec<Option<IpcMapping>>,
    rank: usize,
}

/// What one process publishes: its allocation's IPC handle and the GPU it lives on.
pub struct IpcPeer {
    pub handle: Vec<u8>,
    pub pci_bus_id: String,
}

impl IpcBuffer {
    /// `bytes` of zeroed device memory on CUDA device `device`.
    pub fn new(device: i64, bytes: i64) -> Result<IpcBuffer> {
        let device = count("device", device)?;
        let bytes = count("bytes", bytes)?;
        if bytes == 0 {
            return Err(Error::Value("bytes: must be at least 1".into()));
        }
        let gpu = Gpu::new(device)?;
        let local = gpu.alloc_zeroed(bytes)?;
        Ok(IpcBuffer {
            gpu,
            local,
            peers: vec![],
            rank: 0,
        })
    }

    /// What this process gives its peers.
    pub fn export(&self) -> Result<IpcPeer> {
        Ok(IpcPeer {
            handle: self.local.ipc_handle()?.to_vec(),
            pci_bus_id: self.gpu.pci_bus_id()?,
        })
    }

    /// Opens every peer's buffer; `peers[rank]` is this process's own entry (skipped). Fails,
    /// naming the rank, when this GPU cannot reach a peer's.
    pub fn open(&mut self, rank: i64, peers: &[IpcPeer]) -> Result<()> {
        let rank = count("rank", rank)?;
        if rank >= peers.len() {
            return Err(Error::Value(format!(
                "rank: {rank} is outside the {} peers",
                peers.len()
            )));
        }
        let me = self.gpu.pci_bus_id()?;
        let mut opened = Vec::with_capacity(peers.len());
        for (r, p) in peers.iter().enumerate() {
            if r == rank {
                opened.push(None);
                continue;
            }
            let handle: IpcHandle = p.handle.as_slice().try_into().map_err(|_| {
                Error::Value(format!(
                    "peers[{r}]: a handle of {} bytes, expected {IPC_HANDLE_BYTES}",
                    p.handle.len()
                ))
            })?;
            if !self.gpu.can_access_bus(&p.pci_bus_id)? {
                return Err(Error::Runtime(format!(
                    "rank {rank}: GPU {me} has no peer access to GPU {} of rank {r} \
                     (no NVLink or PCIe peer path): symmetric memory needs one",
                    p.pci_bus_id
                )));
            }
            let mapping = IpcMapping::open(&self.gpu, &handle).map_err(|e| {
                Error::Runtime(format!("rank {rank}: opening rank {r}'s buffer: {e}"))
            })?;
            opened.push(Some(mapping));
        }
        self.peers = opened;
        self.rank = rank;
        Ok(())
    }

    /// The device address of rank `rank`'s buffer in this process.
    pub fn ptr(&self, rank: i64) -> Result<u64> {
        let r = count("rank", rank)?;
        if r == self.rank {
            return Ok(self.local.ptr());
        }
        match self.peers.get(r) {
            Some(Some(m)) => Ok(m.ptr()),
            _ => Err(Error::Value(format!(
                "rank: {rank} is not an opened peer ({} ranks opened)",
                self.peers.len()
            ))),
        }
    }

    pub fn bytes(&self) -> usize {
        self.local.bytes()
    }

    /// Copies `bytes` between two device addresses on this GPU's stream, ordered after the
    /// caller's `stream` and back (for tests and small transfers).
    ///
    /// # Safety
    /// Both ranges must be live device memory mapped in this process.
    pub unsafe fn copy(&self, dst: u64, src: u64, bytes: usize, stream: u64) -> Result<()> {
        self.gpu.wait_for(stream)?;
        // SAFETY: the caller's contract.
        unsafe { self.gpu.copy_raw(dst, src, bytes)? };
        self.gpu.release_to(stream)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(dtype: &str, shape: &[i64]) -> TensorArg {
        TensorArg {
            ptr: 0x1000,
            dtype: dtype.into(),
            shape: shape.to_vec(),
            contiguous: true,
            cuda_device: Some(0),
        }
    }

    #[test]
    fn tensor_checks_name_the_argument_and_what_is_wrong() {
        let ok = t(BF16, &[3, 256]);
        assert!(ok.check("x[0]", &[BF16], &[None, Some(256)], 0).is_ok());
        let err = |a: TensorArg| match a.check("x[1]", &[BF16], &[None, Some(256)], 0) {
            Err(Error::Value(m)) => m,
            other => panic!("{other:?}"),
        };
        assert!(err(t(F32, &[3, 256])).starts_with("x[1]: dtype torch.float32"));
        assert!(err(t(BF16, &[3, 128])).contains("expected [*, 256]"));
        assert!(err(t(BF16, &[256])).contains("shape"));
        let strided = TensorArg {
            contiguous: false,
            ..ok.clone()
        };
        assert!(err(strided).contains("not contiguous"));
        let cpu = TensorArg {
            cuda_device: None,
            ..ok.clone()
        };
        assert!(err(cpu).contains("not on a CUDA device"));
        let other_gpu = TensorArg {
            cuda_device: Some(1),
            ..ok
        };
        assert!(err(other_gpu).contains("on cuda:1, expected cuda:0"));
    }

    #[test]
    fn bad_world_arguments_are_value_errors_before_any_gpu_is_touched() {
        let args = WorldArgs {
            num_ranks: 2,
            num_experts: 64,
            num_topk: 6,
            hidden: 512,
            num_max_tokens_per_rank: 128,
            max_pad_multiple: 128,
            dtype: "bf16",
            num_sms: None,
            deadline_ms: None,
        };
        assert!(args.config().is_ok());
        let value = |a: WorldArgs| match a.config() {
            Err(Error::Value(m)) => m,
            other => panic!("{:?}", other.map(|c| c.spec)),
        };
        assert!(value(WorldArgs {
            hidden: 100,
            ..args.clone()
        })
        .contains("hidden"));
        assert!(value(WorldArgs {
            num_ranks: -1,
            ..args.clone()
        })
        .starts_with("num_ranks: "));
        assert!(value(WorldArgs {
            dtype: "fp16",
            ..args.clone()
        })
        .starts_with("dtype: "));
        assert!(value(WorldArgs {
            num_sms: Some(0),
            ..args
        })
        .starts_with("num_sms: "));
        assert!(matches!(combine_order("sum"), Err(Error::Value(m)) if m.starts_with("order: ")));
    }

    #[test]
    fn the_reference_runs_both_orders_and_round_trips_the_bytes() {
        // 2 ranks of 2 tokens, 4 experts (2 per rank), top-2, H = 128.
        let h = 128;
        let x: Vec<Vec<u8>> = (0..2)
            .map(|r| {
                let v: Vec<bf16> = (0..2 * h)
                    .map(|i| bf16::from_f32((i + r) as f32 / 8.0))
                    .collect();
                bf16_bytes(&Bf16Rows {
                    rows: 2,
                    hidden: h,
                    values: v,
                })
            })
            .collect();
        let idx = |v: [i32; 4]| v.iter().flat_map(|i| i.to_le_bytes()).collect::<Vec<u8>>();
        let topk_idx = vec![idx([0, 1, 2, 3]), idx([1, -1, 0, 3])];
        let probs = vec![f32_bytes(&[0.5; 4]); 2];
        let mut inp = ReferenceInputs {
            hidden: h,
            experts: 4,
            topk: 2,
            pad_multiple: 1,
            x,
            x_scales: None,
            topk_idx,
            probs,
            rows: vec![],
            prob_grads: vec![],
            grad_y: vec![vec![0; 2 * h * 2]; 2],
            order: "per_rank".into(),
        };
        // First learn the row counts from a run with no combine rows of the right size.
        let plan_rows: Vec<usize> = {
            let idx = inp
                .topk_idx
                .iter()
                .map(|b| ints("topk_idx", b).unwrap())
                .collect::<Vec<_>>();
            let h = megamoe_core::permute::plan_permute(
                Shape {
                    hidden: h,
                    inter: 128,
                    experts: 4,
                    topk: 2,
                },
                &idx,
                1,
                PlanMode::Blocking,
            )
            .unwrap();
            h.plans.iter().map(|p| p.output_rows()).collect()
        };
        inp.rows = plan_rows.iter().map(|&n| vec![0x3f; n * h * 2]).collect();
        inp.prob_grads = plan_rows
            .iter()
            .map(|&n| f32_bytes(&vec![1.0; n]))
            .collect();
        let out = reference(&inp).unwrap();
        assert_eq!(out.rows.len(), 2);
        assert_eq!(out.y[0].len(), 2 * h * 2);
        assert_eq!(out.grad_probs[1], f32_bytes(&[1.0, 0.0, 1.0, 1.0]));
        inp.order = "exact".into();
        assert!(reference(&inp).is_ok());
    }
}

/// The Python classes and functions (left out of the unit tests, which run without libpython).
#[cfg(not(test))]
pub mod py {
    use pyo3::prelude::*;
    use pyo3::types::{PyBytes, PyDict, PyList};

    use super::*;

    /// A torch tensor's metadata; anything else is a ValueError naming `arg`.
    fn tensor(arg: &str, obj: &Bound<'_, PyAny>) -> PyResult<TensorArg> {
        let read = || -> PyResult<TensorArg> {
            let device = obj.getattr("device")?;
            let kind: String = device.getattr("type")?.extract()?;
            let index: Option<usize> = device.getattr("index")?.extract()?;
            Ok(TensorArg {
                ptr: obj.call_method0("data_ptr")?.extract()?,
                dtype: obj.getattr("dtype")?.str()?.to_string(),
                shape: obj.getattr("shape")?.extract()?,
                contiguous: obj.call_method0("is_contiguous")?.extract()?,
                cuda_device: if kind == "cuda" {
                    Some(index.unwrap_or(0))
                } else {
                    None
                },
            })
        };
        read().map_err(|_| {
            let ty = obj.get_type().name().map_or("?".into(), |n| n.to_string());
            Error::Value(format!("{arg}: expected a torch tensor, got {ty}")).into()
        })
    }

    fn tensors(arg: &str, list: &Bound<'_, PyAny>) -> PyResult<Vec<TensorArg>> {
        let list = list.cast::<PyList>().map_err(|_| {
            Error::Value(format!("{arg}: expected a list of tensors, one per rank"))
        })?;
        list.iter()
            .enumerate()
            .map(|(r, t)| tensor(&format!("{arg}[{r}]"), &t))
            .collect()
    }

    fn optional(arg: &str, list: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<TensorArg>> {
        list.map_or(Ok(vec![]), |l| tensors(arg, l))
    }

    /// One process's expert-parallel world (see python/megamoe/ep.py, which wraps it).
    #[pyclass(name = "EpWorld", module = "megamoe._megamoe")]
    pub struct PyWorld {
        world: World,
    }

    /// A dispatch's routing state (see python/megamoe/ep.py).
    #[pyclass(name = "EpHandle", module = "megamoe._megamoe")]
    pub struct PyDispatch {
        d: Dispatch,
    }

    #[pymethods]
    impl PyDispatch {
        #[getter]
        fn num_tokens(&self) -> Vec<usize> {
            self.d.tokens.clone()
        }
        #[getter]
        fn num_rows(&self) -> Vec<usize> {
            self.d.rows.clone()
        }
        /// None after a non-blocking dispatch (the counts stay on the device).
        #[getter]
        fn tokens_per_expert(&self) -> Option<Vec<Vec<u32>>> {
            self.d.tokens_per_expert.clone()
        }
    }

    #[pymethods]
    impl PyWorld {
        #[new]
        #[pyo3(signature = (
            num_ranks, num_experts, num_topk, hidden, num_max_tokens_per_rank,
            max_pad_multiple = 128, dtype = "bf16", num_sms = None, deadline_ms = None
        ))]
        #[allow(clippy::too_many_arguments)]
        fn new(
            num_ranks: i64,
            num_experts: i64,
            num_topk: i64,
            hidden: i64,
            num_max_tokens_per_rank: i64,
            max_pad_multiple: i64,
            dtype: &str,
            num_sms: Option<i64>,
            deadline_ms: Option<i64>,
        ) -> PyResult<Self> {
            let world = World::new(&WorldArgs {
                num_ranks,
                num_experts,
                num_topk,
                hidden,
                num_max_tokens_per_rank,
                max_pad_multiple,
                dtype,
                num_sms,
                deadline_ms,
            })?;
            Ok(PyWorld { world })
        }

        #[getter]
        fn num_ranks(&self) -> usize {
            self.world.spec().ranks
        }
        #[getter]
        fn num_experts(&self) -> usize {
            self.world.spec().experts
        }
        #[getter]
        fn num_topk(&self) -> usize {
            self.world.spec().topk
        }
        #[getter]
        fn hidden(&self) -> usize {
            self.world.spec().hidden
        }
        #[getter]
        fn dtype(&self) -> &'static str {
            match self.world.dtype() {
                RowDtype::Bf16 => "bf16",
                RowDtype::Fp8 => "fp8",
            }
        }
        fn device(&self, rank: usize) -> usize {
            self.world.device(rank)
        }
        fn context_handle(&self, rank: usize) -> PyResult<u64> {
            Ok(self.world.context_handle(rank)?)
        }

        /// A routing state to dispatch into (allocates: do it before capturing a graph).
        fn new_handle(&self) -> PyResult<PyDispatch> {
            Ok(PyDispatch {
                d: self.world.new_dispatch()?,
            })
        }

        /// Waits for the calls (and the caller's `streams`), then raises the first failure of
        /// the non-blocking ones.
        fn sync(&self, py: Python<'_>, streams: Vec<u64>) -> PyResult<()> {
            Ok(py.detach(|| self.world.sync(&streams))?)
        }

        #[pyo3(signature = (handle, x, x_scales, topk_idx, probs, pad_multiple, num_rows_bound, streams))]
        #[allow(clippy::too_many_arguments)]
        fn dispatch(
            &self,
            py: Python<'_>,
            mut handle: PyRefMut<'_, PyDispatch>,
            x: &Bound<'_, PyAny>,
            x_scales: Option<&Bound<'_, PyAny>>,
            topk_idx: &Bound<'_, PyAny>,
            probs: &Bound<'_, PyAny>,
            pad_multiple: i64,
            num_rows_bound: Option<i64>,
            streams: Vec<u64>,
        ) -> PyResult<()> {
            let (x, xs) = (tensors("x", x)?, optional("x_scales", x_scales)?);
            let (idx, p) = (tensors("topk_idx", topk_idx)?, tensors("probs", probs)?);
            let d = &mut handle.d;
            Ok(py.detach(|| {
                self.world
                    .dispatch(d, &x, &xs, &idx, &p, pad_multiple, num_rows_bound, &streams)
            })?)
        }

        #[pyo3(signature = (handle, rows, scales, probs, tokens_per_expert, streams))]
        #[allow(clippy::too_many_arguments)]
        fn read_dispatch(
            &self,
            py: Python<'_>,
            handle: &PyDispatch,
            rows: &Bound<'_, PyAny>,
            scales: Option<&Bound<'_, PyAny>>,
            probs: &Bound<'_, PyAny>,
            tokens_per_expert: Option<&Bound<'_, PyAny>>,
            streams: Vec<u64>,
        ) -> PyResult<()> {
            let (rows, scales) = (tensors("rows", rows)?, optional("scales", scales)?);
            let probs = tensors("probs", probs)?;
            let counts = optional("tokens_per_expert", tokens_per_expert)?;
            let d = &handle.d;
            Ok(py.detach(|| {
                self.world
                    .read_dispatch(d, &rows, &scales, &probs, &counts, &streams)
            })?)
        }

        #[pyo3(signature = (handle, rows, order, y, streams, prob_grads = None, grad_probs = None))]
        #[allow(clippy::too_many_arguments)]
        fn combine(
            &self,
            py: Python<'_>,
            handle: &PyDispatch,
            rows: &Bound<'_, PyAny>,
            order: &str,
            y: &Bound<'_, PyAny>,
            streams: Vec<u64>,
            prob_grads: Option<&Bound<'_, PyAny>>,
            grad_probs: Option<&Bound<'_, PyAny>>,
        ) -> PyResult<()> {
            let (rows, y) = (tensors("rows", rows)?, tensors("y", y)?);
            let grads = match (prob_grads, grad_probs) {
                (Some(g), Some(out)) => {
                    Some((tensors("prob_grads", g)?, tensors("grad_probs", out)?))
                }
                (None, None) => None,
                _ => {
                    return Err(Error::Value(
                        "prob_grads: given without grad_probs, or the other way round".into(),
                    )
                    .into())
                }
            };
            let d = &handle.d;
            let grads = grads.as_ref().map(|(g, o)| (g.as_slice(), o.as_slice()));
            Ok(py.detach(|| self.world.combine(d, &rows, grads, order, &y, &streams))?)
        }

        fn combine_backward(
            &self,
            py: Python<'_>,
            handle: &PyDispatch,
            grad_y: &Bound<'_, PyAny>,
            grad_rows: &Bound<'_, PyAny>,
            streams: Vec<u64>,
        ) -> PyResult<()> {
            let (gy, gr) = (tensors("grad_y", grad_y)?, tensors("grad_rows", grad_rows)?);
            let d = &handle.d;
            Ok(py.detach(|| self.world.combine_backward(d, &gy, &gr, &streams))?)
        }
    }

    fn bytes_list<'py>(py: Python<'py>, v: &[Vec<u8>]) -> Vec<Bound<'py, PyBytes>> {
        v.iter().map(|b| PyBytes::new(py, b)).collect()
    }

    /// megamoe-core's CPU reference of dispatch_with_permute, combine_with_unpermute in `order`,
    /// dispatch's backward (of `rows`, `prob_grads`) and combine's backward (of `grad_y`).
    /// Every list holds one bytes object per rank, little-endian as torch stores the tensors.
    #[pyfunction]
    #[pyo3(signature = (
        hidden, num_experts, num_topk, pad_multiple, x, x_scales, topk_idx, probs, rows,
        prob_grads, grad_y, order
    ))]
    #[allow(clippy::too_many_arguments)]
    fn ep_reference<'py>(
        py: Python<'py>,
        hidden: usize,
        num_experts: usize,
        num_topk: usize,
        pad_multiple: usize,
        x: Vec<Vec<u8>>,
        x_scales: Option<Vec<Vec<u8>>>,
        topk_idx: Vec<Vec<u8>>,
        probs: Vec<Vec<u8>>,
        rows: Vec<Vec<u8>>,
        prob_grads: Vec<Vec<u8>>,
        grad_y: Vec<Vec<u8>>,
        order: String,
    ) -> PyResult<Bound<'py, PyDict>> {
        let inp = ReferenceInputs {
            hidden,
            experts: num_experts,
            topk: num_topk,
            pad_multiple,
            x,
            x_scales,
            topk_idx,
            probs,
            rows,
            prob_grads,
            grad_y,
            order,
        };
        let out = py.detach(|| reference(&inp))?;
        let d = PyDict::new(py);
        d.set_item("rows", bytes_list(py, &out.rows))?;
        d.set_item("scales", bytes_list(py, &out.scales))?;
        d.set_item("probs", bytes_list(py, &out.probs))?;
        d.set_item("tokens_per_expert", out.tokens_per_expert)?;
        d.set_item("y", bytes_list(py, &out.y))?;
        d.set_item("grad_x", bytes_list(py, &out.grad_x))?;
        d.set_item("grad_probs", bytes_list(py, &out.grad_probs))?;
        d.set_item("grad_rows", bytes_list(py, &out.grad_rows))?;
        Ok(d)
    }

    /// This process's part of symmetric memory over CUDA IPC (see python/megamoe/ep.py).
    #[pyclass(name = "IpcBuffer", module = "megamoe._megamoe")]
    pub struct PyIpcBuffer {
        buf: IpcBuffer,
    }

    #[pymethods]
    impl PyIpcBuffer {
        #[new]
        fn new(device: i64, bytes: i64) -> PyResult<Self> {
            Ok(PyIpcBuffer {
                buf: IpcBuffer::new(device, bytes)?,
            })
        }

        /// (IPC handle bytes, PCI bus id) to send to the peers.
        fn export<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyBytes>, String)> {
            let p = self.buf.export()?;
            Ok((PyBytes::new(py, &p.handle), p.pci_bus_id))
        }

        /// Opens every peer's buffer from the gathered `export()` pairs (index = rank).
        fn open(&mut self, rank: i64, peers: Vec<(Vec<u8>, String)>) -> PyResult<()> {
            let peers: Vec<IpcPeer> = peers
                .into_iter()
                .map(|(handle, pci_bus_id)| IpcPeer { handle, pci_bus_id })
                .collect();
            Ok(self.buf.open(rank, &peers)?)
        }

        fn ptr(&self, rank: i64) -> PyResult<u64> {
            Ok(self.buf.ptr(rank)?)
        }

        #[getter]
        fn nbytes(&self) -> usize {
            self.buf.bytes()
        }

        /// Copies `bytes` from rank `src_rank`'s buffer (byte `src_offset`) into `dst`, or from
        /// `src` into rank `dst_rank`'s buffer, ordered on the caller's `stream`.
        #[pyo3(signature = (tensor, rank, offset, to_buffer, stream))]
        fn copy(
            &self,
            tensor: &Bound<'_, PyAny>,
            rank: i64,
            offset: i64,
            to_buffer: bool,
            stream: u64,
        ) -> PyResult<()> {
            let t = tensor_any_device("tensor", tensor)?;
            let offset = count("offset", offset)?;
            let bytes = t.1;
            if offset
                .checked_add(bytes)
                .is_none_or(|end| end > self.buf.bytes())
            {
                return Err(Error::Value(format!(
                    "tensor: {bytes} bytes at offset {offset} exceed the buffer's {}",
                    self.buf.bytes()
                ))
                .into());
            }
            let at = self.buf.ptr(rank)? + offset as u64;
            let (dst, src) = if to_buffer { (at, t.0) } else { (t.0, at) };
            // SAFETY: the tensor is a contiguous CUDA tensor of `bytes` bytes; the range lies in
            // the buffer of an opened rank.
            unsafe { self.buf.copy(dst, src, bytes, stream)? };
            Ok(())
        }
    }

    /// (data pointer, bytes) of a contiguous CUDA tensor of any dtype.
    fn tensor_any_device(arg: &str, obj: &Bound<'_, PyAny>) -> PyResult<(u64, usize)> {
        let t = tensor(arg, obj)?;
        if t.cuda_device.is_none() || !t.contiguous {
            return Err(Error::Value(format!("{arg}: expected a contiguous CUDA tensor")).into());
        }
        let numel: usize = obj.call_method0("numel")?.extract()?;
        let size: usize = obj.call_method0("element_size")?.extract()?;
        Ok((t.ptr, numel * size))
    }

    pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add_class::<PyWorld>()?;
        m.add_class::<PyDispatch>()?;
        m.add_class::<PyIpcBuffer>()?;
        m.add_function(wrap_pyfunction!(ep_reference, m)?)?;
        Ok(())
    }
}
