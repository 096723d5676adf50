// Epilogues: what happens to a warpgroup's finished 64 x 128 f32 tile. A policy receives the
// accumulators in the wgmma m64nNk32 register layout (thread = warp w, lane l; register i holds
// row 16w + l/4 + 8*((i/2)%2), column 8*(i/4) + 2*(l%4) + i%2) and owns everything after the
// mainloop; the L1 SwiGLU + routing weight + re-quantisation epilogue is another policy of the
// same shape.
#pragma once
#include "ptx/types.cuh"

__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// Row-major output of `Out` (u16 holds bf16 bits, or float); rows >= rows_valid are left alone.
template <typename Out>
struct StoreRows {
    template <int kAccum>
    __device__ __forceinline__ static void store(void* out, u32 ld, u32 row0, u32 col0,
                                                 u32 rows_valid, const float (&acc)[kAccum]) {
        const u32 lane = threadIdx.x % 32;
        const u32 warp = (threadIdx.x / 32) % 4;
        const u32 r = warp * 16 + lane / 4;
        const u32 c = 2 * (lane % 4);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const u32 row = r + 8 * half;
            if (row >= rows_valid) continue;
            Out* dst = static_cast<Out*>(out) + static_cast<u64>(row0 + row) * ld + col0 + c;
#pragma unroll
            for (int j = 0; j < kAccum / 4; ++j) {
                const float v0 = acc[4 * j + 2 * half];
                const float v1 = acc[4 * j + 2 * half + 1];
                if constexpr (sizeof(Out) == 2) {
                    *reinterpret_cast<u32*>(dst + 8 * j) = pack_bf16x2(v0, v1);
                } else {
                    *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(v0, v1);
                }
            }
        }
    }
};
