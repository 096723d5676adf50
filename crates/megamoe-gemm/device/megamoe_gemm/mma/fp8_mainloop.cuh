// The wgmma consumer: one warpgroup computes a 64-row slice of every tile of its CTA. Each
// scale group of K (G = 128 or 64 columns) is multiplied into a fresh f32 accumulator set and
// then promoted into the running sum with sa[row] * sb, so the tensor cores' limited-precision
// accumulation never spans more than one group (SPEC §3 steps 1 and 4).
#pragma once
#include <megamoe/ptx/mbarrier.cuh>
#include <megamoe_gemm/mma/wgmma.cuh>
#include <megamoe_gemm/pipeline/barriers.cuh>
#include <megamoe_gemm/pipeline/wave_order.cuh>
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
template <int kWaves, int kClusterM, bool kARegs, bool kOrdered, int BLOCK_M, int BLOCK_N,
          int kStages, int kGroupSize>
__device__ __forceinline__ void tile_k_loop(const GroupedGemmParams& p,
                                            const SmemLayout<BLOCK_M, BLOCK_N, kStages, kGroupSize>& smem,
                                            RingCursor<kStages>& ring, WaveOrder<kOrdered>& order,
                                            const Tile& t, u32 a_off, u32 b_off,
                                            float (&sum)[kWaves][Fp8Mma::kAccum]) {
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
                order.before_issue(p);
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
                order.after_commit();
#pragma unroll
                for (int i = 0; i < Mma::kAccum; ++i) wgmma_fence_operand(acc[i]);
                wgmma_wait<0>();
#pragma unroll
                for (int i = 0; i < Mma::kAccum; ++i) wgmma_fence_operand(acc[i]);
                order.after_complete();
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

// v6/v7: the K loop of a slice (64 rows x kSliceCols) with each promotion hidden behind the next
// wgmmas. The slice is accumulated in chunks of kChunkN columns, one unit = one scale group of
// one chunk, and two fresh accumulator sets alternate between units: unit u + 1 is issued into
// one before unit u's wgmmas are waited for (wait_group 1) and promoted from the other, so the
// tensor cores have this warpgroup's work queued while it runs the promotion FFMAs. The registers
// set the chunk: a 128-column slice (64 sum registers) takes two 64-register sets of m64n128
// (v6), a 256-column slice (128 sum registers) two 32-register sets of m64n64 (v7). A stage is
// released once the wgmmas of its last unit complete, one unit later than in tile_k_loop.
template <int kSliceCols, int kChunkN, int BLOCK_M, int BLOCK_N, int kStages, int kGroupSize>
struct PipelinedKLoop {
    using Layout = SmemLayout<BLOCK_M, BLOCK_N, kStages, kGroupSize>;
    using Mma = typename WgmmaE4M3<kChunkN>::type;
    static constexpr int kChunks = kSliceCols / kChunkN;
    static constexpr int kScaleCols = Layout::kScaleCols;
    static constexpr int kUnitsPerBlock = kScaleCols * kChunks;
    static constexpr int kMmaPerGroup = kGroupSize / Mma::kK;
    // Weight scale blocks (128 columns each) the slice spans.
    static constexpr int kScaleBlocks = kSliceCols / 128;

    const GroupedGemmParams& p;
    const Layout& smem;
    RingCursor<kStages>& ring;
    float (&sum)[kChunks][Mma::kAccum];
    u32 a_off, b_off, r_lo, k_blocks, kb = 0;
    const float* sb_row;
    float acc[2][Mma::kAccum];
    float sa_lo[kScaleCols], sa_hi[kScaleCols], sb[kScaleBlocks];
    // The unit whose wgmmas are in flight: its scales, and the stage it was the last reader of.
    float prev_lo = 0.0f, prev_hi = 0.0f;
    bool prev_releases = false;
    int prev_stage = 0;

    // Issues unit kUnit of the current K block (scale group kUnit / kChunks, chunk
    // kUnit % kChunks) into acc[kBuf], then waits for and promotes the previous unit
    // (acc[1 - kBuf]) while these wgmmas run.
    template <int kBuf, int kUnit, bool kHasPrev>
    __device__ __forceinline__ void unit() {
        constexpr int kG = kUnit / kChunks;
        constexpr int kC = kUnit % kChunks;
        if constexpr (kUnit == 0) {
#pragma unroll
            for (int s = 0; s < kScaleBlocks; ++s) sb[s] = __ldg(sb_row + s * k_blocks + kb);
            wait_full();
            const float* sa = smem.sa(ring.stage);
#pragma unroll
            for (int g = 0; g < kScaleCols; ++g) {
                sa_lo[g] = sa[g * BLOCK_M + r_lo];
                sa_hi[g] = sa[g * BLOCK_M + r_lo + 8];
            }
        }
        const u8* a_tile = smem.a(ring.stage) + a_off * Layout::kBlockK;
        const u8* b_tile = smem.b(ring.stage) + (b_off + kC * kChunkN) * Layout::kBlockK;
#pragma unroll
        for (int i = 0; i < Mma::kAccum; ++i) wgmma_fence_operand(acc[kBuf][i]);
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < kMmaPerGroup; ++j) {
            const u32 k_bytes = (kG * kMmaPerGroup + j) * Mma::kK;
            Mma::mma(smem_desc_k_major_sw128(a_tile, k_bytes), smem_desc_k_major_sw128(b_tile, k_bytes),
                     acc[kBuf], j > 0);
        }
        wgmma_commit();
#pragma unroll
        for (int i = 0; i < Mma::kAccum; ++i) wgmma_fence_operand(acc[kBuf][i]);
        if constexpr (kHasPrev) {
            wgmma_wait<1>();
            promote<1 - kBuf, (kC + kChunks - 1) % kChunks>();
        }
        prev_lo = sa_lo[kG] * sb[kC * kChunkN / 128];
        prev_hi = sa_hi[kG] * sb[kC * kChunkN / 128];
        prev_releases = kUnit == kUnitsPerBlock - 1;
        prev_stage = ring.stage;
        if constexpr (kUnit == kUnitsPerBlock - 1) {
            ring.advance();
            ++kb;
        }
    }

    // Every unit of one K block, the first into acc[kFirstBuf].
    template <int kFirstBuf, bool kFirstBlock, int kUnit = 0>
    __device__ __forceinline__ void block() {
        unit<(kFirstBuf + kUnit) % 2, kUnit, !(kFirstBlock && kUnit == 0)>();
        if constexpr (kUnit + 1 < kUnitsPerBlock) block<kFirstBuf, kFirstBlock, kUnit + 1>();
    }

    // mbarrier_wait on the stage's full barrier, with the previous unit's wgmmas in flight:
    // the expiry path waits for them itself before it exits, or ptxas would insert that wait
    // on its own and serialize every wgmma of the kernel (C7518). The loop and the expiry are
    // decided per warp (votes), as the aligned wgmma.wait_group needs the whole warp.
    __device__ __forceinline__ void wait_full() {
        u64* bar = smem.full(ring.stage);
        if (__all_sync(~0u, ptx::mbarrier_try_wait_parity(bar, ring.phase))) return;
        const u64 start = ptx::globaltimer_ns();
        while (!__all_sync(~0u, ptx::mbarrier_try_wait_parity(bar, ring.phase))) {
            if (__any_sync(~0u, ptx::globaltimer_ns() - start > p.timeout_ns)) {
                atomicCAS(reinterpret_cast<u32*>(p.error), 0u, 0x80000000u | kWaitFull);
                wgmma_wait<0>();
                asm volatile("exit;");
            }
        }
    }

    // Folds the completed unit in acc[kBuf] into chunk kC of the sum and releases its stage if
    // it was the stage's last reader.
    template <int kBuf, int kC>
    __device__ __forceinline__ void promote() {
#pragma unroll
        for (int i = 0; i < Mma::kAccum; ++i) wgmma_fence_operand(acc[kBuf][i]);
        ptx::mbarrier_arrive_if(smem.empty(prev_stage), prev_releases && threadIdx.x % 32 == 0);
#pragma unroll
        for (int i = 0; i < Mma::kAccum; ++i) {
            sum[kC][i] = fmaf(acc[kBuf][i], (i & 2) ? prev_hi : prev_lo, sum[kC][i]);
        }
    }

    __device__ __forceinline__ void run() {
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
#pragma unroll
            for (int i = 0; i < Mma::kAccum; ++i) sum[c][i] = 0.0f;
        }
        // Unit u goes to acc[u % 2]. With an even count of units per K block every block starts
        // at acc[0]; with one unit per block (v6, G = 128) blocks alternate, so they run in
        // pairs and an even block count ends with one more. Every branch here is uniform and
        // outside the units.
        block<0, true>();
        u32 b = 1;
        if constexpr (kUnitsPerBlock % 2 == 0) {
            for (; b < k_blocks; ++b) block<0, false>();
            wgmma_wait<0>();
            promote<1, kChunks - 1>();
        } else {
            for (; b + 1 < k_blocks; b += 2) {
                block<1, false>();
                block<0, false>();
            }
            if (b < k_blocks) {
                block<1, false>();
                wgmma_wait<0>();
                promote<1, kChunks - 1>();
            } else {
                wgmma_wait<0>();
                promote<0, kChunks - 1>();
            }
        }
    }
};

template <int kChunkN, int BLOCK_M, int BLOCK_N, int kStages, int kGroupSize, int kChunks, int kAccum>
__device__ __forceinline__ void tile_k_loop_pipelined(
    const GroupedGemmParams& p, const SmemLayout<BLOCK_M, BLOCK_N, kStages, kGroupSize>& smem,
    RingCursor<kStages>& ring, const Tile& t, u32 a_off, u32 b_off, float (&sum)[kChunks][kAccum]) {
    using Layout = SmemLayout<BLOCK_M, BLOCK_N, kStages, kGroupSize>;
    const u32 k_blocks = p.k / Layout::kBlockK;
    PipelinedKLoop<kChunks * kChunkN, kChunkN, BLOCK_M, BLOCK_N, kStages, kGroupSize> loop{
        p, smem, ring, sum, a_off, b_off,
        a_off + (threadIdx.x / 32) % 4 * 16 + threadIdx.x % 32 / 4, k_blocks, 0,
        reinterpret_cast<const float*>(p.scale_b) +
            (static_cast<u64>(t.expert) * (p.n / 128) + (t.n0 + b_off) / 128) * k_blocks};
    loop.run();
}

template <int BLOCK_M, int BLOCK_N, int kStages, int kGroupSize, bool kMasked, int kClusterM,
          bool kARegs, bool kPipelined, bool kOrdered, typename Epilogue>
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

    // The pipelined K loop accumulates in chunks (see PipelinedKLoop); tile_k_loop in waves.
    constexpr int kChunkN = kPipelined && kSliceCols == 256 ? 64 : Mma::kN;
    constexpr int kChunks = kSliceCols / kChunkN;
    constexpr int kChunkAccum = kChunkN / 2;

    Sched sched(smem.rows(), p.num_experts, p.n, p.max_m, p.group_m);
    RingCursor<kStages> ring;
    WaveOrder<kOrdered> order{smem.wave_done(), smem.wave_issued(), wg};
    Tile t;
    while (sched.next(t)) {
        float sum[kChunks][kChunkAccum];
        if constexpr (kPipelined) {
            static_assert(kClusterM == 1 && !kARegs && !kOrdered,
                          "the pipelined K loop runs on single CTAs, A from shared memory, unordered");
            tile_k_loop_pipelined<kChunkN>(p, smem, ring, t, a_off, b_off, sum);
        } else {
            tile_k_loop<kWaves, kClusterM, kARegs, kOrdered>(p, smem, ring, order, t, a_off, b_off, sum);
        }
        const u32 rows_valid = t.rows_valid > a_off ? t.rows_valid - a_off : 0;
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
            Epilogue::store(p, smem.staging(wg), wg, t.a_row + a_off, t.n0 + b_off + c * kChunkN,
                            rows_valid, sum[c]);
        }
    }
    Epilogue::finish();
}

}  // namespace megamoe::gemm
