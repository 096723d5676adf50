//! The inner loops both reference paths share: one 128-row strip of an expert's weights against
//! every activation row routed to the expert, column group by column group, in tiles of 2
//! weight rows × 4 activation rows with 4 independent f64 lanes per sum. Dispatched to AVX2+FMA
//! code (see `crate::simd`); the tile itself uses AVX2 intrinsics there.

use crate::quant::WEIGHT_BLOCK;

/// Independent accumulator lanes per sum in [`dot2x4`].
const LANES: usize = 4;

/// Activation rows per pass over a pair of weight rows.
const ROWS: usize = 4;

/// `Σ_k w_i[k]·x_r[k]` for two weight rows i and four activation rows r at once. Each sum runs
/// over 4 fused multiply-add lanes (lane = k mod 4) reduced as (l0+l2)+(l1+l3), so its bits
/// depend only on its two rows, with or without `AVX2`. In the FP8 path every product and
/// partial sum is exact (see `fused`), so there the order does not matter at all.
#[inline(always)]
fn dot2x4<const AVX2: bool>(w: [&[f32]; 2], x: [&[f64]; ROWS]) -> [[f64; ROWS]; 2] {
    let len = w[0].len();
    assert!(len % LANES == 0, "rows are whole multiples of 4");
    assert!(
        w[1].len() == len && x.iter().all(|x| x.len() == len),
        "equal lengths"
    );
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        // SAFETY: lengths were checked above; `AVX2` is only set in code compiled for AVX2+FMA.
        return unsafe { dot2x4_avx2(w, x) };
    }
    let mut acc = [[[0f64; LANES]; ROWS]; 2];
    for k in (0..len).step_by(LANES) {
        for (acc, w) in acc.iter_mut().zip(w) {
            for (acc, x) in acc.iter_mut().zip(x) {
                for lane in 0..LANES {
                    acc[lane] = f64::from(w[k + lane]).mul_add(x[k + lane], acc[lane]);
                }
            }
        }
    }
    acc.map(|acc| acc.map(|a| (a[0] + a[2]) + (a[1] + a[3])))
}

/// [`dot2x4`] with AVX2 intrinsics, one register of 4 lanes per sum. LLVM does not vectorize
/// the portable loop well.
///
/// # Safety
/// The CPU must have AVX2 and FMA, and all six slices must have the same length, a multiple
/// of 4.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn dot2x4_avx2(w: [&[f32]; 2], x: [&[f64]; ROWS]) -> [[f64; ROWS]; 2] {
    use std::arch::x86_64::*;
    // SAFETY: the caller guarantees AVX2 and FMA, and slices of one length, a multiple of 4:
    // every load and store below stays inside its slice or array.
    unsafe {
        let mut acc = [[_mm256_setzero_pd(); ROWS]; 2];
        for k in (0..w[0].len()).step_by(LANES) {
            let w0 = _mm256_cvtps_pd(_mm_loadu_ps(w[0].as_ptr().add(k)));
            let w1 = _mm256_cvtps_pd(_mm_loadu_ps(w[1].as_ptr().add(k)));
            for r in 0..ROWS {
                let xr = _mm256_loadu_pd(x[r].as_ptr().add(k));
                acc[0][r] = _mm256_fmadd_pd(w0, xr, acc[0][r]);
                acc[1][r] = _mm256_fmadd_pd(w1, xr, acc[1][r]);
            }
        }
        let reduce = |v: __m256d| {
            let mut q = [0f64; 4];
            _mm256_storeu_pd(q.as_mut_ptr(), v);
            (q[0] + q[2]) + (q[1] + q[3])
        };
        let row = |a: [__m256d; ROWS]| [reduce(a[0]), reduce(a[1]), reduce(a[2]), reduce(a[3])];
        [row(acc[0]), row(acc[1])]
    }
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
/// weight row r of the strip `w` (`[rows, cols]`, an even number of rows) and column group j of `group` columns, with
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
        let columns = j * group..(j + 1) * group;
        for (pair, rows) in w.chunks_exact(2 * cols).enumerate() {
            let (w0, w1) = rows.split_at(cols);
            let segments = [&w0[columns.clone()], &w1[columns.clone()]];
            for first in (0..n).step_by(ROWS) {
                let sums = dot2x4::<AVX2>(segments, four_rows(acts, cols, first, columns.clone()));
                for (i, sums) in sums.iter().enumerate() {
                    for (t, &sum) in sums.iter().enumerate().take(n - first) {
                        emit(first + t, 2 * pair + i, j, sum);
                    }
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
    use crate::weights::{encode_f32_strip, Matrix, WeightGen, WeightSource};

    /// The portable bodies give the same bits as the dispatched (AVX2 + FMA) kernels.
    #[test]
    fn portable_and_simd_strips_agree_bit_for_bit() {
        let gen = WeightGen::new(Preset::by_name("tiny").unwrap().shape, 3);
        let (n, cols) = (5, 256);
        let mut f32_strip = vec![0f32; 128 * cols];
        gen.fill_rows(1, Matrix::W1, 128, &mut f32_strip);
        let (mut w, mut w_scales) = (Vec::new(), Vec::new());
        encode_f32_strip(&f32_strip, e4m3_round, &mut w, &mut w_scales);
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
    fn dot2x4_matches_a_plain_sum_per_pair_of_rows() {
        let w: Vec<Vec<f32>> = (0..2)
            .map(|i| (0..16).map(|k| (k * (i + 1)) as f32).collect())
            .collect();
        let x: Vec<Vec<f64>> = (0..4)
            .map(|r| (0..16).map(|k| ((k + r) % 3) as f64).collect())
            .collect();
        let (w, x) = ([&w[0][..], &w[1]], [&x[0][..], &x[1], &x[2], &x[3]]);
        let sums = dot2x4::<false>(w, x);
        for (i, sums) in sums.iter().enumerate() {
            for (r, sum) in sums.iter().enumerate() {
                let plain: f64 = w[i].iter().zip(x[r]).map(|(&a, b)| f64::from(a) * b).sum();
                assert_eq!(*sum, plain);
            }
        }
        if crate::simd::avx2_fma() {
            // SAFETY: the CPU has the features; equal lengths, a multiple of 4.
            assert_eq!(unsafe { dot2x4_avx2(w, x) }, sums);
        }
    }
}
