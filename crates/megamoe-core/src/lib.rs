//! megamoe-core: everything of the megamoe MoE layer that is pure Rust.
//!
//! Shapes and presets, the FP8/BF16 number formats, quantizers, routing generation and
//! validation, the CPU reference of the fused layer (SPEC §3) and of dispatch/combine with
//! permute (SPEC §5), and the schedule and memory planner. No CUDA here: the GPU crates replay
//! what this crate defines and are checked against it.

mod batch;
pub mod diff;
mod error;
pub mod floor;
pub mod limits;
pub mod numerics;
pub mod permute;
pub mod plan;
pub mod preset;
pub mod quant;
pub mod reference;
pub mod rng;
pub mod routing;
pub mod sim;
mod simd;
pub mod weights;

pub use batch::{RankInputs, WorldInputs};
pub use error::{Error, Result};
pub use numerics::Accumulation;
pub use preset::{Preset, Shape, PRESETS};
pub use reference::{fused_layer, fused_layer_and_f64, fused_layer_f64, LayerOptions};
pub use weights::{Matrix, WeightGen, WeightSource};
