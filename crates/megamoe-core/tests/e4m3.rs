//! FP8 e4m3 and BF16 conversions against a slow, obviously correct nearest-value search.

use half::bf16;
use megamoe_core::numerics::{e4m3_from_f32, e4m3_to_f32, E4M3_NAN};
use proptest::prelude::*;

/// The e4m3 code nearest to `x` by exhaustive search: ties to the even code (mantissa LSB 0),
/// saturation to ±448 at and beyond 448, NaN to 0x7f, the sign kept.
fn nearest_by_search(x: f32) -> u8 {
    if x.is_nan() {
        return E4M3_NAN;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = f64::from(x.abs());
    if a >= 448.0 {
        return sign | 0x7e;
    }
    let mut best = (0u8, f64::INFINITY);
    for code in 0..=0x7eu8 {
        let d = (f64::from(e4m3_to_f32(code)) - a).abs();
        if d < best.1 || (d == best.1 && code % 2 == 0) {
            best = (code, d);
        }
    }
    sign | best.0
}

/// The next f32 away from zero / towards zero, for positive finite `x`.
fn up(x: f32) -> f32 {
    f32::from_bits(x.to_bits() + 1)
}
fn down(x: f32) -> f32 {
    f32::from_bits(x.to_bits() - 1)
}

#[test]
fn every_code_decodes_and_encodes_back_to_itself() {
    for code in 0..=255u8 {
        let v = e4m3_to_f32(code);
        if code & 0x7f == 0x7f {
            assert!(v.is_nan(), "{code:#x}");
            assert_eq!(e4m3_from_f32(v), E4M3_NAN);
        } else {
            assert_eq!(e4m3_from_f32(v), code, "{code:#x} = {v}");
            assert_eq!(v.is_sign_negative(), code & 0x80 != 0, "{code:#x}");
        }
    }
}

#[test]
fn decoded_values_are_increasing_multiples_of_2_pow_minus_9() {
    for code in 0..0x7eu8 {
        let (v, next) = (e4m3_to_f32(code), e4m3_to_f32(code + 1));
        assert!(v < next, "{code:#x}");
        assert_eq!((v * 512.0).fract(), 0.0);
    }
    assert_eq!(e4m3_to_f32(0x7e), 448.0);
}

#[test]
fn midpoints_round_to_the_even_code_and_neighbours_to_the_nearest() {
    for code in 0..0x7eu8 {
        let (lo, hi) = (e4m3_to_f32(code), e4m3_to_f32(code + 1));
        // At most 5 significant bits: the midpoint is exact in f32.
        let mid = (lo + hi) / 2.0;
        assert_eq!(f64::from(mid), (f64::from(lo) + f64::from(hi)) / 2.0);
        let even = if code % 2 == 0 { code } else { code + 1 };
        assert_eq!(e4m3_from_f32(mid), even, "midpoint {mid}");
        assert_eq!(e4m3_from_f32(-mid), 0x80 | even, "midpoint -{mid}");
        assert_eq!(e4m3_from_f32(up(mid)), code + 1, "above {mid}");
        assert_eq!(e4m3_from_f32(down(mid)), code, "below {mid}");
        assert_eq!(e4m3_from_f32(-up(mid)), 0x80 | (code + 1));
        assert_eq!(e4m3_from_f32(-down(mid)), 0x80 | code);
    }
}

#[test]
fn magnitudes_at_and_beyond_448_saturate_including_infinity() {
    for x in [
        448.0f32,
        up(448.0),
        463.0,
        464.0,
        480.0,
        1e6,
        f32::MAX,
        f32::INFINITY,
    ] {
        assert_eq!(e4m3_from_f32(x), 0x7e, "{x}");
        assert_eq!(e4m3_from_f32(-x), 0xfe, "-{x}");
    }
    // 432 is the midpoint of 416 (0x7d, odd) and 448 (0x7e, even).
    assert_eq!(e4m3_from_f32(432.0), 0x7e);
    assert_eq!(e4m3_from_f32(down(432.0)), 0x7d);
}

#[test]
fn zeros_keep_their_sign_and_subnormals_step_by_2_pow_minus_9() {
    assert_eq!(e4m3_from_f32(0.0), 0x00);
    assert_eq!(e4m3_from_f32(-0.0), 0x80);
    for k in 0..=8u8 {
        assert_eq!(e4m3_from_f32(f32::from(k) / 512.0), k);
        assert_eq!(e4m3_from_f32(-f32::from(k) / 512.0), 0x80 | k);
    }
    // Half the smallest subnormal is a tie to 0; anything above goes up.
    assert_eq!(e4m3_from_f32(1.0 / 1024.0), 0x00);
    assert_eq!(e4m3_from_f32(up(1.0 / 1024.0)), 0x01);
    assert_eq!(e4m3_from_f32(-1.0 / 1024.0), 0x80);
    assert_eq!(e4m3_from_f32(1e-30), 0x00);
    assert_eq!(e4m3_from_f32(-1e-45), 0x80);
    assert_eq!(e4m3_from_f32(f32::MIN_POSITIVE), 0x00);
}

#[test]
fn nan_of_any_sign_and_payload_encodes_to_0x7f() {
    for bits in [
        0x7fc0_0000u32,
        0xffc0_0000,
        0x7f80_0001,
        0xff80_0001,
        0x7fff_ffff,
    ] {
        assert_eq!(e4m3_from_f32(f32::from_bits(bits)), E4M3_NAN, "{bits:#x}");
    }
}

#[test]
fn a_strided_sweep_of_all_f32_bit_patterns_matches_the_search() {
    // 4.3 million patterns spread over every exponent, both signs, NaN and infinity.
    for bits in (0..=u32::MAX).step_by(997) {
        let x = f32::from_bits(bits);
        assert_eq!(e4m3_from_f32(x), nearest_by_search(x), "{x:e} ({bits:#x})");
    }
}

#[test]
fn bf16_rounds_to_nearest_even() {
    let one_ulp = 1.0 / 128.0; // bf16 ulp at 1
    let mid = 1.0 + one_ulp / 2.0;
    assert_eq!(bf16::from_f32(mid).to_f32(), 1.0);
    assert_eq!(bf16::from_f32(up(mid)).to_f32(), 1.0 + one_ulp);
    assert_eq!(
        bf16::from_f32(1.0 + 1.5 * one_ulp).to_f32(),
        1.0 + 2.0 * one_ulp
    );
    assert_eq!(bf16::from_f32(-mid).to_f32(), -1.0);
    assert!(bf16::from_f32(f32::NAN).is_nan());
}

proptest! {
    #[test]
    fn encoding_picks_the_nearest_representable_value(x in -500.0f32..500.0) {
        prop_assert_eq!(e4m3_from_f32(x), nearest_by_search(x));
    }

    #[test]
    fn small_magnitudes_pick_the_nearest_value(x in -0.05f32..0.05) {
        prop_assert_eq!(e4m3_from_f32(x), nearest_by_search(x));
    }

    #[test]
    fn any_bit_pattern_matches_the_search(bits in any::<u32>()) {
        let x = f32::from_bits(bits);
        prop_assert_eq!(e4m3_from_f32(x), nearest_by_search(x));
    }
}
