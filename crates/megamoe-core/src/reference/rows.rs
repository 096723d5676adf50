//! The inner loops both reference paths share: one 128-row strip of an expert's weights against
//! every activation row routed to the expert. Written so that LLVM vectorizes them (contiguous
//! slices, independent f64 lanes, four activation rows per pass over a weight row) and
//! dispatched to AVX2+FMA code (see `crate::simd`).

use crate::quant::WEIGHT_BLOCK;

/// Lanes of independent accumulators per activation row in [`dot4`].
const LANES: usize = 8;

/// Activation rows per pass over a weight row.
const ROWS: usize = 4;

/// Σ_k w[k]·x_r[k] for four activation rows at once. Each row's sum runs over 8 fused
/// multiply-add lanes (lane = k mod 8) reduced as ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), so
/// its bits depend only on `w` and that row, with or without `AVX2`. In the FP8 path every
/// product and partial sum is exact (see `fused`), so there the order does not matter at all.
#[inline(always)]
fn dot4<const AVX2: bool>(w: &[f32], x: [&[f64]; ROWS]) -> [f64; ROWS] {
    assert!(w.len() % LANES == 0, "rows are whole multiples of 8");
    assert!(x.iter().all(|x| x.len() == w.len()), "equal lengths");
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        // SAFETY: lengths were checked above; `AVX2` is only set in code compiled for AVX2+FMA.
        return unsafe { dot4_avx2(w, x) };
    }
    let [x0, x1, x2, x3] = x.map(|x| x.chunks_exact(LANES));
    let mut acc = [[0f64; LANES]; ROWS];
    for ((((w, x0), x1), x2), x3) in w.chunks_exact(LANES).zip(x0).zip(x1).zip(x2).zip(x3) {
        for lane in 0..LANES {
            let w = f64::from(w[lane]);
            acc[0][lane] = w.mul_add(x0[lane], acc[0][lane]);
            acc[1][lane] = w.mul_add(x1[lane], acc[1][lane]);
            acc[2][lane] = w.mul_add(x2[lane], acc[2][lane]);
            acc[3][lane] = w.mul_add(x3[lane], acc[3][lane]);
        }
    }
    acc.map(|a| ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])))
}

/// [`dot4`] with AVX2 intrinsics: lanes 0-3 and 4-7 in two registers per row. LLVM does not
/// vectorize the portable loop well.
///
/// # Safety
/// The CPU must have AVX2 and FMA, and every `x[r]` must be as long as `w`, a multiple of 8.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn dot4_avx2(w: &[f32], x: [&[f64]; ROWS]) -> [f64; ROWS] {
    use std::arch::x86_64::*;
    let mut lo = [_mm256_setzero_pd(); ROWS];
    let mut hi = [_mm256_setzero_pd(); ROWS];
    for k in (0..w.len()).step_by(LANES) {
        let w_lo = _mm256_cvtps_pd(_mm_loadu_ps(w.as_ptr().add(k)));
        let w_hi = _mm256_cvtps_pd(_mm_loadu_ps(w.as_ptr().add(k + 4)));
        for r in 0..ROWS {
            lo[r] = _mm256_fmadd_pd(w_lo, _mm256_loadu_pd(x[r].as_ptr().add(k)), lo[r]);
            hi[r] = _mm256_fmadd_pd(w_hi, _mm256_loadu_pd(x[r].as_ptr().add(k + 4)), hi[r]);
        }
    }
    let reduce = |r: usize| {
        let mut q = [0f64; 4];
        _mm256_storeu_pd(q.as_mut_ptr(), _mm256_add_pd(lo[r], hi[r]));
        (q[0] + q[2]) + (q[1] + q[3])
    };
    [reduce(0), reduce(1), reduce(2), reduce(3)]
}

/// Columns `columns` of four consecutive rows of `acts` (`[n, cols]`) starting at row
/// `first`; past the end the last row repeats (its results are discarded).
#[inline(always)]
fn four_rows(
    acts: &[f64],
    cols: usize,
    first: usize,
    columns: std::ops::Range<usize>,
) -> [&[f64]; ROWS] {
    let last = acts.len() / cols - 1;
    let row = |i: usize| &acts[(first + i).min(last) * cols..][columns.clone()];
    [row(0), row(1), row(2), row(3)]
}

/// Calls `emit(t, r, j, Σ_{k in group j} w[r, k]·acts[t, k])` for every activation row t,
/// weight row r of the strip `w` (`[rows, cols]`) and column group j of `group` columns, with
/// j in ascending order for each (t, r). Group-outer so that the activations' group (`n` rows
/// of `group` f64) stays in L1 while the weight rows stream past.
#[inline(always)]
fn strip_dots<const AVX2: bool>(
    w: &[f32],
    cols: usize,
    acts: &[f64],
    group: usize,
    mut emit: impl FnMut(usize, usize, usize, f64),
) {
    let n = acts.len() / cols;
    if n == 0 {
        return;
    }
    for j in 0..cols / group {
        for (r, row) in w.chunks_exact(cols).enumerate() {
            let segment = &row[j * group..][..group];
            for first in (0..n).step_by(ROWS) {
                let x = four_rows(acts, cols, first, j * group..(j + 1) * group);
                let sums = dot4::<AVX2>(segment, x);
                for (i, &sum) in sums.iter().enumerate().take(n - first) {
                    emit(first + i, r, j, sum);
                }
            }
        }
    }
}

/// Activation rows `[n, K]` (e4m3 values as f64) with their scales `[n, K/group]`.
pub(super) struct ScaledRows<'a> {
    pub values: &'a [f64],
    pub scales: &'a [f32],
    pub group: usize,
}

/// FP8: `out[t, first_row + r]` for every row r of the weight strip `w` (e4m3 values as f32,
/// `[128, K]`, block scales `w_scales` `[K/128]`) and every activation row t, `out` being
/// `[n, out_cols]` and zero on entry, in the operation order documented in `fused`.
pub(super) fn block_scaled_strip(
    w: &[f32],
    w_scales: &[f32],
    acts: &ScaledRows,
    first_row: usize,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::avx2_fma() {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn fast(w: &[f32], ws: &[f32], a: &ScaledRows, f: usize, o: &mut [f32]) {
            block_scaled_strip_body::<true>(w, ws, a, f, o)
        }
        // SAFETY: the CPU has the features `fast` is compiled for.
        return unsafe { fast(w, w_scales, acts, first_row, out) };
    }
    block_scaled_strip_body::<false>(w, w_scales, acts, first_row, out)
}

#[inline(always)]
fn block_scaled_strip_body<const AVX2: bool>(
    w: &[f32],
    w_scales: &[f32],
    acts: &ScaledRows,
    first_row: usize,
    out: &mut [f32],
) {
    let cols = w.len() / WEIGHT_BLOCK;
    let n = acts.values.len() / cols;
    let (out_cols, group) = (out.len() / n.max(1), acts.group);
    let groups = cols / group;
    strip_dots::<AVX2>(w, cols, acts.values, group, |t, r, j, sum| {
        let scale = acts.scales[t * groups + j] * w_scales[j * group / WEIGHT_BLOCK];
        let running = &mut out[t * out_cols + first_row + r];
        *running = (sum as f32).mul_add(scale, *running);
    });
}

/// Unquantized: `out[t, first_row + r] = Σ_j Σ_{k in 128-column block j} w[r, k]·acts[t, k]`
/// in f64 (blocks added in ascending order) for every row r of the f32 weight strip `w`
/// (`[rows, cols]`) and every row t of `acts` (`[n, cols]`), `out` being `[n, out_cols]` and
/// zero on entry.
pub(super) fn plain_strip(w: &[f32], acts: &[f64], cols: usize, first_row: usize, out: &mut [f64]) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::avx2_fma() {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn fast(w: &[f32], a: &[f64], c: usize, f: usize, o: &mut [f64]) {
            plain_strip_body::<true>(w, a, c, f, o)
        }
        // SAFETY: the CPU has the features `fast` is compiled for.
        return unsafe { fast(w, acts, cols, first_row, out) };
    }
    plain_strip_body::<false>(w, acts, cols, first_row, out)
}

#[inline(always)]
fn plain_strip_body<const AVX2: bool>(
    w: &[f32],
    acts: &[f64],
    cols: usize,
    first_row: usize,
    out: &mut [f64],
) {
    let out_cols = out.len() / (acts.len() / cols).max(1);
    strip_dots::<AVX2>(w, cols, acts, WEIGHT_BLOCK, |t, r, _, sum| {
        out[t * out_cols + first_row + r] += sum;
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numerics::INPUT_SCALE_FLOOR;
    use crate::numerics::{e4m3_round, e4m3_to_f32};
    use crate::preset::Preset;
    use crate::weights::{encode_strip, Matrix, WeightGen, WeightSource};

    /// The portable bodies give the same bits as the dispatched (AVX2 + FMA) kernels.
    #[test]
    fn portable_and_simd_strips_agree_bit_for_bit() {
        let gen = WeightGen::new(Preset::by_name("tiny").unwrap().shape, 3);
        let (n, cols) = (5, 256);
        let (mut w, mut w_scales) = (Vec::new(), Vec::new());
        encode_strip(&gen, 1, Matrix::W1, 128, e4m3_round, &mut w, &mut w_scales);
        // Every finite code of both signs (0x7f is NaN).
        let code = |i: usize| (i * 37 % 0x7f) as u8 | if i % 3 == 0 { 0x80 } else { 0 };
        let values: Vec<f64> = (0..n * cols)
            .map(|i| f64::from(e4m3_to_f32(code(i))))
            .collect();
        for group in [64, 128] {
            let scales: Vec<f32> = (0..n * cols / group)
                .map(|i| 1e-3 * (1 + i % 5) as f32)
                .collect();
            let acts = ScaledRows {
                values: &values,
                scales: &scales,
                group,
            };
            let (mut simd, mut portable) = (vec![0f32; n * 300], vec![0f32; n * 300]);
            block_scaled_strip(&w, &w_scales, &acts, 20, &mut simd);
            block_scaled_strip_body::<false>(&w, &w_scales, &acts, 20, &mut portable);
            assert!(simd.iter().all(|v| v.is_finite()) && simd.iter().any(|&v| v != 0.0));
            assert!(simd == portable, "group {group}");
        }
        let mut f32_strip = vec![0f32; 128 * cols];
        gen.fill_rows(1, Matrix::W1, 128, &mut f32_strip);
        let (mut simd, mut portable) = (vec![0f64; n * 128], vec![0f64; n * 128]);
        plain_strip(&f32_strip, &values, cols, 0, &mut simd);
        plain_strip_body::<false>(&f32_strip, &values, cols, 0, &mut portable);
        assert!(simd.iter().all(|v| v.is_finite()));
        assert!(simd == portable);
        // The values strip is the block quantizer's codes, decoded.
        let q = crate::quant::quantize_blocks(&f32_strip, 128, cols, INPUT_SCALE_FLOOR).unwrap();
        assert_eq!(q.scales, w_scales);
        assert!(q.codes.iter().zip(&w).all(|(&c, &v)| e4m3_to_f32(c) == v));
    }

    #[test]
    fn dot4_matches_a_plain_sum_per_row() {
        let w: Vec<f32> = (0..16).map(|i| i as f32).collect();
        let x: Vec<Vec<f64>> = (0..4)
            .map(|r| (0..16).map(|i| ((i + r) % 3) as f64).collect())
            .collect();
        let x = [&x[0][..], &x[1], &x[2], &x[3]];
        let sums = dot4::<false>(&w, x);
        for (r, sum) in sums.iter().enumerate() {
            let plain: f64 = w.iter().zip(x[r]).map(|(&a, b)| f64::from(a) * b).sum();
            assert_eq!(*sum, plain);
        }
        if crate::simd::avx2_fma() {
            // SAFETY: the CPU has the features; equal lengths, a multiple of 8.
            assert_eq!(unsafe { dot4_avx2(&w, x) }, sums);
        }
    }
}
