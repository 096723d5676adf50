// The L1 epilogue of the MoE layer (SPEC §3 steps 2-3): SwiGLU with the optional clamp, the
// routing weight of the row, then re-quantization to e4m3 per G columns (floor 1e-10), written
// as the L2 GEMM's activations: rows like the L1 input, I columns, scales group-major.
//
// It needs gate and up of the same intermediate column in the same thread: the weights are
// loaded with W1's 128-row blocks interleaved (gate block j, up block j, ...; src/weights.rs),
// and the L1 GEMM runs 128 x 256 tiles, so wave 0 of a warpgroup's slice holds gate columns
// 128j..128j+127 and wave 1 the up columns of the same intermediate columns, register for
// register (layout in megamoe_gemm/epilogue/store.cuh). A row's 128 columns of a wave are held
// by the four lanes of a quad, so a G group's amax is two shuffles away.
//
// A quad holds 8 bytes of each e4m3 row per 8-column group: stored from the registers, every
// warp store touches 8 rows. The rows go through the warpgroup's staging tile in shared memory
// instead (128 bytes a row, 16-byte chunks swizzled by the row, conflict-free), and leave as
// 16-byte stores, four rows per warp store: a quarter of the store instructions and an eighth of
// the cache lines per instruction. A warp stages and copies out its own 16 rows (and the fused
// kernel's L2 epilogue, ScatterRows, on the same staging tile, likewise): no warpgroup barrier.
#pragma once
#include <megamoe/common.cuh>
#include <megamoe/ptx/convert.cuh>
#include <megamoe/ptx/memory.cuh>
#include <megamoe_layer/epilogue/swiglu_quant_params.cuh>

namespace megamoe::layer {

// silu(g) = g / (1 + e^-g) with the hardware exponential and reciprocal, MUFU.EX2 and MUFU.RCP
// (a few ulp of f32 from the reference's correctly rounded ones, far below the e4m3 step that
// follows; the IEEE expf and division made the L1 epilogue 1.5x slower at 192 rows per expert,
// docs/PERF.md). The bits are those of __fdividef(g, 1 + __expf(-g)), whose exponential spends
// three more instructions per value on results below 2^-126 (g > 87), where it keeps them
// denormal: the flushed 0 adds to 1 all the same.
__device__ __forceinline__ float silu(float g) {
    float e, r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(-g * 1.4426950408889634f));
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.0f + e));
    return g * r;
}

// The epilogue: its parameters (epilogue/swiglu_quant_params.cuh) and what it does with them.
struct SwigluQuant : SwigluQuantParams {
    // Before the slice's K loop (the fused kernel): brings its rows' routing weights into L1,
    // so that the epilogue's loads of them do not wait on L2 (each warp its 16 rows).
    __device__ __forceinline__ void prefetch(u32 row0) const {
        if (threadIdx.x % 32 == 0)
            ptx::prefetch_l1(reinterpret_cast<const float*>(weights) + row0 + (threadIdx.x / 32) % 4 * 16);
    }

    // The group count and the clamp are uniform over a launch: each combination gets its own
    // unrolled body, where a runtime test left every clamp and group check in the instruction
    // stream, predicated off or not (a third of the body's instructions without a clamp).
    template <int kWaves, int kAccum>
    __device__ __forceinline__ void store(u8* staging, u32 /*wg*/, u32 row0, u32 col0, u32 /*rows_valid*/,
                                          const float (&acc)[kWaves][kAccum]) const {
        if (group == 64) {
            if (has_clamp)
                store_rows<2, true>(staging, row0, col0, acc);
            else
                store_rows<2, false>(staging, row0, col0, acc);
        } else {
            if (has_clamp)
                store_rows<1, true>(staging, row0, col0, acc);
            else
                store_rows<1, false>(staging, row0, col0, acc);
        }
    }

    // kGroups: the G groups in a wave's 128 columns (1 for G = 128, 2 for G = 64).
    template <int kGroups, bool kClamp, int kWaves, int kAccum>
    __device__ __forceinline__ void store_rows(u8* staging, u32 row0, u32 col0,
                                               const float (&acc)[kWaves][kAccum]) const {
        static_assert(kWaves == 2 && kAccum == 64, "128 x 256 tiles: a gate wave and an up wave");
        const u32 lane = threadIdx.x % 32;
        const u32 warp = (threadIdx.x / 32) % 4;
        const u32 r = warp * 16 + lane / 4;
        // Intermediate columns of this slice: the tile's 256 interleaved columns hold 128.
        const u32 c0 = col0 / 2;
        const float* w = reinterpret_cast<const float*>(weights);
        u8* q = reinterpret_cast<u8*>(out);
        float* sf_out = reinterpret_cast<float*>(out_scales);
        constexpr int kJ = kAccum / 4;  // 8-column groups of the wave
        __syncwarp();                   // the warp's copies out of the staging tile before this one are done
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const u32 row = row0 + r + 8 * half;
            const float weight = w[row];
            float a[kJ][2];
#pragma unroll
            for (int j = 0; j < kJ; ++j) {
#pragma unroll
                for (int b = 0; b < 2; ++b) {
                    float g = acc[0][4 * j + 2 * half + b];
                    float u = acc[1][4 * j + 2 * half + b];
                    if constexpr (kClamp) {
                        g = fminf(g, clamp);
                        u = fminf(fmaxf(u, -clamp), clamp);
                    }
                    a[j][b] = silu(g) * u * weight;
                }
            }
            // One or two G groups of the wave's 128 columns: j < kJ / 2 or >= kJ / 2 for G = 64.
            constexpr int per_group = kJ / kGroups;
#pragma unroll
            for (int gi = 0; gi < kGroups; ++gi) {
                float amax = 0.0f;
#pragma unroll
                for (int j = 0; j < kJ; ++j) {
                    if (j / per_group != gi) continue;
                    amax = fmaxf(amax, fmaxf(fabsf(a[j][0]), fabsf(a[j][1])));
                }
                amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
                amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
                const float sf = fmaxf(amax, 1e-10f) / 448.0f;
                const float inv = 1.0f / sf;
                const u32 sr = r + 8 * half;  // the row in the staging tile
#pragma unroll
                for (int j = 0; j < kJ; ++j) {
                    if (j / per_group != gi) continue;
                    const u32 chunk = (j / 2) ^ (sr % 8);
                    *reinterpret_cast<u16*>(staging + sr * 128 + chunk * 16 + (j % 2) * 8 + 2 * (lane % 4)) =
                        ptx::e4m3x2(a[j][0] * inv, a[j][1] * inv);
                }
                if (lane % 4 == 0) {
                    sf_out[static_cast<u64>(c0 / (128 / kGroups) + gi) * rows_ld + row] = sf;
                }
            }
        }
        __syncwarp();
        // The warp's 16 rows: 8 lanes a row, one 16-byte chunk each.
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 sr = warp * 16 + 4 * i + lane / 8;
            const u32 chunk = lane % 8;
            const uint4 v = *reinterpret_cast<const uint4*>(staging + sr * 128 + (chunk ^ (sr % 8)) * 16);
            ptx::st_v4(q + static_cast<u64>(row0 + sr) * inter + c0 + chunk * 16, v);
        }
    }

    __device__ __forceinline__ void finish() const {}
};

}  // namespace megamoe::layer
