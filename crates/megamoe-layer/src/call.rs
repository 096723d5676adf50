//! The per-rank inputs of one call, shared by both kinds: host slices or device tensors
//! ([`Activations`], [`RankInput`], [`DeviceActivations`], [`DeviceRankTensors`]); every host
//! check of a call, run before anything is written (`check_call` for host inputs,
//! `check_device_tokens` for device tensors whose values the device checks, `check_lengths`,
//! `check_no_recv_stats` and `narrow` for the calls on device tensors the host reads); and the
//! copies that hand a call's outputs back.

use std::ops::Range;

use half::bf16;
use megamoe_core::routing::{check_slot_weights, check_topk_idx};
use megamoe_core::Error;
use megamoe_cuda::{DeviceBuffer, Gpu};

use crate::error::{LayerError, Result};
use crate::spec::LayerSpec;
#[cfg(doc)]
use crate::MoeLayer;

/// One rank's activations for one call.
#[derive(Clone, Copy, Debug)]
pub enum Activations<'a> {
    /// bf16 `[T, H]`: quantized on the GPU per token per 128 columns (SPEC §3).
    Bf16(&'a [bf16]),
    /// Already quantized: e4m3 `[T, H]` and f32 scales `[T, H/128]`.
    Fp8 { data: &'a [u8], scales: &'a [f32] },
    /// Either of the above on the rank's GPU (a framework's tensors), copied device to device.
    Device(DeviceActivations),
}

/// One rank's inputs for one call (SPEC §2); T is `topk_idx.len() / K`.
#[derive(Clone, Copy, Debug)]
pub struct RankInput<'a> {
    pub x: Activations<'a>,
    /// `[T, K]`: experts in `[0, E)` or −1 for a masked slot; no expert twice in a row.
    pub topk_idx: &'a [i32],
    /// `[T, K]`, finite on valid slots (masked slots' weights are never read).
    pub topk_weights: &'a [f32],
}

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

    /// The addresses of e4m3 rows and their scales; None for bf16 rows.
    pub(crate) fn fp8(&self) -> Option<(u64, u64)> {
        self.scales.map(|s| (self.x, s))
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
            unsafe { gpu.copy_raw(dst, src, bytes)? };
            Ok(())
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
    /// i32 `[E_l]`: the rows each of the rank's experts receives in the call are added to it
    /// (DeepGEMM's `cumulative_local_expert_recv_stats`); only calls checked on the device
    /// ([`MoeLayer::launch_device`]) take it.
    pub recv_stats: Option<u64>,
}

/// One entry per local rank in each of a device call's per-rank lists.
pub(crate) fn check_lengths(local: usize, tensors: usize, streams: usize) -> Result<()> {
    for (arg, got) in [("inputs", tensors), ("streams", streams)] {
        if got != local {
            return Err(Error::Length {
                arg,
                got,
                expected: local,
            }
            .into());
        }
    }
    Ok(())
}

/// No tensor set of a call the host reads counts received rows (`recv_stats`): only calls
/// checked on the device do.
pub(crate) fn check_no_recv_stats(tensors: &[DeviceRankTensors]) -> Result<()> {
    if tensors.iter().any(|t| t.recv_stats.is_some()) {
        return Err(Error::Value {
            arg: "recv_stats",
            value: "given".into(),
            reason: "only calls checked on the device (launch_device) count received rows".into(),
        }
        .into());
    }
    Ok(())
}

/// i64 expert ids as the i32 the layer takes; a value outside i32 is out of range whatever E is.
pub(crate) fn narrow(idx: &[i64], topk: usize, experts: usize) -> megamoe_core::Result<Vec<i32>> {
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

/// The T of each rank of `ranks` (the ranks this process holds, one input each), after
/// checking the input count, every input and the bound (at least each of these ranks' T, at
/// most T_max), before anything is written.
pub(crate) fn check_call(
    s: &LayerSpec,
    ranks: Range<usize>,
    inputs: &[RankInput],
    num_tokens_bound: Option<usize>,
) -> Result<Vec<usize>> {
    if inputs.len() != ranks.len() {
        return Err(Error::Length {
            arg: "inputs",
            got: inputs.len(),
            expected: ranks.len(),
        }
        .into());
    }
    let mut tokens = Vec::with_capacity(ranks.len());
    for (r, input) in ranks.zip(inputs) {
        let t = check_input(s, input).map_err(|e| LayerError::input(r, e))?;
        tokens.push(t);
    }
    check_bound(s, &tokens, num_tokens_bound)?;
    Ok(tokens)
}

/// The T of each rank of `ranks` (the ranks this process holds, one tensor set each) of a call
/// on device tensors, after checking each T against T_max and the bound (at least each of
/// these ranks' T, at most T_max); the values are the device's to check.
pub(crate) fn check_device_tokens(
    s: &LayerSpec,
    ranks: Range<usize>,
    tensors: &[DeviceRankTensors],
    num_tokens_bound: Option<usize>,
) -> Result<Vec<usize>> {
    let mut tokens = Vec::with_capacity(tensors.len());
    for (r, t) in ranks.zip(tensors) {
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
    check_bound(s, &tokens, num_tokens_bound)?;
    Ok(tokens)
}

/// `num_tokens_bound`, when given, is at least each of `tokens` (the local ranks' T) and at
/// most T_max.
pub(crate) fn check_bound(
    s: &LayerSpec,
    tokens: &[usize],
    num_tokens_bound: Option<usize>,
) -> Result<()> {
    if let Some(bound) = num_tokens_bound {
        let most = tokens.iter().copied().max().unwrap_or(0);
        if bound < most || bound > s.max_tokens {
            return Err(Error::Value {
                arg: "num_tokens_bound",
                value: bound.to_string(),
                reason: format!(
                    "must be at least every rank's T (largest {most}) and at most T_max {}",
                    s.max_tokens
                ),
            }
            .into());
        }
    }
    Ok(())
}

/// T of one rank's input, after checking every length, the routing and the weights.
fn check_input(spec: &LayerSpec, input: &RankInput) -> megamoe_core::Result<usize> {
    let (h, k) = (spec.shape.hidden, spec.shape.topk);
    let len = |arg, got: usize, expected: usize| {
        if got == expected {
            Ok(())
        } else {
            Err(Error::Length { arg, got, expected })
        }
    };
    if input.topk_idx.len() % k != 0 {
        return Err(Error::Shape {
            arg: "topk_idx",
            reason: format!(
                "{} entries are not whole rows of K = {k}",
                input.topk_idx.len()
            ),
        });
    }
    let t = input.topk_idx.len() / k;
    if t > spec.max_tokens {
        return Err(Error::Capacity {
            arg: "tokens",
            got: t,
            capacity: spec.max_tokens,
        });
    }
    match input.x {
        Activations::Bf16(x) => len("x", x.len(), t * h)?,
        Activations::Fp8 { data, scales } => {
            len("x", data.len(), t * h)?;
            len("x_scales", scales.len(), t * h / 128)?;
        }
        Activations::Device(x) => len("x", x.tokens() * h, t * h)?,
    }
    len("topk_weights", input.topk_weights.len(), t * k)?;
    check_topk_idx("topk_idx", spec.shape, input.topk_idx)?;
    check_slot_weights("topk_weights", k, input.topk_idx, input.topk_weights)?;
    Ok(t)
}

/// Every rank's output of a finished call, downloaded: bf16 `[T, H]` from where `output(rank)`
/// says it is (a buffer and a byte offset), `tokens[rank]` rows each.
pub(crate) fn download_outputs<'a>(
    tokens: &[usize],
    hidden: usize,
    output: impl Fn(usize) -> (&'a DeviceBuffer, usize),
) -> Result<Vec<Vec<bf16>>> {
    tokens
        .iter()
        .enumerate()
        .map(|(r, &t)| {
            let mut y = vec![bf16::ZERO; t * hidden];
            let (buf, offset) = output(r);
            buf.download_into(offset, &mut y)?;
            Ok(y)
        })
        .collect()
}

/// Copies `bytes` between device addresses on `gpu`'s stream and waits for the copy: the
/// caller's tensors are free to reuse, and `y` written, once a call returns. The layer's
/// buffers of a rank are allocated by its GPU handle, so the copy is ordered with their
/// uploads and launches.
///
/// # Safety
/// As [`Gpu::copy_raw`].
pub(crate) unsafe fn copy_and_wait(gpu: &Gpu, dst: u64, src: u64, bytes: usize) -> Result<()> {
    // SAFETY: the caller's contract.
    unsafe { gpu.copy_raw(dst, src, bytes)? };
    Ok(gpu.synchronize()?)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use megamoe_core::routing::validate_rank;
    use megamoe_core::{Preset, RankInputs};
    use proptest::prelude::*;

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

    /// An exchange for tests whose arguments must be rejected before any exchange (either
    /// kind's construction).
    pub(crate) struct Unreachable;

    impl megamoe_cuda::AllGather for Unreachable {
        fn all_gather(&mut self, _: &[u8]) -> megamoe_cuda::Result<Vec<Vec<u8>>> {
            panic!("the arguments should have been rejected before any exchange")
        }
    }

    proptest! {
        // Any lengths, expert ids and weights: the layer's checks never panic, and accept
        // exactly what megamoe-core's validation of the same rank accepts.
        #[test]
        fn input_checks_agree_with_the_reference_validation(
            slots in 0usize..40,
            x_extra in -2i64..3,
            w_extra in -2i64..3,
            ids in proptest::collection::vec(-3i32..20, 40),
            weights in proptest::collection::vec(
                prop_oneof![Just(f32::NAN), Just(f32::INFINITY), -2.0f32..2.0], 40),
        ) {
            let shape = Preset::by_name("tiny").unwrap().shape; // H 256, E 16, K 4
            let spec = LayerSpec::new(shape, 2, 8);
            let topk_idx = &ids[..slots];
            let t = slots / shape.topk;
            let x_len = ((t * shape.hidden) as i64 + x_extra).max(0) as usize;
            let w_len = (slots as i64 + w_extra).clamp(0, 40) as usize;
            let x = vec![half::bf16::ONE; x_len];
            let input = RankInput {
                x: Activations::Bf16(&x),
                topk_idx,
                topk_weights: &weights[..w_len],
            };
            let got = check_input(&spec, &input);
            let reference = if slots % shape.topk != 0 {
                None
            } else {
                let rank = RankInputs {
                    tokens: t,
                    first_global_token: 0,
                    x: x.clone(),
                    topk_idx: topk_idx.to_vec(),
                    topk_weights: weights[..w_len].to_vec(),
                };
                Some(validate_rank(shape, 0, &rank, Some(spec.max_tokens)))
            };
            match (got, reference) {
                (Ok(tokens), Some(Ok(()))) => prop_assert_eq!(tokens, t),
                (Err(_), Some(Err(_))) | (Err(_), None) => {}
                (got, reference) => prop_assert!(false, "layer {:?}, reference {:?}", got, reference),
            }
        }
    }

    /// The first broken rule of a call of `ranks` inputs (each rank's T, FP8 or bf16, and the
    /// lengths of its activations and their scales) with `bound`, as `check_call` orders them:
    /// the rank count, then rank by rank T ≤ T_max and the lengths, then the bound.
    fn call_fault(
        spec: &LayerSpec,
        ranks: &[(usize, bool, usize, usize)],
        bound: Option<usize>,
    ) -> Option<(Option<usize>, &'static str)> {
        if ranks.len() != spec.ranks {
            return Some((None, "inputs"));
        }
        let h = spec.shape.hidden;
        for (r, &(t, fp8, x_len, scales_len)) in ranks.iter().enumerate() {
            if t > spec.max_tokens {
                return Some((Some(r), "tokens"));
            }
            if x_len != t * h {
                return Some((Some(r), "x"));
            }
            if fp8 && scales_len != t * h / 128 {
                return Some((Some(r), "x_scales"));
            }
        }
        let most = ranks.iter().map(|r| r.0).max().unwrap_or(0);
        match bound {
            Some(b) if b < most || b > spec.max_tokens => Some((None, "num_tokens_bound")),
            _ => None,
        }
    }

    proptest! {
        // Any rank count, any T (0 and beyond T_max included), FP8 or bf16 activations of any
        // length, any bound: `check_call` returns every rank's T exactly when nothing is
        // broken, else an error naming the first broken argument (and its rank), never a panic.
        #[test]
        fn call_checks_name_the_first_broken_argument(
            ranks in proptest::collection::vec(
                (0usize..12, any::<bool>(), prop_oneof![4 => Just(0i64), 1 => -3i64..4],
                 prop_oneof![4 => Just(0i64), 1 => -2i64..3]),
                0..4),
            bound in proptest::option::of(0usize..12),
        ) {
            let shape = Preset::by_name("tiny").unwrap().shape; // H 256, E 16, K 4
            let spec = LayerSpec::new(shape, 2, 8);
            let (h, k) = (shape.hidden, shape.topk);
            let len = |n: usize, off: i64| (n as i64 + off).max(0) as usize;
            let ranks: Vec<_> = ranks
                .iter()
                .map(|&(t, fp8, x_off, scale_off)| {
                    (t, fp8, len(t * h, x_off), len(t * h / 128, scale_off))
                })
                .collect();
            let data: Vec<_> = ranks
                .iter()
                .enumerate()
                .map(|(r, &(t, _, x_len, scales_len))| {
                    // Slot k of token t names expert (t·K + k + r) mod E: K distinct experts.
                    let idx: Vec<i32> = (0..t * k).map(|i| ((i + r) % 16) as i32).collect();
                    (
                        vec![half::bf16::ONE; x_len],
                        vec![0x38u8; x_len],
                        vec![1.0f32; scales_len],
                        idx,
                        vec![0.25f32; t * k],
                    )
                })
                .collect();
            let inputs: Vec<RankInput> = data
                .iter()
                .zip(&ranks)
                .map(|((x, x8, scales, idx, w), &(_, fp8, _, _))| RankInput {
                    x: if fp8 {
                        Activations::Fp8 { data: x8, scales }
                    } else {
                        Activations::Bf16(x)
                    },
                    topk_idx: idx,
                    topk_weights: w,
                })
                .collect();
            let got = check_call(&spec, 0..spec.ranks, &inputs, bound);
            match (got, call_fault(&spec, &ranks, bound)) {
                (Ok(tokens), None) => {
                    prop_assert_eq!(tokens, ranks.iter().map(|r| r.0).collect::<Vec<_>>())
                }
                (Err(e), Some((rank, arg))) => {
                    let text = e.to_string();
                    prop_assert!(text.contains(&format!("`{arg}`")), "{arg}: {text}");
                    if let Some(r) = rank {
                        prop_assert!(text.contains(&format!("rank {r}")), "rank {r}: {text}");
                    }
                }
                (got, want) => prop_assert!(false, "got {:?}, expected {:?}", got, want),
            }
        }
    }
}
