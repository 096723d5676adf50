//! Runtime dispatch of the hot loops (weight generation, quantization, the reference's inner
//! products) to code compiled for AVX2 and FMA, so that they vectorize without raising the
//! crate's baseline CPU. Nothing uses fast-math and Rust never contracts `a * b + c` into an
//! FMA, so both versions give the same bits; only the speed differs.
//!
//! Pattern at each site: the body is an `#[inline(always)]` function; a
//! `#[target_feature(enable = "avx2,fma")]` copy of it runs when [`avx2_fma`] says so.

/// Whether the CPU runs AVX2 and FMA code.
#[inline]
pub(crate) fn avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}
