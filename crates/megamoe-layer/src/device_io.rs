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

use megamoe_core::Error;
use megamoe_cuda::{DeviceBuffer, Gpu};

use crate::error::{LayerError, Result};
use crate::layer::MoeLayer;
use crate::split::{Activations, RankInput};

/// One rank's activations on its GPU: bf16 `[T, H]`, or e4m3 `[T, H]` with f32 scales `[T,
/// H/128]`.
#[derive(Clone, Copy, Debug)]
pub struct DeviceActivations {
    tokens: usize,
    x: u64,
    /// The scales' address for e4m3 rows; None for bf16 rows.
    scales: Option<u64>,
}

impl DeviceActivations {
    /// `tokens` rows at device address `x`: bf16 when `scales` is None, else e4m3 with their
    /// scales at `scales`.
    ///
    /// # Safety
    /// The addresses must hold the rows (and scales) of that many tokens, in memory the layer's
    /// GPU can read, and stay allocated and unchanged until the call that reads them returns.
    pub unsafe fn new(tokens: usize, x: u64, scales: Option<u64>) -> DeviceActivations {
        DeviceActivations { tokens, x, scales }
    }

    /// T, the rows.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Copies the rows into the first of `places` (bf16) or the rows and scales into the other
    /// two (e4m3), each a buffer of `gpu` and a byte offset, of `hidden` columns; returns
    /// whether the rows were bf16 (the quantizer must then run first).
    pub(crate) fn copy_into(
        &self,
        gpu: &Gpu,
        places: [(&DeviceBuffer, usize); 3],
        hidden: usize,
    ) -> Result<bool> {
        let [bf16, rows, scales] = places;
        let t = self.tokens;
        let copy = |(buf, offset): (&DeviceBuffer, usize), src, bytes| -> Result<()> {
            let dst = buf.ptr_at(offset, bytes)?;
            // SAFETY: the contract of `new` on `src`; the destination lies inside the buffer.
            unsafe { copy_and_wait(gpu, dst, src, bytes) }
        };
        match self.scales {
            None => copy(bf16, self.x, t * hidden * 2)?,
            Some(s) => {
                copy(rows, self.x, t * hidden)?;
                copy(scales, s, t * hidden / 128 * 4)?;
            }
        }
        Ok(self.scales.is_none())
    }
}

/// Copies `bytes` between device addresses on `gpu`'s stream and waits for the copy: the
/// caller's tensors are free to reuse, and `y` written, once a call returns. The layer's
/// buffers of a rank are allocated by its GPU handle, so the copy is ordered with their
/// uploads and launches.
///
/// # Safety
/// As [`Gpu::copy_raw`].
unsafe fn copy_and_wait(gpu: &Gpu, dst: u64, src: u64, bytes: usize) -> Result<()> {
    // SAFETY: the caller's contract.
    unsafe { gpu.copy_raw(dst, src, bytes)? };
    Ok(gpu.synchronize()?)
}

/// Integers of `topk_idx` on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexType {
    I32,
    /// What `torch.topk` returns; each value must fit an i32 (else the call is refused).
    I64,
}

/// One rank's tensors of one call on its GPU, by device address (see
/// [`MoeLayer::forward_device`]).
#[derive(Clone, Copy, Debug)]
pub struct DeviceRankTensors {
    pub x: DeviceActivations,
    /// `[T, K]` of `topk_idx_type`.
    pub topk_idx: u64,
    pub topk_idx_type: IndexType,
    /// f32 `[T, K]`.
    pub topk_weights: u64,
    /// bf16 `[T, H]`, written.
    pub y: u64,
}

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
        for (arg, got) in [("inputs", tensors.len()), ("streams", streams.len())] {
            if got != local.len() {
                return Err(Error::Length {
                    arg,
                    got,
                    expected: local.len(),
                }
                .into());
            }
        }
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

/// i64 expert ids as the i32 the layer takes; a value outside i32 is out of range whatever E is.
fn narrow(idx: &[i64], topk: usize, experts: usize) -> megamoe_core::Result<Vec<i32>> {
    idx.iter()
        .enumerate()
        .map(|(i, &v)| {
            i32::try_from(v).map_err(|_| Error::ExpertOutOfRange {
                arg: "topk_idx",
                row: i / topk,
                slot: i % topk,
                value: v,
                experts,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wide_expert_ids_narrow_or_are_named_out_of_range() {
        assert_eq!(narrow(&[0, -1, 15, 3], 2, 16).unwrap(), vec![0, -1, 15, 3]);
        let e = narrow(&[0, 1, 2, 1 << 32], 2, 16).unwrap_err();
        assert!(
            matches!(
                e,
                Error::ExpertOutOfRange {
                    arg: "topk_idx",
                    row: 1,
                    slot: 1,
                    ..
                }
            ),
            "{e}"
        );
    }
}
