//! The forward pass on tensors that already live on the GPU (a framework's, PyTorch's through
//! the Python package), by device address, ordered after the caller's stream.
//!
//! [`MoeLayer::forward_device`]: every rank's stream first waits for the work queued so far on
//! the caller's stream on that rank's GPU (an event, the host does not block); `topk_idx` and `topk_weights` are
//! then copied to the host, because the checks of SPEC §6 need their values (a few KiB per
//! call: `T · K` of each), and uploaded from that copy, so the layer runs on exactly what was
//! checked; the activations are copied device to device into the layer's buffers, the call
//! runs as [`MoeLayer::forward`] does, and each rank's output is copied to the caller's `y`.
//! Every copy completes before the function returns, so the caller's stream needs no event to
//! see `y`, and the caller may reuse its input tensors at once.
//!
//! [`MoeLayer::launch_device`] (the fused kind): the same call with no host synchronization and
//! no read of the values, which the device checks instead (src/stage.rs); the work is queued
//! on the caller's stream itself (a layer of one local rank), or after it and the caller's stream
//! after it (one event each way), so a CUDA graph captured on the caller's stream records it.
//! [`MoeLayer::check`] waits and reports what the device found.

use megamoe_core::Error;

use crate::call::{
    check_lengths, check_no_recv_stats, copy_and_wait, narrow, Activations, DeviceRankTensors,
    IndexType, RankInput,
};
use crate::error::{LayerError, Result};
#[cfg(doc)]
use crate::fused::FusedLayer;
use crate::layer::MoeLayer;

/// A rank's routing read back to the host.
struct HostRouting {
    topk_idx: Vec<i32>,
    topk_weights: Vec<f32>,
}

impl MoeLayer {
    /// The forward pass on device tensors (module comment): one call of every local rank
    /// ([`Self::local_ranks`]: every rank, or this process's one), each rank's output written
    /// to its `y`. `tensors` and `streams` have one entry per local rank: entry i is rank
    /// `local_ranks().start + i`, and `streams[i]` the caller's stream on that rank's GPU (0:
    /// the legacy default stream). Every input is checked before anything is written; a bad
    /// one is an error naming the rank (its global number) and the argument.
    ///
    /// # Safety
    /// Every address of `tensors[i]` must be memory of local rank i's GPU (or one it can
    /// access) holding what [`DeviceRankTensors`] says for `x.tokens()` tokens, allocated until
    /// this returns, and `y` used by nothing else meanwhile; `streams[i]` must be a live stream
    /// of the primary context of that rank's GPU, or 0.
    pub unsafe fn forward_device(
        &mut self,
        tensors: &[DeviceRankTensors],
        num_tokens_bound: Option<usize>,
        streams: &[u64],
    ) -> Result<()> {
        let spec = *self.spec();
        let local = self.local_ranks();
        check_lengths(local.len(), tensors.len(), streams.len())?;
        check_no_recv_stats(tensors)?;
        let k = spec.shape.topk;
        let mut routing = Vec::with_capacity(local.len());
        for (r, (t, &stream)) in local.clone().zip(tensors.iter().zip(streams)) {
            let gpu = self.gpu(r);
            gpu.wait_for(stream)?;
            let slots = t.x.tokens() * k;
            let mut topk_weights = vec![0f32; slots];
            // SAFETY: the caller's contract on the addresses.
            let topk_idx = unsafe {
                gpu.read_address(t.topk_weights, &mut topk_weights)?;
                match t.topk_idx_type {
                    IndexType::I32 => {
                        let mut idx = vec![0i32; slots];
                        gpu.read_address(t.topk_idx, &mut idx)?;
                        idx
                    }
                    IndexType::I64 => {
                        let mut idx = vec![0i64; slots];
                        gpu.read_address(t.topk_idx, &mut idx)?;
                        narrow(&idx, k, spec.shape.experts).map_err(|e| LayerError::input(r, e))?
                    }
                }
            };
            routing.push(HostRouting {
                topk_idx,
                topk_weights,
            });
        }
        let inputs: Vec<RankInput> = tensors
            .iter()
            .zip(&routing)
            .map(|(t, host)| RankInput {
                x: Activations::Device(t.x),
                topk_idx: &host.topk_idx,
                topk_weights: &host.topk_weights,
            })
            .collect();
        let tokens = self.run(&inputs, num_tokens_bound)?;
        for ((r, t), tokens) in local.zip(tensors).zip(tokens) {
            let bytes = tokens * spec.shape.hidden * 2;
            let (buf, offset) = self.output(r);
            let src = buf.ptr_at(offset, bytes)?;
            // SAFETY: the caller's contract on `y`; the source lies inside the buffer.
            unsafe { copy_and_wait(self.gpu(r), t.y, src, bytes)? };
        }
        Ok(())
    }
}

impl MoeLayer {
    /// [`FusedLayer::launch_device`]: one call queued with no host synchronization, its values
    /// checked on the device. The split kind reads the routing on the host to plan its
    /// dispatch: it takes [`Self::forward_device`] instead.
    ///
    /// # Safety
    /// That of [`FusedLayer::launch_device`].
    pub unsafe fn launch_device(
        &mut self,
        tensors: &[DeviceRankTensors],
        num_tokens_bound: Option<usize>,
        streams: &[u64],
    ) -> Result<()> {
        match self {
            // SAFETY: the caller's contract.
            MoeLayer::Fused(l) => unsafe { l.launch_device(tensors, num_tokens_bound, streams) },
            MoeLayer::Split(_) => Err(split_reads_the_host()),
        }
    }

    /// Waits for every local rank and reports the first failure of the calls since the last
    /// check ([`FusedLayer::check`]; the split kind reports its failures in each call).
    pub fn check(&mut self) -> Result<()> {
        match self {
            MoeLayer::Fused(l) => l.check(),
            MoeLayer::Split(l) => {
                for r in l.local_ranks() {
                    l.gpu(r).synchronize()?;
                }
                Ok(())
            }
        }
    }
}

fn split_reads_the_host() -> LayerError {
    Error::Value {
        arg: "kind",
        value: "split".into(),
        reason: "the split layer reads the routing on the host; calls launched from device \
                 memory alone are the fused layer's"
            .into(),
    }
    .into()
}
