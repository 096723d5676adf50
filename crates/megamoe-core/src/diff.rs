//! Comparing outputs: the SPEC §3 distance, the largest error, and a stable hash of output bits.

use half::bf16;

/// diff(x, y) = Σ(x−y)² / Σ(x²+y²) in f64 (SPEC §3); two all-zero vectors are at distance 0.
/// Panics when the lengths differ.
pub fn diff(x: &[f64], y: &[f64]) -> f64 {
    assert_eq!(x.len(), y.len(), "diff of vectors of different lengths");
    let (num, den) = x.iter().zip(y).fold((0f64, 0f64), |(num, den), (&a, &b)| {
        (num + (a - b) * (a - b), den + a * a + b * b)
    });
    if den == 0.0 {
        0.0
    } else {
        num / den
    }
}

/// [`diff`] over every rank's bf16 output against every rank's f64 output.
pub fn diff_bf16_f64(x: &[Vec<bf16>], y: &[Vec<f64>]) -> f64 {
    let x: Vec<f64> = x.iter().flatten().map(|v| f64::from(v.to_f32())).collect();
    let y: Vec<f64> = y.iter().flatten().copied().collect();
    diff(&x, &y)
}

/// [`diff`] of two bf16 outputs (every rank, rank order).
pub fn diff_bf16(x: &[Vec<bf16>], y: &[Vec<bf16>]) -> f64 {
    let widen = |v: &[Vec<bf16>]| -> Vec<f64> {
        v.iter().flatten().map(|v| f64::from(v.to_f32())).collect()
    };
    diff(&widen(x), &widen(y))
}

/// The largest absolute error of `x` against the reference `y` (every rank, rank order), and
/// that error relative to the reference's largest magnitude (0 when `y` is all zero): the
/// worst element, beside [`diff`]'s average. A NaN anywhere makes both NaN.
pub fn max_error_bf16(x: &[Vec<bf16>], y: &[Vec<bf16>]) -> (f64, f64) {
    let widen = |v: &bf16| f64::from(v.to_f32());
    let (mut abs, mut scale) = (0f64, 0f64);
    for (a, b) in x.iter().flatten().zip(y.iter().flatten()) {
        let e = (widen(a) - widen(b)).abs();
        // f64::max would drop a NaN.
        abs = if e.is_nan() || abs.is_nan() {
            f64::NAN
        } else {
            abs.max(e)
        };
        scale = scale.max(widen(b).abs());
    }
    let rel = if scale == 0.0 { abs * 0.0 } else { abs / scale };
    (abs, rel)
}

/// 64-bit FNV-1a over the bf16 bits of every rank's output in rank order, each value as two
/// bytes, little-endian. Rank boundaries are not hashed: the same global output split over
/// any R has the same hash.
pub fn output_hash(outputs: &[Vec<bf16>]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    outputs
        .iter()
        .flatten()
        .flat_map(|v| v.to_bits().to_le_bytes())
        .fold(OFFSET, |h, byte| (h ^ u64::from(byte)).wrapping_mul(PRIME))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_is_zero_for_equal_and_for_all_zero_vectors() {
        assert_eq!(diff(&[0.0; 4], &[0.0; 4]), 0.0);
        assert_eq!(diff(&[1.0, -2.0], &[1.0, -2.0]), 0.0);
        assert_eq!(diff(&[1.0, 0.0], &[0.0, 1.0]), 1.0);
        assert_eq!(diff(&[3.0], &[1.0]), 4.0 / 10.0);
    }

    #[test]
    fn max_error_is_the_worst_element_and_relative_to_the_largest_reference() {
        let v = |xs: &[f32]| vec![xs.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>()];
        assert_eq!(max_error_bf16(&v(&[1.0, 2.0]), &v(&[1.0, 2.0])), (0.0, 0.0));
        assert_eq!(
            max_error_bf16(&v(&[1.5, -4.0, 0.0]), &v(&[1.0, -3.0, 8.0])),
            (8.0, 1.0)
        );
        assert_eq!(max_error_bf16(&v(&[0.5, 2.0]), &v(&[1.0, 4.0])), (2.0, 0.5));
        assert_eq!(max_error_bf16(&v(&[0.0]), &v(&[0.0])), (0.0, 0.0));
        let (abs, rel) = max_error_bf16(&v(&[f32::NAN, 1.0]), &v(&[1.0, 1.0]));
        assert!(abs.is_nan() && rel.is_nan());
    }

    #[test]
    fn output_hash_is_fnv1a_of_the_little_endian_bits() {
        assert_eq!(output_hash(&[]), 0xcbf2_9ce4_8422_2325);
        // FNV-1a of the bytes "a" "b" (0x61, 0x62) is a published test vector.
        let v = bf16::from_bits(0x6261);
        assert_eq!(output_hash(&[vec![v]]), 0x089c_4407_b545_986a);
        assert_eq!(
            output_hash(&[vec![v], vec![]]),
            output_hash(&[vec![], vec![v]])
        );
    }
}
