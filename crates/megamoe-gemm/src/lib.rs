//! FP8 block-scaled grouped GEMM for Hopper: y = x · Wᵀ over experts with e4m3 operands,
//! per-token activation scales (groups of G = 128 or 64 along K) and 128 × 128 weight-block
//! scales, f32 promotion per K group, bf16 or f32 output (SPEC §3 steps 1 and 4). One TMA
//! producer warp, two wgmma consumer warpgroups, a persistent tile scheduler over experts.
//!
//! Operand layouts (what dispatch must produce):
//! - activations: e4m3 rows, K bytes each. *Contiguous*: rows grouped by expert, each expert's
//!   segment padded with zero rows to a multiple of `pad` (64 or 128); `expert_rows[e]` (i32)
//!   holds the padded segment sizes. Pad 128 for prefill-sized groups (pad 64 forces 64-row
//!   tiles, and 64-row last blocks in 128-row tiles measured slower than the padding they save:
//!   docs/PERF.md v4); pad 64 for decode-sized groups (≤ 64 rows per expert). *Masked*: `[E, max_m, K]`, `expert_rows[e]` the valid rows.
//! - activation scales: f32, K-group-major (transposed, as the TMA loads them): contiguous
//!   `[K/G, rows]`, masked `[E, K/G, max_m]`; padding rows have scale 0.
//! - weights: e4m3 `[E, N, K]`; weight scales f32 `[E, N/128, K/128]`. N and K are multiples
//!   of 128, K at most 16384 (a tile's weight scales are staged in shared memory).
//! - output: rows like the activations, N columns. Contiguous writes every row (padding rows
//!   become 0); masked writes only rows below each expert's count.
//!
//! Device code lives in `device/megamoe_gemm/` (ptx/, mma/, layout/, pipeline/, scheduler/,
//! epilogue/, impls/) and is compiled per configuration by megamoe-cuda's JIT
//! ([`kernel::kernel_specs`] lists every configuration the heuristics can pick).
//! `MEGAMOE_GEMM_LOG=1` prints each chosen configuration.
//!
//! The API is at the crate root: [`GroupedGemm`] over [`GemmPointers`], the problem and the
//! configuration the heuristics [`choose`], the errors. The modules the layer's fused kernel
//! builds on stay public: [`heuristics`] (every configuration rule), [`grouped`] (the params of
//! one problem, the waits), [`kernel`] (headers, thread count, kernel specs) and [`params`]
//! (the device params structs). With the `harness` feature (the command line turns it on):
//! `checks`, the GPU checks of `megamoe selftest`, `bench`, the GEMM benchmark, and their
//! operands (`testdata`) and CPU reference (`reference`).

#[cfg(feature = "harness")]
pub mod bench;
#[cfg(feature = "harness")]
pub mod checks;
mod error;
pub mod grouped;
pub mod heuristics;
pub mod kernel;
pub mod params;
#[cfg(feature = "harness")]
pub mod reference;
#[cfg(feature = "harness")]
pub mod testdata;

pub use error::{GemmError, Result};
pub use grouped::{GemmPointers, GroupedGemm};
pub use heuristics::{choose, GemmConfig, GemmProblem, Layout, OutDtype};
