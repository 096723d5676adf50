//! The MoE layer on the GPU for Python (`megamoe.MoELayer`, python/megamoe/layer.py): a
//! layer built from DeepGEMM-style arguments, its weights loaded from device tensors, and
//! the forward pass on device tensors ([`MoeLayer::forward_device`]). Python checks each
//! tensor's dtype, shape, device and layout and passes its address; this file checks what
//! the values must satisfy, through megamoe-layer.

use megamoe_core::weights::RankWeightsFp8;
use megamoe_cuda::Gpu;
use megamoe_layer::{DeviceRankTensors, LayerSpec, MoeLayer};

use crate::api::{count, require_gpu, LayerArgs};
use crate::error::{Error, Result};

/// A layer of `spec`; its buffers and kernels exist once its weights are loaded (they are
/// uploaded when the layer is built).
pub struct GpuLayer {
    pub spec: LayerSpec,
    layer: Option<MoeLayer>,
}

/// Device addresses of the weights of all E experts in the SPEC §2 layouts: W1 e4m3 `[E, 2I,
/// H]`, S1 f32 `[E, 2I/128, H/128]`, W2 e4m3 `[E, H, I]`, S2 f32 `[E, H/128, I/128]`; rank r
/// takes experts r·E_l … (r+1)·E_l − 1.
#[derive(Clone, Copy, Debug)]
pub struct WeightTensors {
    pub w1: u64,
    pub w1_scales: u64,
    pub w2: u64,
    pub w2_scales: u64,
}

impl GpuLayer {
    /// Checks the arguments (a `ValueError` naming the bad one), then that a GPU can be used.
    pub fn new(args: &LayerArgs) -> Result<GpuLayer> {
        let spec = args.spec()?;
        require_gpu()?;
        Ok(GpuLayer { spec, layer: None })
    }

    /// The CUDA device rank `rank` runs on (ranks go round the visible GPUs).
    pub fn rank_device(&self, rank: usize) -> Result<usize> {
        if rank >= self.spec.ranks {
            return Err(Error::Value(format!(
                "rank: {rank} is not below num_ranks {}",
                self.spec.ranks
            )));
        }
        Ok(match &self.layer {
            Some(layer) => layer.gpu(rank).ordinal(),
            None => rank % require_gpu()?,
        })
    }

    /// Reads every rank's experts from `w` on device `device` (after the work queued on
    /// `stream`, that device's stream) and builds the layer with them, replacing any earlier
    /// one. The bytes pass through the host: the load is a one-time re-layout (W1's gate and
    /// up blocks interleaved, megamoe-layer's weights.rs).
    ///
    /// # Safety
    /// The addresses must hold the four tensors of [`WeightTensors`] for this layer's shape, on
    /// device `device`; `stream` a live stream of that device's primary context, or 0.
    pub unsafe fn load_weights(
        &mut self,
        w: &WeightTensors,
        device: usize,
        stream: u64,
    ) -> Result<()> {
        let s = &self.spec;
        let (h, i) = (s.shape.hidden, s.shape.inter);
        let el = s.shape.local_experts(s.ranks);
        let gpu = Gpu::new(device)?;
        gpu.wait_for(stream)?;
        let blocks = |rows: usize, cols: usize| rows / 128 * (cols / 128);
        let mut ranks = Vec::with_capacity(s.ranks);
        for r in 0..s.ranks {
            let (w1, s1) = (el * 2 * i * h, el * blocks(2 * i, h));
            let (w2, s2) = (el * h * i, el * blocks(h, i));
            let mut rank = RankWeightsFp8 {
                w1: vec![0; w1],
                s1: vec![0.0; s1],
                w2: vec![0; w2],
                s2: vec![0.0; s2],
            };
            let at = |base: u64, len: usize, item: usize| base + (r * len * item) as u64;
            // SAFETY: the caller's contract: rank r's experts lie inside each tensor.
            unsafe {
                gpu.read_address(at(w.w1, w1, 1), &mut rank.w1)?;
                gpu.read_address(at(w.w1_scales, s1, 4), &mut rank.s1)?;
                gpu.read_address(at(w.w2, w2, 1), &mut rank.w2)?;
                gpu.read_address(at(w.w2_scales, s2, 4), &mut rank.s2)?;
            }
            ranks.push(rank);
        }
        // Drop the old layer first: its buffers count against the same GPU memory.
        self.layer = None;
        self.layer = Some(MoeLayer::new(*s, |r| Ok(ranks[r].clone()))?);
        Ok(())
    }

    /// One call of every rank (see [`MoeLayer::forward_device`]).
    ///
    /// # Safety
    /// That of [`MoeLayer::forward_device`].
    pub unsafe fn forward(
        &mut self,
        tensors: &[DeviceRankTensors],
        num_tokens_bound: Option<i64>,
        streams: &[u64],
    ) -> Result<()> {
        let bound = num_tokens_bound
            .map(|b| count("num_tokens_bound", b))
            .transpose()?;
        let layer = self.layer.as_mut().ok_or_else(|| {
            Error::Runtime("the layer has no weights yet: call load_weights first".into())
        })?;
        // SAFETY: the caller's contract.
        unsafe { layer.forward_device(tensors, bound, streams)? };
        Ok(())
    }
}

#[cfg(not(test))]
pub(crate) mod bindings {
    //! `megamoe._megamoe.Layer`: conversions only.

    use std::sync::Mutex;

    use megamoe_layer::{DeviceActivations, DeviceRankTensors, IndexType};
    use pyo3::prelude::*;

    use super::{GpuLayer, WeightTensors};
    use crate::api::LayerArgs;
    use crate::error::Error;

    /// One rank's tensors as python/megamoe/layer.py passes them: (tokens, x, x_scales or
    /// None, topk_idx, topk_idx is int64, topk_weights, y), addresses as ints.
    type RankTensors = (usize, u64, Option<u64>, u64, bool, u64, u64);

    /// The native layer behind `megamoe.MoELayer` (python/megamoe/layer.py checks the tensors).
    #[pyclass(name = "Layer", module = "megamoe._megamoe")]
    pub struct Layer(Mutex<GpuLayer>);

    impl Layer {
        fn with<T>(&self, f: impl FnOnce(&mut GpuLayer) -> crate::error::Result<T>) -> PyResult<T> {
            let mut layer = self
                .0
                .lock()
                .map_err(|_| Error::Runtime("an earlier call on this layer panicked".into()))?;
            Ok(f(&mut layer)?)
        }
    }

    #[pymethods]
    impl Layer {
        #[new]
        #[pyo3(signature = (
            num_ranks, num_experts, num_max_tokens_per_rank, num_topk, hidden,
            intermediate_hidden, kind = "fused", group = None, clamp = None
        ))]
        #[allow(clippy::too_many_arguments)] // DeepGEMM's signature, one argument per size.
        fn new(
            num_ranks: i64,
            num_experts: i64,
            num_max_tokens_per_rank: i64,
            num_topk: i64,
            hidden: i64,
            intermediate_hidden: i64,
            kind: &str,
            group: Option<i64>,
            clamp: Option<f64>,
        ) -> PyResult<Layer> {
            let layer = GpuLayer::new(&LayerArgs {
                num_ranks,
                num_experts,
                num_max_tokens_per_rank,
                num_topk,
                hidden,
                intermediate_hidden,
                kind,
                group,
                clamp,
            })?;
            Ok(Layer(Mutex::new(layer)))
        }

        /// (num_ranks, num_experts, num_max_tokens_per_rank, num_topk, hidden,
        /// intermediate_hidden, kind, group, clamp) as the layer was built.
        #[allow(clippy::type_complexity)]
        fn spec(
            &self,
        ) -> PyResult<(
            usize,
            usize,
            usize,
            usize,
            usize,
            usize,
            String,
            usize,
            Option<f32>,
        )> {
            self.with(|l| {
                let s = l.spec;
                Ok((
                    s.ranks,
                    s.shape.experts,
                    s.max_tokens,
                    s.shape.topk,
                    s.shape.hidden,
                    s.shape.inter,
                    s.kind.name().to_string(),
                    s.group,
                    s.clamp,
                ))
            })
        }

        fn rank_device(&self, rank: usize) -> PyResult<usize> {
            self.with(|l| l.rank_device(rank))
        }

        /// Addresses of the four weight tensors on CUDA device `device`, and that device's
        /// current stream.
        #[allow(clippy::too_many_arguments)]
        fn load_weights(
            &self,
            py: Python<'_>,
            w1: u64,
            w1_scales: u64,
            w2: u64,
            w2_scales: u64,
            device: usize,
            stream: u64,
        ) -> PyResult<()> {
            let w = WeightTensors {
                w1,
                w1_scales,
                w2,
                w2_scales,
            };
            // SAFETY: layer.py passes live tensors of the checked shapes on `device`, kept
            // alive by the caller for the call, and that device's current stream.
            py.detach(|| self.with(|l| unsafe { l.load_weights(&w, device, stream) }))
        }

        /// One call: one tuple per rank (see `RankTensors`), and each rank's device's current
        /// stream.
        #[pyo3(signature = (ranks, num_tokens_bound, streams))]
        fn forward(
            &self,
            py: Python<'_>,
            ranks: Vec<RankTensors>,
            num_tokens_bound: Option<i64>,
            streams: Vec<u64>,
        ) -> PyResult<()> {
            let tensors: Vec<DeviceRankTensors> = ranks
                .into_iter()
                .map(
                    |(tokens, x, scales, idx, idx64, weights, y)| DeviceRankTensors {
                        // SAFETY: as for the call below.
                        x: unsafe { DeviceActivations::new(tokens, x, scales) },
                        topk_idx: idx,
                        topk_idx_type: if idx64 {
                            IndexType::I64
                        } else {
                            IndexType::I32
                        },
                        topk_weights: weights,
                        y,
                    },
                )
                .collect();
            // SAFETY: layer.py passes live, contiguous tensors of the checked dtypes and shapes
            // on each rank's device (y a fresh tensor), kept alive by the caller for the call,
            // and each rank's device's current stream.
            py.detach(|| self.with(|l| unsafe { l.forward(&tensors, num_tokens_bound, &streams) }))
        }
    }

    pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add_class::<Layer>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::gpus;

    fn tiny(kind: &'static str) -> LayerArgs<'static> {
        LayerArgs {
            num_ranks: 2,
            num_experts: 16,
            num_max_tokens_per_rank: 64,
            num_topk: 4,
            hidden: 256,
            intermediate_hidden: 128,
            kind,
            group: None,
            clamp: None,
        }
    }

    #[test]
    fn bad_arguments_are_named_before_the_gpu_is_asked() {
        let bad = LayerArgs {
            hidden: 100,
            ..tiny("fused")
        };
        assert!(matches!(GpuLayer::new(&bad), Err(Error::Value(m)) if m.contains("hidden")));
    }

    #[test]
    fn without_a_gpu_the_layer_says_what_is_missing() {
        if gpus().is_ok() {
            return; // the GPU tests cover this machine
        }
        for kind in ["fused", "split"] {
            match GpuLayer::new(&tiny(kind)) {
                Err(Error::Runtime(m)) => assert!(m.contains("needs a CUDA GPU"), "{m}"),
                other => panic!("{kind}: {:?}", other.map(|l| l.spec)),
            }
        }
    }
}
