// bf16 [rows, cols] -> e4m3 [rows, cols] + f32 scales [rows, cols / 128], per token and per 128
// contiguous columns (SPEC §3): sf = max(amax, 1e-4) / 448, q = e4m3_rn_satfinite(v * (1 / sf)).
//
// A half-warp owns one 128-column block per step: 16 lanes x 8 bf16 (one 16-byte load each), so a
// warp reads 512 contiguous bytes. Each half-warp takes kBlocks consecutive blocks and issues all
// their loads before the first use. The loop strides by the whole grid, so the host may launch
// fewer blocks than the work (a persistent grid); its bounds are uniform per warp so that the
// shuffles always see all 32 lanes.
#pragma once
#include <megamoe/impls/params.cuh>
#include <megamoe/common.cuh>
#include <megamoe/ptx/convert.cuh>
#include <megamoe/ptx/memory.cuh>

namespace megamoe::impls {

template <u32 kBlocks>
__device__ __forceinline__ void quant_e4m3(const QuantParams& p) {
    constexpr u32 kPerWarp = 2 * kBlocks;
    const u64 blocks = static_cast<u64>(p.rows) * (p.cols / 128);
    const u64 warp = (static_cast<u64>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    const u64 warps = static_cast<u64>(gridDim.x) * blockDim.x / 32;
    const u32 half = (threadIdx.x >> 4) & 1u;
    const u32 sub = threadIdx.x & 15u;
    const auto* x = reinterpret_cast<const unsigned char*>(p.x);

    for (u64 warp_first = warp * kPerWarp; warp_first < blocks; warp_first += warps * kPerWarp) {
        const u64 first = warp_first + half * kBlocks;
        uint4 v[kBlocks];
#pragma unroll
        for (u32 k = 0; k < kBlocks; ++k) {
            v[k] = first + k < blocks ? ptx::ld_stream_v4(x + (first + k) * 256 + sub * 16) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (u32 k = 0; k < kBlocks; ++k) {
            const u32 w[4] = {v[k].x, v[k].y, v[k].z, v[k].w};
            float f[8];
#pragma unroll
            for (u32 i = 0; i < 4; ++i) {
                f[2 * i] = ptx::bf16_lo(w[i]);
                f[2 * i + 1] = ptx::bf16_hi(w[i]);
            }
            float amax = 0.0f;
#pragma unroll
            for (u32 i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(f[i]));
            // Offsets below 16 keep the reduction inside each half-warp.
#pragma unroll
            for (u32 offset = 8; offset > 0; offset /= 2) {
                amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
            }
            const float sf = fmaxf(amax, 1e-4f) / 448.0f;
            const float inv = 1.0f / sf;
            u32 out[4];
#pragma unroll
            for (u32 i = 0; i < 4; ++i) out[i] = ptx::e4m3x2(f[2 * i] * inv, f[2 * i + 1] * inv);
            const u64 b = first + k;
            if (b < blocks) {
                auto* q = reinterpret_cast<unsigned char*>(p.q) + b * 128 + sub * 8;
                ptx::st_v2(q, make_uint2(out[0] | (out[1] << 16), out[2] | (out[3] << 16)));
                if (sub == 0) reinterpret_cast<float*>(p.sf)[b] = sf;
            }
        }
    }
}

}  // namespace megamoe::impls
