//! FP8 e4m3 (`e4m3fn`): 1 sign, 4 exponent (bias 7) and 3 mantissa bits, no infinities, the
//! codes 0x7f / 0xff are NaN, the largest finite magnitude is 448 (code 0x7e). Subnormals are
//! multiples of 2^-9 below 2^-6, so every finite e4m3 value is an integer multiple of 2^-9.

/// Largest finite e4m3 magnitude.
pub const E4M3_MAX: f32 = 448.0;

/// The NaN code `cvt.rn.satfinite.e4m3x2.f32` produces for a NaN input.
pub const E4M3_NAN: u8 = 0x7f;

/// Smallest normal e4m3 magnitude, 2^-6.
const MIN_NORMAL: f32 = 1.0 / 64.0;

/// Encodes `x` as e4m3 exactly as PTX `cvt.rn.satfinite.e4m3x2.f32`: round to nearest, ties to
/// even; magnitudes at or beyond 448 (infinities included) saturate to ±448; NaN gives 0x7f;
/// the sign of zero is kept.
///
/// Branch-free on purpose so that quantization loops vectorize.
#[inline(always)]
pub fn e4m3_from_f32(x: f32) -> u8 {
    let sign = ((x.to_bits() >> 24) & 0x80) as u8;
    let a = x.abs();
    let bits = a.to_bits();
    // Normal range: round the f32 mantissa to 3 bits (ties to even) and rebias the exponent from
    // 127 to 7; a mantissa carry moves into the exponent, which is the correct result.
    let rounded = bits + 0x7_ffff + ((bits >> 20) & 1);
    let normal = (rounded >> 20).wrapping_sub(120 << 3);
    // Subnormal range: adding 2^14 (whose f32 ulp is 2^-9) rounds `a` to a multiple of 2^-9,
    // ties to even, leaving the multiple in the low mantissa bits (8 is 2^-6, code 0x08).
    let subnormal = (a + 16384.0).to_bits() - 16384f32.to_bits();
    let magnitude = if a < MIN_NORMAL { subnormal } else { normal };
    let magnitude = if a >= E4M3_MAX { 0x7e } else { magnitude };
    if x.is_nan() {
        E4M3_NAN
    } else {
        sign | magnitude as u8
    }
}

/// Decodes an e4m3 code; 0x7f and 0xff decode to NaN.
#[inline(always)]
pub fn e4m3_to_f32(code: u8) -> f32 {
    let magnitude = u32::from(code & 0x7f);
    let normal = f32::from_bits((magnitude << 20) + (120 << 23));
    let subnormal = magnitude as f32 * (1.0 / 512.0);
    let value = if magnitude < 8 { subnormal } else { normal };
    let value = if magnitude == 0x7f { f32::NAN } else { value };
    if code & 0x80 != 0 {
        -value
    } else {
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_codes_decode_to_their_values() {
        assert_eq!(e4m3_to_f32(0x00), 0.0);
        assert!(e4m3_to_f32(0x80).is_sign_negative());
        assert_eq!(e4m3_to_f32(0x01), 1.0 / 512.0);
        assert_eq!(e4m3_to_f32(0x07), 7.0 / 512.0);
        assert_eq!(e4m3_to_f32(0x08), 1.0 / 64.0);
        assert_eq!(e4m3_to_f32(0x38), 1.0);
        assert_eq!(e4m3_to_f32(0x3c), 1.5);
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        assert_eq!(e4m3_to_f32(0xfe), -448.0);
        assert!(e4m3_to_f32(0x7f).is_nan() && e4m3_to_f32(0xff).is_nan());
    }
}
