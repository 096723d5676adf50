//! The one block-scale rule of SPEC §3: sf(v) = max(amax(v), floor) / 448 and
//! q = e4m3(v · (1/sf)), all in f32. The GPU multiplies by the f32 reciprocal too, so the
//! reference does exactly that (never a division per element).

use super::e4m3::{e4m3_from_f32, E4M3_MAX};

/// Scale floor for layer inputs and weights.
pub const INPUT_SCALE_FLOOR: f32 = 1e-4;

/// Scale floor for the re-quantized SwiGLU output.
pub const INTERMEDIATE_SCALE_FLOOR: f32 = 1e-10;

/// The scale of a group whose largest magnitude is `amax`.
#[inline(always)]
pub fn scale_factor(amax: f32, floor: f32) -> f32 {
    amax.max(floor) / E4M3_MAX
}

/// The largest magnitude in `values` (NaNs ignored, 0 when empty). Eight independent lanes so
/// that it vectorizes; max is exact, so the order does not matter.
#[inline(always)]
pub fn amax(values: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let chunks = values.chunks_exact(8);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (lane, v) in lanes.iter_mut().zip(chunk) {
            *lane = lane.max(v.abs());
        }
    }
    for (lane, v) in lanes.iter_mut().zip(rest) {
        *lane = lane.max(v.abs());
    }
    lanes.iter().fold(0f32, |m, &l| m.max(l))
}

/// `codes[i] = e4m3(values[i] · inverse)`, the encoding half of the scale rule.
#[inline(always)]
pub fn encode_scaled(values: &[f32], inverse: f32, codes: &mut [u8]) {
    assert_eq!(values.len(), codes.len(), "one code per value");
    for (code, v) in codes.iter_mut().zip(values) {
        *code = e4m3_from_f32(v * inverse);
    }
}

/// Quantizes one scale group: writes the e4m3 codes of `values` into `codes` and returns the
/// group's scale, so that `values[i] ≈ e4m3_to_f32(codes[i]) · scale`.
#[inline(always)]
pub fn quantize_group(values: &[f32], floor: f32, codes: &mut [u8]) -> f32 {
    let scale = scale_factor(amax(values), floor);
    encode_scaled(values, 1.0 / scale, codes);
    scale
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numerics::e4m3::e4m3_to_f32;

    #[test]
    fn the_largest_magnitude_maps_to_448() {
        let values = [0.5f32, -3.0, 1.25, 0.0];
        let mut codes = [0u8; 4];
        let scale = quantize_group(&values, INPUT_SCALE_FLOOR, &mut codes);
        assert_eq!(scale, 3.0 / 448.0);
        assert_eq!(e4m3_to_f32(codes[1]), -448.0);
        assert_eq!(e4m3_to_f32(codes[3]), 0.0);
    }

    #[test]
    fn an_all_zero_group_gets_the_floor_scale() {
        let mut codes = [0xffu8; 3];
        let scale = quantize_group(&[0.0; 3], INTERMEDIATE_SCALE_FLOOR, &mut codes);
        assert_eq!(scale, 1e-10f32 / 448.0);
        assert_eq!(codes, [0; 3]);
    }
}
