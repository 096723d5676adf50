// The wgmma consumer: one warpgroup computes a 64-row slice of every tile of its CTA. Each
// scale group of K (G = 128 or 64 columns) is multiplied into a fresh f32 accumulator set and
// then promoted into the running sum with sa[row] * sb, so the tensor cores' limited-precision
// accumulation never spans more than one group (SPEC §3 steps 1 and 4).
#pragma once
#include <megamoe/ptx/mbarrier.cuh>
#include <megamoe_gemm/mma/wgmma.cuh>
#include <megamoe_gemm/pipeline/barriers.cuh>
#include <megamoe_gemm/layout/smem_desc.cuh>
#include <megamoe_gemm/layout/smem_layout.cuh>
#include <megamoe_gemm/scheduler/tile_scheduler.cuh>
#include <megamoe_gemm/impls/grouped_gemm_params.cuh>

namespace megamoe::gemm {

using Fp8Mma = WgmmaM64N128K32E4M3;

// A consumer warp is done with a stage: in a cluster pair either CTA's producer may write the
// stage (its multicast half of the weight tile), so both are told.
template <int kClusterM>
__device__ __forceinline__ void release_stage(u64* empty) {
    if constexpr (kClusterM == 1) {
        ptx::mbarrier_arrive(empty);
    } else {
#pragma unroll
        for (u32 cta = 0; cta < kClusterM; ++cta) ptx::mbarrier_arrive_cluster(empty, cta);
    }
}

// The K loop of one tile for one warpgroup: rows a_off..a_off+63 of the A tile times columns
// b_off..b_off + kWaves*128 of the B tile, one wave of m64n128 wgmmas per 128 columns, summed
// into `sum` (kWaves * 64 f32 registers; the fresh accumulators take 64 more). kARegs: each
// scale group's A slice is read from shared memory once (ldmatrix, G/32 x 4 registers) and fed
// to every wave from registers, instead of every wave's wgmmas reading it again.
template <int kWaves, int kClusterM, bool kARegs, int BLOCK_M, int BLOCK_N, int kStages,
          int kGroupSize>
__device__ __forceinline__ void tile_k_loop(const GroupedGemmParams& p,
                                            const SmemLayout<BLOCK_M, BLOCK_N, kStages, kGroupSize>& smem,
                                            RingCursor<kStages>& ring, const Tile& t, u32 a_off,
                                            u32 b_off, float (&sum)[kWaves][Fp8Mma::kAccum]) {
    using Layout = SmemLayout<BLOCK_M, BLOCK_N, kStages, kGroupSize>;
    using Mma = Fp8Mma;
    constexpr int kScaleCols = Layout::kScaleCols;
    constexpr int kMmaPerGroup = kGroupSize / Mma::kK;
    const u32 lane = threadIdx.x % 32;
    const u32 r_lo = a_off + (threadIdx.x / 32) % 4 * 16 + lane / 4;
    // ldmatrix.x4 row and 16-byte chunk of this lane inside the slice (matrices: rows 0-7 | 8-15
    // of the warp's 16, times bytes 0-15 | 16-31 of the k32 step), before the 128-byte swizzle.
    const u32 a_ld_row = (threadIdx.x / 32) % 4 * 16 + lane % 8 + 8 * ((lane / 8) % 2);
    const u32 a_ld_chunk = lane / 16;
    u32* error = reinterpret_cast<u32*>(p.error);
    const u32 k_blocks = p.k / Layout::kBlockK;
    // Weight scales of this slice's 128-column blocks: row (expert, n-block), one per K block.
    const float* sb_row = reinterpret_cast<const float*>(p.scale_b) +
                          (static_cast<u64>(t.expert) * (p.n / 128) + (t.n0 + b_off) / 128) * k_blocks;
#pragma unroll
    for (int w = 0; w < kWaves; ++w) {
#pragma unroll
        for (int i = 0; i < Mma::kAccum; ++i) sum[w][i] = 0.0f;
    }
    for (u32 kb = 0; kb < k_blocks; ++kb) {
        float sb[kWaves];
#pragma unroll
        for (int w = 0; w < kWaves; ++w) sb[w] = __ldg(sb_row + w * k_blocks + kb);
        mbarrier_wait(smem.full(ring.stage), ring.phase, error, p.timeout_ns, kWaitFull);
        const float* sa = smem.sa(ring.stage);
        float sa_lo[kScaleCols], sa_hi[kScaleCols];
#pragma unroll
        for (int g = 0; g < kScaleCols; ++g) {
            sa_lo[g] = sa[g * BLOCK_M + r_lo];
            sa_hi[g] = sa[g * BLOCK_M + r_lo + 8];
        }
        const u8* a_tile = smem.a(ring.stage) + a_off * Layout::kBlockK;
        const u8* b_tile = smem.b(ring.stage) + b_off * Layout::kBlockK;

#pragma unroll
        for (int g = 0; g < kScaleCols; ++g) {
            u32 a_frag[kMmaPerGroup][4];
            if constexpr (kARegs) {
#pragma unroll
                for (int j = 0; j < kMmaPerGroup; ++j) {
                    const u32 chunk = (g * kMmaPerGroup + j) * (Mma::kK / 16) + a_ld_chunk;
                    ptx::ldmatrix_x4(a_tile + a_ld_row * Layout::kBlockK + (chunk ^ (a_ld_row % 8)) * 16,
                                     a_frag[j]);
                }
            }
#pragma unroll
            for (int w = 0; w < kWaves; ++w) {
                float acc[Mma::kAccum];
#pragma unroll
                for (int i = 0; i < Mma::kAccum; ++i) wgmma_fence_operand(acc[i]);
                wgmma_fence();
#pragma unroll
                for (int j = 0; j < kMmaPerGroup; ++j) {
                    const u32 k_bytes = (g * kMmaPerGroup + j) * Mma::kK;
                    if constexpr (kARegs) {
                        Mma::mma(a_frag[j],
                                 smem_desc_k_major_sw128(b_tile + w * Mma::kN * Layout::kBlockK, k_bytes),
                                 acc, j > 0);
                    } else {
                        Mma::mma(smem_desc_k_major_sw128(a_tile, k_bytes),
                                 smem_desc_k_major_sw128(b_tile + w * Mma::kN * Layout::kBlockK, k_bytes),
                                 acc, j > 0);
                    }
                }
                wgmma_commit();
#pragma unroll
                for (int i = 0; i < Mma::kAccum; ++i) wgmma_fence_operand(acc[i]);
                wgmma_wait<0>();
#pragma unroll
                for (int i = 0; i < Mma::kAccum; ++i) wgmma_fence_operand(acc[i]);
                if (g == kScaleCols - 1 && w == kWaves - 1 && lane == 0) {
                    release_stage<kClusterM>(smem.empty(ring.stage));
                }
                const float s_lo = sa_lo[g] * sb[w];
                const float s_hi = sa_hi[g] * sb[w];
#pragma unroll
                for (int i = 0; i < Mma::kAccum; ++i) {
                    sum[w][i] = fmaf(acc[i], (i & 2) ? s_hi : s_lo, sum[w][i]);
                }
            }
        }
        ring.advance();
    }
}

template <int BLOCK_M, int BLOCK_N, int kStages, int kGroupSize, bool kMasked, int kClusterM,
          bool kARegs, typename Epilogue>
__device__ void wgmma_consumer(const GroupedGemmParams& p,
                               const SmemLayout<BLOCK_M, BLOCK_N, kStages, kGroupSize>& smem,
                               u32 wg) {
    using Mma = Fp8Mma;
    using Sched = TileScheduler<BLOCK_M, BLOCK_N, kMasked, kClusterM>;
    // BLOCK_M 128: the warpgroups split the rows; BLOCK_M 64: they split the columns. A
    // warpgroup's slice is 64 rows by kWaves * 128 columns.
    static_assert(BLOCK_M == 128 || BLOCK_M == 64, "two warpgroups of 64 rows, or one of 64");
    constexpr int kSliceCols = BLOCK_M == 128 ? BLOCK_N : BLOCK_N / 2;
    constexpr int kWaves = kSliceCols / Mma::kN;
    static_assert(kWaves * Mma::kN == kSliceCols && kWaves >= 1 && kWaves <= 2, "slice of 128 or 256 columns");
    const u32 a_off = BLOCK_M == 128 ? wg * Mma::kM : 0;
    const u32 b_off = BLOCK_M == 128 ? 0 : wg * kSliceCols;

    Sched sched(smem.rows(), p.num_experts, p.n, p.max_m, p.group_m);
    RingCursor<kStages> ring;
    Tile t;
    while (sched.next(t)) {
        float sum[kWaves][Mma::kAccum];
        tile_k_loop<kWaves, kClusterM, kARegs>(p, smem, ring, t, a_off, b_off, sum);
        const u32 rows_valid = t.rows_valid > a_off ? t.rows_valid - a_off : 0;
#pragma unroll
        for (int w = 0; w < kWaves; ++w) {
            Epilogue::store(p, smem.staging(wg), wg, t.a_row + a_off, t.n0 + b_off + w * Mma::kN,
                            rows_valid, sum[w]);
        }
    }
    Epilogue::finish();
}

}  // namespace megamoe::gemm
