//! CPU reference of the grouped GEMM (SPEC §3 steps 1 and 4) and the accuracy measure.
//!
//! For every K group of G columns the products of e4m3 values are summed exactly (in f64 each
//! product is a multiple of 2^-18 and a 128-term sum stays below 2^25, so any order is exact),
//! rounded to f32 once, and added into the running f32 sum as `fma(blocksum, sa·sb, sum)`.

use megamoe_core::numerics::e4m3_to_f32;

fn e4m3_table() -> [f64; 256] {
    let mut t = [0f64; 256];
    for (i, v) in t.iter_mut().enumerate() {
        *v = e4m3_to_f32(i as u8) as f64;
    }
    t
}

/// The operands of one grouped GEMM, in the layouts the kernel reads.
pub struct GemmOperands<'a> {
    pub n: usize,
    pub k: usize,
    pub group_size: usize,
    /// e4m3 activations, `rows × k` in the layout's 2-D row view.
    pub a: &'a [u8],
    /// Activation scales, K-group-major: `scale_a[g * scale_a_ld + r]` for view row r.
    pub scale_a: &'a [f32],
    pub scale_a_ld: usize,
    /// e4m3 weights `[E, n, k]`.
    pub b: &'a [u8],
    /// Weight scales `[E, n/128, k/128]`.
    pub scale_b: &'a [f32],
}

/// f32 output row `row` (view row) of expert `expert`; `scale_row` locates its scales.
pub fn reference_row(op: &GemmOperands, expert: usize, row: usize, scale_row: usize) -> Vec<f32> {
    let table = e4m3_table();
    let (n, k, g) = (op.n, op.k, op.group_size);
    let a = &op.a[row * k..(row + 1) * k];
    let a: Vec<f64> = a.iter().map(|&x| table[x as usize]).collect();
    let kb = k / 128;
    (0..n)
        .map(|col| {
            let w = &op.b[(expert * n + col) * k..(expert * n + col + 1) * k];
            let mut sum = 0f32;
            for group in 0..k / g {
                let exact: f64 = (group * g..(group + 1) * g)
                    .map(|i| a[i] * table[w[i] as usize])
                    .sum();
                let sa = op.scale_a[group * op.scale_a_ld + scale_row];
                let sb = op.scale_b[(expert * (n / 128) + col / 128) * kb + group * g / 128];
                sum = (exact as f32).mul_add(sa * sb, sum);
            }
            sum
        })
        .collect()
}

/// diff(x, y) = Σ(x−y)² / Σ(x²+y²) in f64 (0 when both are all zero).
pub fn diff(x: &[f32], y: &[f32]) -> f64 {
    assert_eq!(x.len(), y.len());
    let (mut num, mut den) = (0f64, 0f64);
    for (&a, &b) in x.iter().zip(y) {
        let (a, b) = (a as f64, b as f64);
        num += (a - b) * (a - b);
        den += a * a + b * b;
    }
    if den == 0.0 {
        if num == 0.0 {
            0.0
        } else {
            f64::INFINITY
        }
    } else {
        num / den
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_promotes_each_group_with_its_scales() {
        // One expert, n = 128, k = 128, G = 64: a = 1.0 everywhere, w = 2.0 everywhere.
        let (n, k) = (128, 128);
        let a = vec![0x38u8; k];
        let b = vec![0x40u8; n * k];
        let scale_a = [0.5f32, 0.25];
        let scale_b = [3.0f32];
        let op = GemmOperands {
            n,
            k,
            group_size: 64,
            a: &a,
            scale_a: &scale_a,
            scale_a_ld: 1,
            b: &b,
            scale_b: &scale_b,
        };
        let row = reference_row(&op, 0, 0, 0);
        // 64·2·0.5·3 + 64·2·0.25·3 = 192 + 96
        assert!(row.iter().all(|&v| v == 288.0));
    }

    #[test]
    fn diff_is_zero_for_equal_and_positive_otherwise() {
        assert_eq!(diff(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert!(diff(&[1.0, 2.0], &[1.0, 2.1]) > 1e-4);
        assert_eq!(diff(&[0.0], &[0.0]), 0.0);
    }
}
