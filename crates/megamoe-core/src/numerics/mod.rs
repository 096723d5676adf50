//! The number formats of the layer (SPEC §3): FP8 e4m3, the block-scale rule and how the GEMMs
//! accumulate over K.
//!
//! BF16 is `half::bf16`; its `from_f32` rounds to nearest even, as the GPU's `cvt.rn.bf16.f32`.

pub mod accumulation;
pub mod e4m3;
pub mod scale;

pub use accumulation::Accumulation;
pub use e4m3::{e4m3_from_f32, e4m3_round, e4m3_to_f32, E4M3_MAX, E4M3_NAN};
pub use scale::{
    amax, encode_scaled, quantize_group, scale_factor, INPUT_SCALE_FLOOR, INTERMEDIATE_SCALE_FLOOR,
};
