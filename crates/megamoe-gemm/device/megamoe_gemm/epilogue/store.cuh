// Epilogues: what happens to a warpgroup's finished slice of a tile, 64 rows by kWaves waves of
// kWaveN columns (wave w starts at column col0 + w * kWaveN). An epilogue is an object carrying
// what it needs (its own params struct, or a reference to it in the kernel's params) with
// store(staging, wg, row0, col0, rows_valid, acc) and finish(); it receives the accumulators in
// the wgmma m64nNk32 register layout (thread = warp w, lane l; register i of a wave holds row
// 16w + l/4 + 8*((i/2)%2), column 8*(i/4) + 2*(l%4) + i%2) and owns everything after the
// mainloop. The layer's L1 SwiGLU + routing weight + re-quantization epilogue is another object
// of the same shape (megamoe-layer).
#pragma once
#include <megamoe/common.cuh>
#include <megamoe/ptx/convert.cuh>
#include <megamoe/ptx/memory.cuh>
#include <megamoe/ptx/tma.cuh>
#include <megamoe_gemm/impls/grouped_gemm_params.cuh>
#include <megamoe_gemm/pipeline/barriers.cuh>

namespace megamoe::gemm {

// Row-major output of `Out` (u16 holds bf16 bits, or float) written straight from registers;
// rows >= rows_valid are left alone (the masked layout's rows past an expert's count).
template <typename Out>
struct StoreRows {
    // The kernel's params (param space), read where they are used, not held in registers.
    const EpilogueParams& p;

    template <int kWaves, int kAccum>
    __device__ __forceinline__ void store(u8* /*staging*/, u32 /*wg*/, u32 row0, u32 col0, u32 rows_valid,
                                          const float (&acc)[kWaves][kAccum]) const {
#pragma unroll
        for (int w = 0; w < kWaves; ++w) store_wave(row0, col0 + w * 2 * kAccum, rows_valid, acc[w]);
    }

    template <int kAccum>
    __device__ __forceinline__ void store_wave(u32 row0, u32 col0, u32 rows_valid, const float (&acc)[kAccum]) const {
        void* out = reinterpret_cast<void*>(p.out);
        const u32 ld = p.n;
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
                // A partial last n-tile (192-column tiles) ends at N.
                if (col0 + 8 * j >= ld) break;
                const float v0 = acc[4 * j + 2 * half];
                const float v1 = acc[4 * j + 2 * half + 1];
                if constexpr (sizeof(Out) == 2) {
                    *reinterpret_cast<u32*>(dst + 8 * j) = ptx::bf16x2(v0, v1);
                } else {
                    *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(v0, v1);
                }
            }
        }
    }

    __device__ __forceinline__ void finish() const {}
};

// bf16 output through shared memory and TMA stores (every row of the slice is written, so only
// for the contiguous layout, whose tiles never cross a segment). The stores drain while the
// warpgroup already runs the next tile's mainloop; the staging tile is reused once the previous
// store has read it.
struct TmaStoreBf16 {
    // The kernel's params (param space), read where they are used, not held in registers.
    const EpilogueParams& p;

    template <int kWaves, int kAccum>
    __device__ __forceinline__ void store(u8* staging, u32 wg, u32 row0, u32 col0, u32 /*rows_valid*/,
                                          const float (&acc)[kWaves][kAccum]) const {
#pragma unroll
        for (int w = 0; w < kWaves; ++w) store_wave(staging, wg, row0, col0 + w * 2 * kAccum, acc[w]);
    }

    template <int kAccum>
    __device__ __forceinline__ void store_wave(u8* staging, u32 wg, u32 row0, u32 col0,
                                               const float (&acc)[kAccum]) const {
        static_assert(kAccum % 32 == 0, "64-column halves of a wgmma slice");
        const u32 lane = threadIdx.x % 32;
        const u32 warp = (threadIdx.x / 32) % 4;
        const bool leader = threadIdx.x % 128 == 0;
        const NamedBarrier bar = warpgroup_barrier(wg);
        // This lane's row address for stmatrix: matrices (rows 0-7 | 8-15) x (chunk | chunk+1).
        const u32 row = warp * 16 + lane % 8 + 8 * ((lane / 8) % 2);
        const u32 chunk_step = lane / 16;
#pragma unroll
        for (int half = 0; half < kAccum / 32; ++half) {
            if (leader) ptx::bulk_wait_group_read<0>();
            named_barrier_sync(bar, 128);
#pragma unroll
            for (int jj = 0; jj < 8; jj += 2) {
                const int j = half * 8 + jj;  // 8-column group inside the slice
                const u32 chunk = jj + chunk_step;
                u8* dst = staging + row * 128 + ((chunk ^ (row % 8)) * 16);
                ptx::stmatrix_x4(
                    dst, ptx::bf16x2(acc[4 * j], acc[4 * j + 1]), ptx::bf16x2(acc[4 * j + 2], acc[4 * j + 3]),
                    ptx::bf16x2(acc[4 * j + 4], acc[4 * j + 5]), ptx::bf16x2(acc[4 * j + 6], acc[4 * j + 7]));
            }
            ptx::fence_proxy_async_shared();
            named_barrier_sync(bar, 128);
            // A partial last n-tile (192-column tiles) ends at N: its halves past N stay home.
            if (leader && col0 + 64 * half < p.n) {
                ptx::tma_store_2d(&p.tma_d, staging, static_cast<i32>(col0 + 64 * half), static_cast<i32>(row0));
                ptx::bulk_commit_group();
            }
        }
    }

    __device__ __forceinline__ void finish() const {
        if (threadIdx.x % 128 == 0) ptx::bulk_wait_group_all();
    }
};

}  // namespace megamoe::gemm
