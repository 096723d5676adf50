//! The inner loops both reference paths share: one 128-row strip of an expert's weights against
//! every activation row routed to the expert. Written so that LLVM vectorizes them (contiguous
//! slices, independent f64 lanes, four activation rows per pass over a weight row) and
//! dispatched to AVX2+FMA code (see `crate::simd`).

use crate::numerics::e4m3_to_f32;
use crate::quant::{QuantBlocks, WEIGHT_BLOCK};

/// Lanes of independent accumulators per activation row in [`dot4`].
const LANES: usize = 8;

/// Activation rows per pass over a weight row.
const ROWS: usize = 4;

/// Σ_k w[k]·x_r[k] for four activation rows at once. Each row's sum runs over 8 fused
/// multiply-add lanes (lane = k mod 8) reduced as ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), so
/// its bits depend only on `w` and that row, with or without `AVX2`. In the FP8 path every
/// product and partial sum is exact (see `fused`), so there the order does not matter at all.
#[inline(always)]
fn dot4<const AVX2: bool>(w: &[f64], x: [&[f64]; ROWS]) -> [f64; ROWS] {
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
            acc[0][lane] = w[lane].mul_add(x0[lane], acc[0][lane]);
            acc[1][lane] = w[lane].mul_add(x1[lane], acc[1][lane]);
            acc[2][lane] = w[lane].mul_add(x2[lane], acc[2][lane]);
            acc[3][lane] = w[lane].mul_add(x3[lane], acc[3][lane]);
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
unsafe fn dot4_avx2(w: &[f64], x: [&[f64]; ROWS]) -> [f64; ROWS] {
    use std::arch::x86_64::*;
    let mut lo = [_mm256_setzero_pd(); ROWS];
    let mut hi = [_mm256_setzero_pd(); ROWS];
    for k in (0..w.len()).step_by(LANES) {
        let w_lo = _mm256_loadu_pd(w.as_ptr().add(k));
        let w_hi = _mm256_loadu_pd(w.as_ptr().add(k + 4));
        for r in 0..ROWS {
            lo[r] = _mm256_fmadd_pd(w_lo, _mm256_loadu_pd(x[r].as_ptr().add(k)), lo[r]);
            hi[r] = _mm256_fmadd_pd(w_hi, _mm256_loadu_pd(x[r].as_ptr().add(k + 4)), hi[r]);
        }
    }
    std::array::from_fn(|r| {
        let mut q = [0f64; 4];
        _mm256_storeu_pd(q.as_mut_ptr(), _mm256_add_pd(lo[r], hi[r]));
        (q[0] + q[2]) + (q[1] + q[3])
    })
}

/// Four consecutive rows of `acts` (`[n, cols]`) starting at row `first`; past the end the
/// last row repeats (its results are discarded).
#[inline(always)]
fn four_rows(acts: &[f64], cols: usize, first: usize) -> [&[f64]; ROWS] {
    let n = acts.len() / cols;
    std::array::from_fn(|i| &acts[(first + i).min(n - 1) * cols..][..cols])
}

/// FP8: `out[t, first_row + r]` for every row r of the quantized weight strip `w`
/// (`[128, K]`, scales `[1, K/128]`) and every activation row t of `acts` (e4m3 values as f64,
/// `[n, K]`, scales `[n, K/group]`), `out` being `[n, out_cols]`, in the operation order
/// documented in `fused`.
pub(super) fn block_scaled_strip(
    w: &QuantBlocks,
    acts: &[f64],
    act_scales: &[f32],
    group: usize,
    first_row: usize,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::avx2_fma() {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn fast(w: &QuantBlocks, a: &[f64], s: &[f32], g: usize, f: usize, o: &mut [f32]) {
            block_scaled_strip_body::<true>(w, a, s, g, f, o)
        }
        // SAFETY: the CPU has the features `fast` is compiled for.
        return unsafe { fast(w, acts, act_scales, group, first_row, out) };
    }
    block_scaled_strip_body::<false>(w, acts, act_scales, group, first_row, out)
}

#[inline(always)]
fn block_scaled_strip_body<const AVX2: bool>(
    w: &QuantBlocks,
    acts: &[f64],
    act_scales: &[f32],
    group: usize,
    first_row: usize,
    out: &mut [f32],
) {
    let cols = w.cols;
    let n = acts.len() / cols;
    if n == 0 {
        return;
    }
    let out_cols = out.len() / n;
    let groups = cols / group;
    let mut row = vec![0f64; cols];
    for (r, codes) in w.codes.chunks_exact(cols).enumerate() {
        for (d, &c) in row.iter_mut().zip(codes) {
            *d = f64::from(e4m3_to_f32(c));
        }
        for first in (0..n).step_by(ROWS) {
            let x = four_rows(acts, cols, first);
            let mut running = [0f32; ROWS];
            for j in 0..groups {
                let range = j * group..(j + 1) * group;
                let sums = dot4::<AVX2>(&row[range.clone()], x.map(|x| &x[range.clone()]));
                let w_scale = w.scales[j * group / WEIGHT_BLOCK];
                for (i, (running, sum)) in running.iter_mut().zip(sums).enumerate() {
                    let t = (first + i).min(n - 1);
                    let scale = act_scales[t * groups + j] * w_scale;
                    *running = (sum as f32).mul_add(scale, *running);
                }
            }
            for (i, running) in running.iter().enumerate().take(n - first) {
                out[(first + i) * out_cols + first_row + r] = *running;
            }
        }
    }
}

/// Unquantized: `out[t, first_row + r] = Σ_k w[r, k]·acts[t, k]` in f64 for every row r of
/// the f32 weight strip `w` (`[rows, cols]`) and every row t of `acts` (`[n, cols]`), `out`
/// being `[n, out_cols]`.
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
    let n = acts.len() / cols;
    if n == 0 {
        return;
    }
    let out_cols = out.len() / n;
    let mut row = vec![0f64; cols];
    for (r, values) in w.chunks_exact(cols).enumerate() {
        for (d, &v) in row.iter_mut().zip(values) {
            *d = f64::from(v);
        }
        for first in (0..n).step_by(ROWS) {
            let sums = dot4::<AVX2>(&row, four_rows(acts, cols, first));
            for (i, sum) in sums.iter().enumerate().take(n - first) {
                out[(first + i) * out_cols + first_row + r] = *sum;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot4_matches_a_plain_sum_per_row() {
        let w: Vec<f64> = (0..16).map(|i| i as f64).collect();
        let x: Vec<Vec<f64>> = (0..4)
            .map(|r| (0..16).map(|i| ((i + r) % 3) as f64).collect())
            .collect();
        let x = [&x[0][..], &x[1], &x[2], &x[3]];
        let sums = dot4::<false>(&w, x);
        for (r, sum) in sums.iter().enumerate() {
            let plain: f64 = w.iter().zip(x[r]).map(|(a, b)| a * b).sum();
            assert_eq!(*sum, plain);
        }
        if crate::simd::avx2_fma() {
            // SAFETY: the CPU has the features; equal lengths, a multiple of 8.
            assert_eq!(unsafe { dot4_avx2(&w, x) }, sums);
        }
    }
}
