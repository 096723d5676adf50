// The fused kernel's L2 epilogue (SPEC §3 step 4's output): each valid row of a warpgroup's
// 64-row slice goes, as bf16, to its token's rank: row (t, k) of that rank's combine region
// [t_cap, K, H], whose address the pull wrote beside the ring row (row_dest). The slice is staged
// 64 columns at a time in shared memory (the TMA-store epilogue's swizzled tile,
// megamoe_gemm/epilogue/store.cuh), then every lane copies 16-byte pieces of four rows, so each
// row's 128 bytes leave as whole lines. A warp stages and copies its own 16 rows: it syncs with
// itself only, never with the warpgroup (SwigluQuant, the other epilogue on this staging tile,
// keeps to its warp's rows as well).
#pragma once
#include <megamoe/common.cuh>
#include <megamoe/ptx/convert.cuh>
#include <megamoe/ptx/memory.cuh>
#include <megamoe_layer/impls/fused_params.cuh>

namespace megamoe::layer {

constexpr u32 kScatterRowsPerThread = 4;

struct ScatterRows {
    const FusedRegions& r;

    __device__ __forceinline__ const u64* row_dest(u32 row0) const {
        return reinterpret_cast<const u64*>(reinterpret_cast<const char*>(r.peer_base[r.rank]) + r.off_row_dest) + row0;
    }

    // Before the slice's K loop: brings its rows' destinations into L1, so that the epilogue's
    // loads of them do not wait on L2 (each warp one 16-row line).
    __device__ __forceinline__ void prefetch(u32 row0) const {
        if (threadIdx.x % 32 == 0) ptx::prefetch_l1(row_dest(row0) + (threadIdx.x / 32) % 4 * 16);
    }

    template <int kWaves, int kAccum>
    __device__ __forceinline__ void store(u8* staging, u32 /*wg*/, u32 row0, u32 col0, u32 rows_valid,
                                          const float (&acc)[kWaves][kAccum]) const {
        static_assert(kAccum % 32 == 0, "64-column halves of a wgmma slice");
        const u32 lane = threadIdx.x % 32;
        const u32 warp = (threadIdx.x / 32) % 4;
        if (ptx::warp_index_uniform() % 4 * 16 >= rows_valid) return;  // all 16 rows padding (fused.cuh)
        // Rows this lane copies out (the warp's rows lane/8 + 4 i) and its 16-byte piece of each
        // (lane % 8): their output addresses, 0 past the slice's valid rows.
        const u64* dest = row_dest(row0);
        u64 out[kScatterRowsPerThread];
#pragma unroll
        for (int i = 0; i < kScatterRowsPerThread; ++i) {
            const u32 row = warp * 16 + lane / 8 + 4 * i;
            out[i] = row < rows_valid ? dest[row] + (u64(col0) * 2 + (lane % 8) * 16) : 0;
        }
        // This lane's row address for stmatrix: matrices (rows 0-7 | 8-15) x (chunk | chunk+1).
        const u32 st_row = warp * 16 + lane % 8 + 8 * ((lane / 8) % 2);
        const u32 chunk_step = lane / 16;
#pragma unroll
        for (int w = 0; w < kWaves; ++w) {
#pragma unroll
            for (int half = 0; half < kAccum / 32; ++half) {
                __syncwarp();  // the previous piece's copies are done
#pragma unroll
                for (int jj = 0; jj < 8; jj += 2) {
                    const int j = half * 8 + jj;  // 8-column group inside the wave
                    const u32 chunk = jj + chunk_step;
                    ptx::stmatrix_x4(staging + st_row * 128 + ((chunk ^ (st_row % 8)) * 16),
                                     ptx::bf16x2(acc[w][4 * j], acc[w][4 * j + 1]),
                                     ptx::bf16x2(acc[w][4 * j + 2], acc[w][4 * j + 3]),
                                     ptx::bf16x2(acc[w][4 * j + 4], acc[w][4 * j + 5]),
                                     ptx::bf16x2(acc[w][4 * j + 6], acc[w][4 * j + 7]));
                }
                __syncwarp();
                const u32 col_bytes = (w * 2 * kAccum + half * 64) * 2;
#pragma unroll
                for (int i = 0; i < kScatterRowsPerThread; ++i) {
                    const u32 row = warp * 16 + lane / 8 + 4 * i;
                    if (out[i] == 0) break;
                    const uint4 v =
                        *reinterpret_cast<const uint4*>(staging + row * 128 + (((lane % 8) ^ (row % 8)) * 16));
                    ptx::st_v4(reinterpret_cast<char*>(out[i] + col_bytes), v);
                }
            }
        }
    }

    __device__ __forceinline__ void finish() const {}
};

}  // namespace megamoe::layer
