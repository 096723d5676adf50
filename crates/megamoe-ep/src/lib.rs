//! megamoe-ep: expert-parallel dispatch and combine with the permute fused into the
//! communication kernels (SPEC §5), forward and backward, over NVLink.

pub mod layout;
pub mod params;
pub mod plan;
pub mod reference;

pub use layout::{BufferLayout, BufferSpec, HandleLayout, RowDtype};
pub use plan::{pad_to, validate_topk, PermutePlan};
