//! The MoE layer on the GPU for Python (`megamoe.MoELayer`, python/megamoe/layer.py): a
//! layer built from DeepGEMM-style arguments, its weights loaded from device tensors, and
//! the forward pass on device tensors ([`MoeLayer::forward_device`]). Python checks each
//! tensor's dtype, shape, device and layout and passes its address; this file checks what
//! the values must satisfy, through megamoe-layer.
//!
//! A layer holds every rank of its world ([`GpuLayer::new`]), or one rank of a world of one
//! process per rank ([`GpuLayer::for_rank`], either kind, as torchrun launches them): its
//! weights are then this rank's experts alone, and its calls take this rank's tensors alone.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use megamoe_core::weights::RankWeightsFp8;
use megamoe_cuda::{AllGather, Gpu};
use megamoe_layer::{DeviceRankTensors, LayerSpec, MoeLayer};

use crate::api::{count, process_rank, require_gpu, LayerArgs};
use crate::error::{Error, Result};

/// A layer of `spec`; its buffers and kernels exist once its weights are loaded (they are
/// uploaded when the layer is built).
pub struct GpuLayer {
    pub spec: LayerSpec,
    /// This process's rank where it holds one ([`Self::for_rank`]); None: every rank.
    own: Option<OwnRank>,
    layer: Option<MoeLayer>,
}

/// The one rank of a layer with one process per rank: its number, its CUDA device, and the
/// exchange of the symmetric buffers' handles, called each time the layer is built (every
/// `load_weights`).
struct OwnRank {
    rank: usize,
    device: usize,
    exchange: Arc<Mutex<Box<dyn AllGather>>>,
}

/// One use of an [`OwnRank`]'s exchange, for one build of the layer.
struct SharedExchange {
    rank: usize,
    exchange: Arc<Mutex<Box<dyn AllGather>>>,
}

impl AllGather for SharedExchange {
    fn all_gather(&mut self, mine: &[u8]) -> megamoe_cuda::Result<Vec<Vec<u8>>> {
        let mut exchange = self
            .exchange
            .lock()
            .map_err(|_| megamoe_cuda::Error::Exchange {
                rank: self.rank,
                reason: "an earlier exchange of this layer panicked".into(),
            })?;
        exchange.all_gather(mine)
    }
}

/// Device addresses of the weights of the layer's local experts in the SPEC §2 layouts, E_x
/// experts from the first local rank's first: W1 e4m3 `[E_x, 2I, H]`, S1 f32 `[E_x, 2I/128,
/// H/128]`, W2 e4m3 `[E_x, H, I]`, S2 f32 `[E_x, H/128, I/128]`. A layer of every rank takes
/// all E (rank r experts r·E_l … (r+1)·E_l − 1), one of a single rank its E_l alone.
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
        Ok(GpuLayer {
            spec,
            own: None,
            layer: None,
        })
    }

    /// The checked spec, rank and device of [`Self::for_rank`], touching no GPU: the spec's
    /// rules, `rank` below `num_ranks`, `device` not negative.
    pub fn rank_config(
        args: &LayerArgs,
        rank: i64,
        device: i64,
    ) -> Result<(LayerSpec, usize, usize)> {
        let spec = args.spec()?;
        let (rank, device) = process_rank(rank, device, spec.ranks)?;
        Ok((spec, rank, device))
    }

    /// Rank `rank` of a world of `spec.ranks` processes (one rank each), on CUDA device
    /// `device` (checked by [`Self::rank_config`]). Nothing is allocated and `exchange` is not
    /// called until the weights are loaded; a device past the visible ones is a `ValueError`.
    pub fn for_rank(
        spec: LayerSpec,
        rank: usize,
        device: usize,
        exchange: Box<dyn AllGather>,
    ) -> Result<GpuLayer> {
        let gpus = require_gpu()?;
        if device >= gpus {
            return Err(Error::Value(format!(
                "device: {device} is not below the {gpus} visible CUDA devices"
            )));
        }
        Ok(GpuLayer {
            spec,
            own: Some(OwnRank {
                rank,
                device,
                exchange: Arc::new(Mutex::new(exchange)),
            }),
            layer: None,
        })
    }

    /// The ranks this layer holds, in the order of its calls' per-rank tensors: every rank, or
    /// this process's one.
    pub fn local_ranks(&self) -> Range<usize> {
        match &self.own {
            Some(own) => own.rank..own.rank + 1,
            None => 0..self.spec.ranks,
        }
    }

    /// The CUDA device rank `rank` runs on (ranks go round the visible GPUs; a process's own
    /// rank is on the device it was built for).
    pub fn rank_device(&self, rank: usize) -> Result<usize> {
        if let Some(own) = &self.own {
            if rank != own.rank {
                return Err(Error::Value(format!(
                    "rank: {rank} is not the rank of this process ({})",
                    own.rank
                )));
            }
        } else if rank >= self.spec.ranks {
            return Err(Error::Value(format!(
                "rank: {rank} is not below num_ranks {}",
                self.spec.ranks
            )));
        }
        Ok(match (&self.layer, &self.own) {
            (Some(layer), _) => layer.gpu(rank).ordinal(),
            (None, Some(own)) => own.device,
            (None, None) => rank % require_gpu()?,
        })
    }

    /// Reads the local ranks' experts from `w` on device `device` (after the work queued on
    /// `stream`, that device's stream) and builds the layer with them, replacing any earlier
    /// one. The bytes pass through the host: the load is a one-time re-layout (W1's gate and
    /// up blocks interleaved, megamoe-layer's weights.rs). A layer of one rank per process
    /// exchanges its symmetric buffers' handles here: every process of the world loads its
    /// weights, in the same order.
    ///
    /// # Safety
    /// The addresses must hold the four tensors of [`WeightTensors`] for this layer's shape and
    /// local ranks, on device `device`; `stream` a live stream of that device's primary
    /// context, or 0.
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
        let local = self.local_ranks();
        let mut ranks = Vec::with_capacity(local.len());
        for r in 0..local.len() {
            let (w1, s1) = (el * 2 * i * h, el * blocks(2 * i, h));
            let (w2, s2) = (el * h * i, el * blocks(h, i));
            let mut rank = RankWeightsFp8 {
                w1: vec![0; w1],
                s1: vec![0.0; s1],
                w2: vec![0; w2],
                s2: vec![0.0; s2],
            };
            let at = |base: u64, len: usize, item: usize| base + (r * len * item) as u64;
            // SAFETY: the caller's contract: local rank r's experts lie inside each tensor.
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
        let first = local.start;
        let weights = |r: usize| Ok(ranks[r - first].clone());
        self.layer = Some(match &self.own {
            None => MoeLayer::new(*s, weights)?,
            Some(own) => {
                let exchange = Box::new(SharedExchange {
                    rank: own.rank,
                    exchange: Arc::clone(&own.exchange),
                });
                MoeLayer::for_rank(*s, weights, own.rank, own.device, exchange)?
            }
        });
        Ok(())
    }

    /// One call of every local rank: checked on the host and waited for
    /// ([`MoeLayer::forward_device`]), or with `queued`, queued with no host synchronization
    /// and its values checked on the device ([`MoeLayer::launch_device`]).
    ///
    /// # Safety
    /// That of the call it makes.
    pub unsafe fn forward(
        &mut self,
        tensors: &[DeviceRankTensors],
        num_tokens_bound: Option<i64>,
        streams: &[u64],
        queued: bool,
    ) -> Result<()> {
        let bound = num_tokens_bound
            .map(|b| count("num_tokens_bound", b))
            .transpose()?;
        let layer = self.built()?;
        // SAFETY: the caller's contract.
        unsafe {
            if queued {
                layer.launch_device(tensors, bound, streams)?
            } else {
                layer.forward_device(tensors, bound, streams)?
            }
        };
        Ok(())
    }

    /// Waits for the local ranks and reports what the device found since the last check.
    pub fn check(&mut self) -> Result<()> {
        Ok(self.built()?.check()?)
    }

    /// Rows each local expert of rank `rank` (one this layer holds) has received over the
    /// host-checked calls of [`Self::forward`] (queued ones count on the device).
    pub fn expert_counts(&mut self, rank: usize) -> Result<Vec<u64>> {
        self.rank_device(rank)?;
        Ok(self.built()?.expert_counts()[rank].clone())
    }

    fn built(&mut self) -> Result<&mut MoeLayer> {
        self.layer.as_mut().ok_or_else(|| {
            Error::Runtime("the layer has no weights yet: call load_weights first".into())
        })
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
    use crate::ep::py::PyAllGather;
    use crate::error::Error;

    /// One rank's tensors as python/megamoe/layer.py passes them: (tokens, x, x_scales or
    /// None, topk_idx, topk_idx is int64, topk_weights, y, recv_stats or None), addresses as
    /// ints.
    type RankTensors = (usize, u64, Option<u64>, u64, bool, u64, u64, Option<u64>);

    /// Each rank's tensors as the layer takes them.
    ///
    /// # Safety
    /// The addresses must be what `DeviceRankTensors` says, for the call that takes them.
    unsafe fn device_tensors(ranks: Vec<RankTensors>) -> Vec<DeviceRankTensors> {
        ranks
            .into_iter()
            .map(
                |(tokens, x, scales, idx, idx64, weights, y, recv_stats)| DeviceRankTensors {
                    // SAFETY: the caller's contract.
                    x: unsafe { DeviceActivations::new(tokens, x, scales) },
                    topk_idx: idx,
                    topk_idx_type: if idx64 {
                        IndexType::I64
                    } else {
                        IndexType::I32
                    },
                    topk_weights: weights,
                    y,
                    recv_stats,
                },
            )
            .collect()
    }

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
            intermediate_hidden, kind = "fused", scale_granularity = None, clamp = None,
            accumulation = "per-block"
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
            scale_granularity: Option<i64>,
            clamp: Option<f64>,
            accumulation: &str,
        ) -> PyResult<Layer> {
            let layer = GpuLayer::new(&LayerArgs {
                num_ranks,
                num_experts,
                num_max_tokens_per_rank,
                num_topk,
                hidden,
                intermediate_hidden,
                kind,
                group: scale_granularity,
                clamp,
                accumulation: Some(accumulation),
            })?;
            Ok(Layer(Mutex::new(layer)))
        }

        /// Rank `rank` of a world of `num_ranks` processes (one rank each, either kind), on
        /// CUDA device `device`; `all_gather(bytes) -> list[bytes]` swaps the symmetric
        /// buffers' handles when the weights are loaded, and is called by every process in the
        /// same order. The other arguments are `Layer`'s. Arguments are checked (ValueError
        /// naming the argument) before any GPU is touched or `all_gather` called.
        #[staticmethod]
        #[pyo3(signature = (
            rank, device, all_gather, num_ranks, num_experts, num_max_tokens_per_rank, num_topk,
            hidden, intermediate_hidden, kind = "fused", scale_granularity = None, clamp = None,
            accumulation = "per-block"
        ))]
        #[allow(clippy::too_many_arguments)] // Layer's arguments and the process's rank.
        fn for_rank(
            rank: i64,
            device: i64,
            all_gather: &Bound<'_, PyAny>,
            num_ranks: i64,
            num_experts: i64,
            num_max_tokens_per_rank: i64,
            num_topk: i64,
            hidden: i64,
            intermediate_hidden: i64,
            kind: &str,
            scale_granularity: Option<i64>,
            clamp: Option<f64>,
            accumulation: &str,
        ) -> PyResult<Layer> {
            let args = LayerArgs {
                num_ranks,
                num_experts,
                num_max_tokens_per_rank,
                num_topk,
                hidden,
                intermediate_hidden,
                kind,
                group: scale_granularity,
                clamp,
                accumulation: Some(accumulation),
            };
            let (spec, rank, device) = GpuLayer::rank_config(&args, rank, device)?;
            let exchange = PyAllGather::new(all_gather, rank)?;
            let layer = GpuLayer::for_rank(spec, rank, device, exchange)?;
            Ok(Layer(Mutex::new(layer)))
        }

        /// The ranks this layer holds, in the order of `forward`'s per-rank tuples: every
        /// rank, or this process's one.
        fn local_ranks(&self) -> PyResult<Vec<usize>> {
            self.with(|l| Ok(l.local_ranks().collect()))
        }

        /// (num_ranks, num_experts, num_max_tokens_per_rank, num_topk, hidden,
        /// intermediate_hidden, kind, scale_granularity, clamp, accumulation) as the layer was
        /// built.
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
            &'static str,
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
                    s.accumulation.name(),
                ))
            })
        }

        fn rank_device(&self, rank: usize) -> PyResult<usize> {
            self.with(|l| l.rank_device(rank))
        }

        /// Addresses of the four weight tensors (the local ranks' experts) on CUDA device
        /// `device`, and that device's current stream.
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

        /// One call: one tuple per local rank (see `RankTensors`), and each rank's device's
        /// current stream.
        #[pyo3(signature = (ranks, num_tokens_bound, streams))]
        fn forward(
            &self,
            py: Python<'_>,
            ranks: Vec<RankTensors>,
            num_tokens_bound: Option<i64>,
            streams: Vec<u64>,
        ) -> PyResult<()> {
            // SAFETY: layer.py passes live, contiguous tensors of the checked dtypes and shapes
            // on each rank's device (y a fresh tensor), kept alive by the caller for the call,
            // and each rank's device's current stream.
            let tensors = unsafe { device_tensors(ranks) };
            // SAFETY: as above.
            py.detach(|| {
                self.with(|l| unsafe { l.forward(&tensors, num_tokens_bound, &streams, false) })
            })
        }

        /// One call queued with no host synchronization (`forward`'s arguments); the values
        /// are checked on the device and reported by a later call or `check`.
        #[pyo3(signature = (ranks, num_tokens_bound, streams))]
        fn launch(
            &self,
            ranks: Vec<RankTensors>,
            num_tokens_bound: Option<i64>,
            streams: Vec<u64>,
        ) -> PyResult<()> {
            // SAFETY: layer.py and python/megamoe/deep_gemm.py pass live, contiguous tensors of the checked
            // dtypes and shapes on each rank's device, which the caller's stream keeps alive
            // until the call has run, and each rank's device's current stream.
            let tensors = unsafe { device_tensors(ranks) };
            // SAFETY: as above. Queuing only: the GIL stays held (no wait).
            self.with(|l| unsafe { l.forward(&tensors, num_tokens_bound, &streams, true) })
        }

        /// Rows each local expert of rank `rank` received over the calls of `forward`.
        fn expert_counts(&self, rank: usize) -> PyResult<Vec<u64>> {
            self.with(|l| l.expert_counts(rank))
        }

        /// Waits for the layer's calls and raises what the device found since the last check.
        fn check(&self, py: Python<'_>) -> PyResult<()> {
            py.detach(|| self.with(|l| l.check()))
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
            accumulation: None,
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
    fn a_process_ranks_arguments_are_value_errors_before_any_gpu_is_touched() {
        let args = tiny("fused");
        assert_eq!(GpuLayer::rank_config(&args, 1, 0).unwrap().1, 1);
        let value = |a: &LayerArgs, rank, device| match GpuLayer::rank_config(a, rank, device) {
            Err(Error::Value(m)) => m,
            other => panic!("{:?}", other.map(|c| c.0)),
        };
        assert_eq!(value(&args, 2, 0), "rank: 2 is not below num_ranks = 2");
        assert!(value(&args, -1, 0).starts_with("rank: "));
        assert!(value(&args, 0, -1).starts_with("device: "));
        assert_eq!(GpuLayer::rank_config(&tiny("split"), 1, 0).unwrap().1, 1);
        let hidden = LayerArgs {
            hidden: 100,
            ..tiny("fused")
        };
        assert!(value(&hidden, 0, 0).contains("hidden"));
    }

    struct Unreachable;

    impl AllGather for Unreachable {
        fn all_gather(&mut self, _: &[u8]) -> megamoe_cuda::Result<Vec<Vec<u8>>> {
            panic!("nothing is exchanged before the weights are loaded")
        }
    }

    #[test]
    fn without_a_gpu_a_process_rank_says_what_is_missing_before_any_exchange() {
        if gpus().is_ok() {
            return; // the GPU tests cover this machine
        }
        let (spec, rank, device) = GpuLayer::rank_config(&tiny("fused"), 1, 0).unwrap();
        match GpuLayer::for_rank(spec, rank, device, Box::new(Unreachable)) {
            Err(Error::Runtime(m)) => assert!(m.contains("needs a CUDA GPU"), "{m}"),
            other => panic!("{:?}", other.map(|l| l.spec)),
        }
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
