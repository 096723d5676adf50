//! Dispatch / combine with fused permute (SPEC §5) for PyTorch tensors, the CPU reference they
//! are checked against, and the CUDA IPC exchange of one process per GPU.
//!
//! Tensors cross as their metadata ([`TensorArg`]: data pointer, dtype, shape,
//! contiguity, device), read from the torch objects without linking libtorch; every tensor of a
//! call is checked before anything is copied or launched. A call runs on the ranks' own streams,
//! ordered after the caller's stream and back with one event each way: to the caller it is as
//! if it ran on its current stream, and ranks sharing a GPU (virtual ranks) still run together.
//! Tensors are copied into the world's symmetric buffer, where peers read them, and results
//! copied out; the calls block (the output sizes are known when they return).
//!
//! Here the world and its calls ([`crate::tensor`] checks their tensor arguments);
//! [`mod@reference`] megamoe-core's CPU answers, [`ipc`] symmetric memory over CUDA IPC and `py`
//! the Python classes.

use std::ops::Range;

use megamoe_cuda::{AllGather, Gpu};
use megamoe_ep::{
    BufferSpec, CombineOrder, CombineOutputs, EpConfig, EpError, EpWorld, Handle, RowDtype,
    SyncMode,
};

use crate::api::{count, process_rank};
use crate::error::{Error, Result};
use crate::tensor::{TensorArg, BF16, F32, FP8, I32};

pub mod ipc;
#[cfg(not(test))]
pub mod py;
pub mod reference;

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
    /// The sync mode the dispatch ran with, which its combine and backwards keep unless the
    /// caller does not `wait` for them (their failures are then reported by the next sync).
    fn mode(&self, wait: bool) -> SyncMode {
        match (&self.tokens_per_expert, wait) {
            (Some(_), true) => SyncMode::Blocking,
            _ => SyncMode::NonBlocking {
                row_bound: self.rows.first().copied().unwrap_or(0),
            },
        }
    }
}

/// The tensors a dispatch's results are copied into, one per local rank each: `rows`
/// `[rows_r, H]` (the buffer's dtype), `scales` `[rows_r, H/128]` f32 (fp8 buffers; none on
/// bf16), `probs` `[rows_r]` f32, and optionally (none, or one per rank) `tokens_per_expert` i32
/// `[E_l]` (the padded rows of each local expert) and `codes` i32 `[1]` (each rank's error code:
/// 0 while every call since the last [`World::sync`] succeeded, else the first failure's code,
/// an overflow of a non-blocking dispatch's row bound among them; `sync` reports and clears it).
#[derive(Clone, Copy)]
pub struct DispatchOut<'a> {
    pub rows: &'a [TensorArg],
    pub scales: &'a [TensorArg],
    pub probs: &'a [TensorArg],
    pub tokens_per_expert: &'a [TensorArg],
    pub codes: &'a [TensorArg],
}

/// One process's ranks of a world: every rank (virtual ranks where they outnumber the GPUs), or
/// the one rank of this process when each process holds one ([`World::for_rank`]). The calls'
/// per-rank tensors and results are the local ranks', in rank order.
pub struct World {
    ep: EpWorld,
    id: usize,
}

static NEXT_WORLD: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl World {
    pub fn new(args: &WorldArgs) -> Result<World> {
        let config = args.config()?;
        Ok(Self::with(EpWorld::new(config)?))
    }

    /// Rank `rank` of a world of `config.spec.ranks` processes, on CUDA device `device`
    /// (checked by [`Self::rank_config`]); the symmetric buffers' handles go through
    /// `exchange`, which every process calls in the same order.
    pub fn for_rank(
        config: EpConfig,
        rank: usize,
        device: usize,
        exchange: Box<dyn AllGather>,
    ) -> Result<World> {
        Ok(Self::with(EpWorld::for_rank(
            config, rank, device, exchange,
        )?))
    }

    /// The checked configuration, rank and device of [`Self::for_rank`] (no GPU touched).
    pub fn rank_config(
        args: &WorldArgs,
        rank: i64,
        device: i64,
    ) -> Result<(EpConfig, usize, usize)> {
        let config = args.config()?;
        let (rank, device) = process_rank(rank, device, config.spec.ranks)?;
        Ok((config, rank, device))
    }

    fn with(ep: EpWorld) -> World {
        World {
            ep,
            id: NEXT_WORLD.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// The ranks of this process.
    pub fn local_ranks(&self) -> Range<usize> {
        self.ep.local_ranks()
    }

    /// Local rank `rank`, or a ValueError naming it.
    fn local(&self, rank: usize) -> Result<usize> {
        let local = self.local_ranks();
        if !local.contains(&rank) {
            return Err(Error::Value(format!(
                "rank: {rank} is not a rank of this process (it holds {local:?})"
            )));
        }
        Ok(rank)
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

    /// The CUDA device of local rank `rank`.
    pub fn device(&self, rank: usize) -> Result<usize> {
        Ok(self.gpu(self.local(rank)?).ordinal())
    }

    /// The CUDA context local rank `rank`'s work runs in (its device's primary context).
    pub fn context_handle(&self, rank: usize) -> Result<u64> {
        Ok(self.gpu(self.local(rank)?).context_handle()?)
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
        if d.rows.len() != self.local_ranks().len() {
            return Err(Error::Value("handle: no dispatch has filled it yet".into()));
        }
        Ok(())
    }

    /// Runs `body` with every local rank's stream ordered after its entry of `streams` (the
    /// caller's current stream on that rank's device), and the caller's streams ordered after it.
    fn on_streams(&self, streams: &[u64], body: impl FnOnce() -> Result<()>) -> Result<()> {
        let local = self.local_ranks();
        if streams.len() != local.len() {
            return Err(Error::Value(format!(
                "streams: {} for {} ranks",
                streams.len(),
                local.len()
            )));
        }
        for (r, &s) in local.clone().zip(streams) {
            self.gpu(r).wait_for(s)?;
        }
        let result = body();
        for (r, &s) in local.zip(streams) {
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
    /// [`Self::read_dispatch`] then copies the rows out, or, for a non-blocking dispatch, `out`
    /// in the same call (its sizes are the bound's).
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
        out: Option<DispatchOut>,
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
        let (h, k) = (s.hidden, s.topk);
        let ranks = self.local_ranks();
        let locals = ranks.len();
        let dtype = self.dtype();
        let x = per_rank("x", x, locals)?;
        let idx = per_rank("topk_idx", topk_idx, locals)?;
        let probs = per_rank("probs", probs, locals)?;
        let x_scales = match dtype {
            RowDtype::Fp8 => per_rank("x_scales", x_scales, locals)?,
            RowDtype::Bf16 if x_scales.is_empty() => x_scales,
            RowDtype::Bf16 => {
                return Err(Error::Value(
                    "x_scales: given to a bf16 buffer (only fp8 rows carry scales)".into(),
                ))
            }
        };
        let pad_multiple = count("pad_multiple", pad_multiple)?;
        let mut tokens = Vec::with_capacity(locals);
        for (i, r) in ranks.clone().enumerate() {
            let dev = self.gpu(r).ordinal();
            x[i].check(&format!("x[{i}]"), self.row_dtypes(), &[None, Some(h)], dev)?;
            let t = x[i].rows();
            if t > s.max_tokens {
                return Err(Error::Value(format!(
                    "x[{i}]: {t} tokens exceed num_max_tokens_per_rank = {}",
                    s.max_tokens
                )));
            }
            if dtype == RowDtype::Fp8 {
                x_scales[i].check(
                    &format!("x_scales[{i}]"),
                    &[F32],
                    &[Some(t), Some(h / 128)],
                    dev,
                )?;
            }
            idx[i].check(&format!("topk_idx[{i}]"), &[I32], &[Some(t), Some(k)], dev)?;
            probs[i].check(&format!("probs[{i}]"), &[F32], &[Some(t), Some(k)], dev)?;
            tokens.push(t);
        }
        let out = match (out, mode) {
            (None, _) => None,
            (Some(o), SyncMode::NonBlocking { row_bound }) => {
                Some((self.check_out(&vec![row_bound; locals], o)?, row_bound))
            }
            (Some(_), SyncMode::Blocking) => {
                return Err(Error::Value(
                    "rows: a blocking dispatch's sizes are known after it: read its rows with \
                     read_dispatch"
                        .into(),
                ))
            }
        };
        // Unfilled until the dispatch succeeds: a failed one leaves nothing to combine.
        d.rows.clear();
        let mut sizes = None;
        self.on_streams(streams, || {
            for (i, r) in ranks.clone().enumerate() {
                let p = self.ep.ptrs(r);
                let t = tokens[i];
                self.copy(r, p.x, x[i].ptr, t * dtype.row_bytes(h))?;
                if dtype == RowDtype::Fp8 {
                    self.copy(r, p.x_scales, x_scales[i].ptr, t * (h / 128) * 4)?;
                }
                self.copy(r, p.topk_idx, idx[i].ptr, t * k * 4)?;
                self.copy(r, p.probs, probs[i].ptr, t * k * 4)?;
            }
            sizes = self
                .ep
                .dispatch_with_permute(&tokens, pad_multiple, mode, &mut d.handle)?;
            match &out {
                Some((o, bound)) => self.copy_out(&d.handle, &vec![*bound; locals], o),
                None => Ok(()),
            }
        })?;
        d.tokens = tokens;
        match (sizes, mode) {
            (Some(sizes), _) => {
                d.rows = sizes.iter().map(|d| d.rows).collect();
                d.tokens_per_expert =
                    Some(sizes.into_iter().map(|d| d.tokens_per_expert).collect());
            }
            (None, SyncMode::NonBlocking { row_bound }) => {
                d.rows = vec![row_bound; locals];
                d.tokens_per_expert = None;
            }
            (None, SyncMode::Blocking) => unreachable!("a blocking dispatch reports its sizes"),
        }
        Ok(())
    }

    /// Copies the rows of the last dispatch (`d`) out into `out` (see [`DispatchOut`]).
    pub fn read_dispatch(&self, d: &Dispatch, out: DispatchOut, streams: &[u64]) -> Result<()> {
        self.check_filled(d)?;
        let out = self.check_out(&d.rows, out)?;
        self.on_streams(streams, || self.copy_out(&d.handle, &d.rows, &out))
    }

    /// `out` checked for `rows[i]` rows on the i-th local rank, its optional parts normalized.
    fn check_out<'a>(&self, rows: &[usize], out: DispatchOut<'a>) -> Result<DispatchOut<'a>> {
        let s = self.spec();
        let (h, dtype) = (s.hidden, self.dtype());
        let ranks = self.local_ranks();
        let locals = ranks.len();
        let optional = |name, t: &'a [TensorArg]| match t.is_empty() {
            true => Ok(t),
            false => per_rank(name, t, locals),
        };
        let out = DispatchOut {
            rows: per_rank("rows", out.rows, locals)?,
            scales: match dtype {
                RowDtype::Fp8 => per_rank("scales", out.scales, locals)?,
                RowDtype::Bf16 => out.scales,
            },
            probs: per_rank("probs", out.probs, locals)?,
            tokens_per_expert: optional("tokens_per_expert", out.tokens_per_expert)?,
            codes: optional("codes", out.codes)?,
        };
        let local = s.local_experts();
        for (i, r) in ranks.enumerate() {
            let (dev, n) = (self.gpu(r).ordinal(), rows[i]);
            if let Some(c) = out.codes.get(i) {
                c.check(&format!("codes[{i}]"), &[I32], &[Some(1)], dev)?;
            }
            if let Some(c) = out.tokens_per_expert.get(i) {
                c.check(
                    &format!("tokens_per_expert[{i}]"),
                    &[I32],
                    &[Some(local)],
                    dev,
                )?;
            }
            out.rows[i].check(
                &format!("rows[{i}]"),
                self.row_dtypes(),
                &[Some(n), Some(h)],
                dev,
            )?;
            if dtype == RowDtype::Fp8 {
                out.scales[i].check(
                    &format!("scales[{i}]"),
                    &[F32],
                    &[Some(n), Some(h / 128)],
                    dev,
                )?;
            }
            out.probs[i].check(&format!("probs[{i}]"), &[F32], &[Some(n)], dev)?;
        }
        Ok(out)
    }

    /// The copies of a dispatch's results (`rows[i]` rows on the i-th local rank) into the
    /// checked `out`, on the ranks' streams.
    fn copy_out(&self, handle: &Handle, rows: &[usize], out: &DispatchOut) -> Result<()> {
        let s = self.spec();
        let (h, dtype, local) = (s.hidden, self.dtype(), s.local_experts());
        for (i, r) in self.local_ranks().enumerate() {
            let (p, n) = (self.ep.ptrs(r), rows[i]);
            self.copy(r, out.rows[i].ptr, p.out_rows, n * dtype.row_bytes(h))?;
            if dtype == RowDtype::Fp8 {
                self.copy(r, out.scales[i].ptr, p.out_scales, n * (h / 128) * 4)?;
            }
            self.copy(r, out.probs[i].ptr, p.out_probs, n * 4)?;
            if let Some(c) = out.tokens_per_expert.get(i) {
                let padded = self.ep.handle_ptrs(handle, r).padded;
                self.copy(r, c.ptr, padded, local * 4)?;
            }
            if let Some(c) = out.codes.get(i) {
                self.copy(r, c.ptr, self.ep.error_code_ptr(r), 4)?;
            }
        }
        Ok(())
    }

    /// combine_with_unpermute of `rows[r]` bf16 `[rows_r, H]` into `y[r]` bf16 `[T_r, H]` in
    /// `order`, waiting for it after a blocking dispatch when `wait`. With `prob_grads`
    /// (`[rows_r]` f32) and `grad_probs` (`[T_r, K]` f32) it is dispatch's backward: the prob
    /// gradients are scattered back too.
    #[allow(clippy::too_many_arguments)]
    pub fn combine(
        &self,
        d: &Dispatch,
        rows: &[TensorArg],
        prob_grads: Option<(&[TensorArg], &[TensorArg])>,
        order: &str,
        y: &[TensorArg],
        streams: &[u64],
        wait: bool,
    ) -> Result<()> {
        self.check_filled(d)?;
        let order = combine_order(order)?;
        let s = self.spec();
        let (h, k) = (s.hidden, s.topk);
        let ranks = self.local_ranks();
        let locals = ranks.len();
        let rows = per_rank("rows", rows, locals)?;
        let y = per_rank("y", y, locals)?;
        let grads = match prob_grads {
            Some((g, out)) => Some((
                per_rank("prob_grads", g, locals)?,
                per_rank("grad_probs", out, locals)?,
            )),
            None => None,
        };
        for (i, r) in ranks.clone().enumerate() {
            let (dev, n, t) = (self.gpu(r).ordinal(), d.rows[i], d.tokens[i]);
            rows[i].check(&format!("rows[{i}]"), &[BF16], &[Some(n), Some(h)], dev)?;
            y[i].check(&format!("y[{i}]"), &[BF16], &[Some(t), Some(h)], dev)?;
            if let Some((g, out)) = grads {
                g[i].check(&format!("prob_grads[{i}]"), &[F32], &[Some(n)], dev)?;
                out[i].check(
                    &format!("grad_probs[{i}]"),
                    &[F32],
                    &[Some(t), Some(k)],
                    dev,
                )?;
            }
        }
        // The kernel writes y and the prob gradients straight into the caller's tensors.
        let outputs: Vec<CombineOutputs> = ranks
            .clone()
            .enumerate()
            .map(|(i, r)| CombineOutputs {
                y: y[i].ptr,
                grad_probs: grads.map_or(self.ep.ptrs(r).grad_probs, |(_, out)| out[i].ptr),
            })
            .collect();
        self.on_streams(streams, || {
            for (i, r) in ranks.clone().enumerate() {
                let (p, n) = (self.ep.ptrs(r), d.rows[i]);
                self.copy(r, p.comb_rows, rows[i].ptr, n * h * 2)?;
                if let Some((g, _)) = grads {
                    self.copy(r, p.comb_prob_grads, g[i].ptr, n * 4)?;
                }
            }
            Ok(self
                .ep
                .combine_into(&d.handle, grads.is_some(), order, d.mode(wait), &outputs)?)
        })
    }

    /// Combine's backward: `grad_y[r]` bf16 `[T_r, H]` dispatched along `d`'s routing into
    /// `grad_rows[r]` bf16 `[rows_r, H]` (padding rows zero), waiting for it after a blocking
    /// dispatch when `wait`.
    pub fn combine_backward(
        &self,
        d: &Dispatch,
        grad_y: &[TensorArg],
        grad_rows: &[TensorArg],
        streams: &[u64],
        wait: bool,
    ) -> Result<()> {
        self.check_filled(d)?;
        let s = self.spec();
        let h = s.hidden;
        let ranks = self.local_ranks();
        let locals = ranks.len();
        let grad_y = per_rank("grad_y", grad_y, locals)?;
        let grad_rows = per_rank("grad_rows", grad_rows, locals)?;
        for (i, r) in ranks.clone().enumerate() {
            let (dev, n, t) = (self.gpu(r).ordinal(), d.rows[i], d.tokens[i]);
            grad_y[i].check(&format!("grad_y[{i}]"), &[BF16], &[Some(t), Some(h)], dev)?;
            grad_rows[i].check(
                &format!("grad_rows[{i}]"),
                &[BF16],
                &[Some(n), Some(h)],
                dev,
            )?;
        }
        self.on_streams(streams, || {
            for (g, (i, r)) in grad_y.iter().zip(ranks.clone().enumerate()) {
                self.copy(r, self.ep.ptrs(r).x, g.ptr, d.tokens[i] * h * 2)?;
            }
            self.ep.combine_backward(&d.handle, d.mode(wait))?;
            for (g, (i, r)) in grad_rows.iter().zip(ranks.clone().enumerate()) {
                self.copy(r, g.ptr, self.ep.ptrs(r).out_rows, d.rows[i] * h * 2)?;
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A world of 2 ranks that every check accepts, of `dtype`.
    fn small(dtype: &str) -> WorldArgs<'_> {
        WorldArgs {
            num_ranks: 2,
            num_experts: 64,
            num_topk: 6,
            hidden: 512,
            num_max_tokens_per_rank: 128,
            max_pad_multiple: 128,
            dtype,
            num_sms: None,
            deadline_ms: None,
        }
    }

    #[test]
    fn bad_world_arguments_are_value_errors_before_any_gpu_is_touched() {
        let args = small("bf16");
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
    fn a_process_ranks_arguments_are_value_errors_before_any_gpu_is_touched() {
        let args = small("fp8");
        assert!(World::rank_config(&args, 1, 0).is_ok());
        let value = |a: &WorldArgs, rank, device| match World::rank_config(a, rank, device) {
            Err(Error::Value(m)) => m,
            other => panic!("{:?}", other.map(|c| c.0.spec)),
        };
        assert_eq!(value(&args, 2, 0), "rank: 2 is not below num_ranks = 2");
        assert!(value(&args, -1, 0).starts_with("rank: "));
        assert!(value(&args, 0, -1).starts_with("device: "));
        // A world size the experts do not split over names it.
        let three = WorldArgs {
            num_ranks: 3,
            ..args
        };
        assert!(value(&three, 0, 0).starts_with("num_experts: "));
    }
}
