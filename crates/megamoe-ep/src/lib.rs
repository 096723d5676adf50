//! megamoe-ep: expert-parallel dispatch and combine with the permute fused into the
//! communication kernels (SPEC §5), forward and backward, over NVLink.
//!
//! Runs on megamoe-cuda's [`megamoe_cuda::World`] (one stream per rank, virtual ranks when
//! there are more ranks than GPUs); the layout every row lands in is megamoe-core's
//! [`megamoe_core::permute::PermutePlan`], and the checks compare every output bit with
//! megamoe-core's CPU reference.

#[cfg(feature = "harness")]
pub mod baseline;
#[cfg(feature = "harness")]
pub mod bench;
pub mod error;
pub mod layout;
pub mod params;
#[cfg(feature = "harness")]
pub mod selftest;
pub mod world;

pub use error::EpError;
pub use layout::{BufferLayout, BufferSpec, HandleLayout, RowDtype};
pub use params::{kernel_specs, CombineOrder, FaultKind, InjectedFault};
pub use world::{
    bytemuck_bf16, CombineOutputs, Dispatched, EpConfig, EpWorld, Handle, HandlePtrs, IoRegion,
    RankPtrs, Rows, SyncMode, DEFAULT_NUM_SMS,
};
