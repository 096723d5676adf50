//! megamoe-ep: expert-parallel dispatch and combine with the permute fused into the
//! communication kernels (SPEC §5), forward and backward, over NVLink.
//!
//! Runs on megamoe-cuda's [`megamoe_cuda::World`] (one stream per rank, virtual ranks when
//! there are more ranks than GPUs); the layout every row lands in is megamoe-core's
//! [`megamoe_core::permute::PermutePlan`], and the checks compare every output bit with
//! megamoe-core's CPU reference.
//!
//! The API is at the crate root: [`EpWorld`] (built from an [`EpConfig`]) with its dispatch and
//! combine calls, the buffer layout ([`BufferSpec`], [`BufferLayout`]) and the errors
//! ([`EpError`]). [`params`] is the kernels' host/device interface (params structs, headers,
//! error records), for the crates whose kernels include megamoe-ep's device code. With the
//! `harness` feature (the command line turns it on): `selftest`, the GPU checks, `bench`, the
//! dispatch/combine benchmark, and `baseline`, the NCCL path it is measured against.

#[cfg(feature = "harness")]
pub mod baseline;
#[cfg(feature = "harness")]
pub mod bench;
mod error;
mod layout;
pub mod params;
#[cfg(feature = "harness")]
pub mod selftest;
mod world;

pub use error::EpError;
pub use layout::{
    BufferLayout, BufferSpec, HandleLayout, RowDtype, MAX_EXPERTS, MAX_RANKS, MAX_TOPK,
};
pub use params::{kernel_specs, CombineOrder, FaultKind, InjectedFault};
pub use world::{
    CombineOutputs, Dispatched, EpConfig, EpWorld, Handle, HandlePtrs, IoRegion, RankPtrs, Rows,
    SyncMode, WorldGraph, DEFAULT_NUM_SMS,
};
