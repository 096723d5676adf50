//! The MoE layer on the GPU (SPEC §3, §4), built from megamoe-ep's dispatch/combine and
//! megamoe-gemm's FP8 grouped GEMM.
pub mod bench;
pub mod error;
pub mod kernel;
pub mod selftest;
pub mod spec;
pub mod split;
pub mod weights;

pub use error::{LayerError, Result};
pub use spec::{Kind, LayerBytes, LayerSpec};
pub use split::{Activations, RankInput, SplitLayer, Staged};
