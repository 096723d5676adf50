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
//!   (W1's gate and up blocks interleaved), [`SplitLayer::forward`] with bf16 or e4m3 input,
//!   every input checked before anything is written, the cumulative per-expert received-row
//!   counts.
//! - A call's per-rank inputs, host slices ([`RankInput`], [`Activations`]) or device tensors
//!   ([`DeviceRankTensors`], [`DeviceActivations`]), checked on the host the same way for both
//!   kinds before anything is written.
//! - [`MoeLayer::forward_device`]: the forward pass on tensors already on the GPU (a
//!   framework's), by device address, after the caller's stream, one entry per local rank;
//!   [`MoeLayer::launch_device`] queues it with no host synchronization (the fused kind).
//! - One process per rank (torchrun): [`MoeLayer::for_rank`] (the fused kind,
//!   [`FusedLayer::for_rank`]) builds this process's rank, the symmetric buffers' handles
//!   exchanged through a caller-given `megamoe_cuda::AllGather`; calls take and return this
//!   rank's tensors ([`MoeLayer::local_ranks`]).
//! - Virtual ranks (more ranks than GPUs) are safe for the kernels that wait on each other:
//!   dispatch and combine of every rank on a GPU are sized to be resident at once (at most the
//!   GPU's SMs over its ranks, one block per SM each), and the GEMMs wait on nobody.
//! - Device code: `device/megamoe_layer/` (`epilogue/` the SwiGLU epilogue, `impls/` the
//!   kernels), built on `<megamoe_gemm/...>` and compiled per configuration by megamoe-cuda's
//!   JIT ([`kernel_specs`] lists every configuration).
//! - With the `harness` feature (the command line turns it on): `selftest`, the GPU checks
//!   `megamoe selftest` runs, `bench`, the layer benchmark, and `inputs`, a generated batch as
//!   the layer's inputs.
//!
//! # Reading the source
//! From the API to the launch, top-down:
//! 1. `layer.rs`: [`MoeLayer`], one type over both kinds, each call handed to the kind's layer;
//!    `device_io.rs`: its calls on device tensors.
//! 2. `spec.rs`: [`LayerSpec`], its checks, the buffer sizes; `call.rs`: the call's inputs and
//!    their host checks, shared by both kinds.
//! 3. `fused.rs`: [`FusedLayer`]: `build` (buffers, kernel, each rank's weights and params),
//!    then per call `stage` (check, upload), `launch` (quantizer, then the kernel on each
//!    rank's stream) and `finish` (wait, read the error records). Beside it `fused/trace.rs`
//!    (the timeline's report), `fused/probe.rs` (the probe instantiation, the injected faults)
//!    and `fused/inspect.rs` (what the checks read back, with `harness`).
//! 4. `kernel.rs`: the kernels' params structs and [`megamoe_cuda::KernelSpec`]s;
//!    `stage.rs`: the staging kernel of device calls; `weights.rs`: W1's interleaving.
//! 5. `split.rs`: [`SplitLayer`], the same steps over megamoe-ep and megamoe-gemm's launches.
#[cfg(feature = "harness")]
pub mod bench;
mod call;
mod device_io;
mod error;
mod fused;
#[cfg(feature = "harness")]
pub mod inputs;
mod kernel;
mod layer;
#[cfg(feature = "harness")]
pub mod selftest;
mod spec;
mod split;
mod stage;
mod weights;

pub use call::{Activations, DeviceActivations, DeviceRankTensors, IndexType, RankInput};
pub use error::{LayerError, Result};
pub use fused::{FusedGraph, FusedLayer, FusedOptions, FusedStaged, KindTrace, TraceReport};
pub use layer::MoeLayer;
pub use spec::{Kind, LayerBytes, LayerSpec};
pub use split::{Phase, SplitLayer, Staged};

/// The device headers generated from this crate's declarations (megamoe-cuda's `interface`).
pub fn generated_headers() -> Vec<megamoe_cuda::interface::GeneratedHeader> {
    let mut headers = kernel::generated_headers();
    headers.push(stage::generated_header());
    headers
}

/// Registry hook: every kernel configuration this crate launches.
pub fn kernel_specs() -> Vec<megamoe_cuda::KernelSpec> {
    let mut specs = kernel::kernel_specs();
    specs.push(stage::stage_spec());
    specs
}

#[cfg(test)]
mod tests {
    #[test]
    fn generated_headers_are_current() {
        megamoe_cuda::interface::check_headers(
            env!("CARGO_MANIFEST_DIR"),
            &super::generated_headers(),
        );
    }
}
