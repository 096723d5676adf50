//! megamoe-ep: expert-parallel dispatch and combine with the permute fused into the
//! communication kernels (SPEC §5), forward and backward, over NVLink.

pub mod baseline;
pub mod error;
pub mod gpu;
pub mod layout;
pub mod params;
pub mod plan;
pub mod reference;
pub mod routing;
pub mod selftest;
pub mod world;

pub use error::EpError;
pub use layout::{BufferLayout, BufferSpec, HandleLayout, RowDtype};
pub use plan::{pad_to, validate_topk, PermutePlan};
pub use world::{
    bytemuck_bf16, Dispatched, EpConfig, EpWorld, Handle, IoRegion, RankPtrs, Rows, SyncMode,
    DEFAULT_NUM_SMS,
};
