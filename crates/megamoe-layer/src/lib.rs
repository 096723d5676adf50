//! The MoE layer on the GPU (SPEC §3, §4), built from megamoe-ep's dispatch/combine and
//! megamoe-gemm's FP8 grouped GEMM.
//!
//! - [`LayerSpec`]: shape, ranks, T_max, G, clamp; [`LayerSpec::bytes`] is the size query (no
//!   GPU needed).
//! - [`MoeLayer`]: the layer of the spec's kind, [`FusedLayer`] (the default: one persistent
//!   launch per rank, SPEC §4 fused) or [`SplitLayer`].
//! - [`FusedLayer`]: pull, both GEMMs over a ring and the combine in one kernel, the task stream
//!   of megamoe-core's planner; CUDA-graph capture with new inputs on replay.
//! - [`SplitLayer`]: the split form on a world of real or virtual ranks: one-time weight load
//!   (W1's gate and up blocks interleaved, [`weights`]), [`SplitLayer::forward`] with bf16 or
//!   e4m3 input, every input checked before anything is written, the cumulative per-expert
//!   received-row counts.
//! - [`call`]: a call's per-rank inputs (host slices or device tensors) and their host checks,
//!   shared by both kinds.
//! - [`MoeLayer::forward_device`] ([`device_io`]): the forward pass on tensors already on the
//!   GPU (a framework's), by device address, after the caller's stream, one entry per local
//!   rank.
//! - One process per rank (torchrun): [`MoeLayer::for_rank`] (the fused kind,
//!   [`FusedLayer::for_rank`]) builds this process's rank, the symmetric buffers' handles
//!   exchanged through a caller-given `megamoe_cuda::AllGather`; calls take and return this
//!   rank's tensors ([`MoeLayer::local_ranks`]).
//! - Virtual ranks (more ranks than GPUs) are safe for the kernels that wait on each other:
//!   dispatch and combine of every rank on a GPU are sized to be resident at once (at most the
//!   GPU's SMs over its ranks, one block per SM each), and the GEMMs wait on nobody
//!   ([`split`]).
//! - Device code: `device/megamoe_layer/` (`epilogue/` the SwiGLU epilogue, `impls/` the
//!   kernels), built on `<megamoe_gemm/...>` and compiled per configuration by megamoe-cuda's
//!   JIT ([`kernel::kernel_specs`]).
#[cfg(feature = "harness")]
pub mod bench;
pub mod call;
pub mod device_io;
pub mod error;
pub mod fused;
#[cfg(feature = "harness")]
pub mod inputs;
pub mod kernel;
pub mod layer;
#[cfg(feature = "harness")]
pub mod selftest;
pub mod spec;
pub mod split;
pub mod stage;
pub mod weights;

pub use call::{Activations, DeviceActivations, DeviceRankTensors, IndexType, RankInput};
pub use error::{LayerError, Result};
pub use fused::{FusedGraph, FusedLayer, FusedStaged};
pub use layer::MoeLayer;
pub use spec::{Kind, LayerBytes, LayerSpec};
pub use split::{SplitLayer, Staged};
