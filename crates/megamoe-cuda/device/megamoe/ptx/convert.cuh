// Number conversions: bf16 to f32 (exact), f32 pairs to bf16 and to e4m3 (round to nearest even,
// saturating to +-448, SPEC §3).
#pragma once
#include <megamoe/common.cuh>

namespace megamoe::ptx {

__device__ __forceinline__ float bf16_lo(u32 pair) { return __uint_as_float(pair << 16); }
__device__ __forceinline__ float bf16_hi(u32 pair) { return __uint_as_float(pair & 0xffff0000u); }

// Two floats to a bf16 pair, round to nearest even: `lo` lands in the low half.
__device__ __forceinline__ u32 bf16x2(float lo, float hi) {
    u32 out;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(out) : "f"(hi), "f"(lo));
    return out;
}

// Two floats to two e4m3 bytes: `lo` lands in the low byte.
__device__ __forceinline__ u16 e4m3x2(float lo, float hi) {
    u16 out;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(out) : "f"(hi), "f"(lo));
    return out;
}

}  // namespace megamoe::ptx
