//! FP8 block-scaled grouped GEMM for Hopper: y = x · Wᵀ over experts with e4m3 operands,
//! per-token activation scales (groups of 128 or 64 along K) and 128 × 128 weight-block scales,
//! f32 promotion per K group, bf16 or f32 output (SPEC §3 steps 1 and 4). TMA producer,
//! two wgmma consumer warpgroups, persistent tile scheduler; contiguous and masked layouts.

pub mod bench;
pub mod checks;
pub mod error;
pub mod grouped;
pub mod heuristics;
pub mod kernel;
pub mod params;
pub mod reference;
pub mod testdata;

pub use error::{GemmError, Result};
pub use grouped::{GemmPointers, GroupedGemm};
pub use heuristics::{choose, GemmConfig, GemmProblem, Layout, OutDtype};
