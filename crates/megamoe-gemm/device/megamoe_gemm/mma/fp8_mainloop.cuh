// The wgmma consumer: one warpgroup computes a 64-row slice of every tile of its CTA. Each
// scale group of K (G = 128 or 64 columns) is multiplied into a fresh f32 accumulator set and
// then promoted into the running sum with sa[row] * sb, so the tensor cores' limited-precision
// accumulation never spans more than one group (SPEC §3 steps 1 and 4). The tiles come from a
// Scheduler (scheduler/tile.cuh), built from its params, and each finished slice goes to an
// Epilogue (epilogue/store.cuh).
#pragma once
#include <megamoe/ptx/mbarrier.cuh>
#include <megamoe_gemm/mma/wgmma.cuh>
#include <megamoe_gemm/pipeline/barriers.cuh>
#include <megamoe_gemm/layout/smem_desc.cuh>
#include <megamoe_gemm/layout/smem_layout.cuh>
#include <megamoe_gemm/scheduler/tile.cuh>
#include <megamoe_gemm/mma/mainloop_params.cuh>

namespace megamoe::gemm {

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

// The weight scales of a warpgroup's slice of one tile: rows (expert, n-block) of one scale per K
// block for each 128-column block the slice spans (two: two 128-column waves, or one 192-column
// wave across two blocks), staged in the warpgroup's shared rows for the whole tile so that a K
// block reads them with one shared load each. load() issues the global loads of a tile (thread
// i of the warpgroup loads K block i of each row) and is called during the previous tile's
// epilogue, which hides their latency; stage() stores them once every warp of the warpgroup is
// done with the previous tile's rows; both K loops read them from there. The last block of a
// partial last n-tile is clamped: its columns past N are never stored.
template <int kWaveN, int kWaves, int kRowFloats>
struct TileWeightScales {
    static constexpr int kScaleBlocks = kWaveN == 128 ? 1 : 2;
    static constexpr int kRows = kWaves * kScaleBlocks;
    float v[kRows];

    __device__ __forceinline__ void load(const MainloopParams& p, const Tile& t, u32 b_off) {
        const float* scale_b = reinterpret_cast<const float*>(p.scale_b);
        const u32 k_blocks = p.k / 128;
        const u32 n_scale_blocks = p.n / 128;
        const u32 kb = threadIdx.x % 128;
#pragma unroll
        for (int w = 0; w < kWaves; ++w) {
#pragma unroll
            for (int s = 0; s < kScaleBlocks; ++s) {
                const u32 block = min((t.n0 + b_off + w * kWaveN) / 128 + s, n_scale_blocks - 1);
                const u64 row = static_cast<u64>(t.expert) * n_scale_blocks + block;
                v[w * kScaleBlocks + s] = kb < k_blocks ? __ldg(scale_b + row * k_blocks + kb) : 0.0f;
            }
        }
    }

    __device__ __forceinline__ void stage(float* rows, u32 wg) const {
        named_barrier_sync(warpgroup_barrier(wg), 128);
#pragma unroll
        for (int r = 0; r < kRows; ++r) rows[r * kRowFloats + threadIdx.x % 128] = v[r];
        named_barrier_sync(warpgroup_barrier(wg), 128);
    }
};

// The K loop of one tile for one warpgroup: rows a_off..a_off+63 of the A tile times columns
// b_off..b_off + kWaves*kWaveN of the B tile, one wave of m64nkWaveN wgmmas per kWaveN columns,
// summed into `sum` (kWaves * kWaveN / 2 f32 registers; the fresh accumulators take kWaveN / 2
// more). A 128-column wave lies in one 128 x 128 weight scale block; a 192-column wave starts
// kScaleShift (0 or 64) columns into one and spans two, its first 128 - kScaleShift columns
// scaled by the first.
template <int kWaveN, int kWaves, int kClusterM, int kScaleShift, int BLOCK_M, int BLOCK_N, int kStages, int kGroupSize,
          int kSaCols>
__device__ __forceinline__ void tile_k_loop(const MainloopParams& p,
                                            const SmemLayout<BLOCK_M, BLOCK_N, kStages, kGroupSize, kSaCols>& smem,
                                            RingCursor<kStages>& ring, const Tile& t, u32 wg, u32 a_off, u32 b_off,
                                            float (&sum)[kWaves][kWaveN / 2]) {
    using Layout = SmemLayout<BLOCK_M, BLOCK_N, kStages, kGroupSize, kSaCols>;
    using Mma = typename WgmmaE4M3<kWaveN>::type;
    constexpr int kScaleCols = Layout::kScaleCols;
    constexpr int kMmaPerGroup = kGroupSize / Mma::kK;
    constexpr int kScaleBlocks = TileWeightScales<kWaveN, kWaves, 0>::kScaleBlocks;
    // Accumulator groups of 4 registers (8 columns) under the wave's first weight scale.
    constexpr int kFirstScaleGroups = kWaveN == 128 ? Mma::kAccum / 4 : (128 - kScaleShift) / 8;
    static_assert(kWaveN == 128 || kWaves == 1, "a 192-column slice is one wave");
    const u32 lane = threadIdx.x % 32;
    const u32 r_lo = a_off + (threadIdx.x / 32) % 4 * 16 + lane / 4;
    auto* error = reinterpret_cast<comm::WaitRecord*>(p.error);
    const u32 k_blocks = p.k / Layout::kBlockK;
    // The tile's weight scales, staged by the caller (TileWeightScales).
    constexpr u32 kRowFloats = Layout::kScaleBRowFloats;
    const float* sb_tile = smem.scale_b(wg);
    // Stage 0's addresses; stage s adds s times a tile's size. The K loop then builds its
    // wgmma descriptors in uniform registers and reads scales without recomputing a thread's
    // row, which keeps the instructions between a wave's completion and the next wave's issue
    // few: both warpgroups run them at once, and the tensor cores wait meanwhile. The row's
    // address goes through an opaque copy, or the compiler rebuilds it from the thread index
    // in every K block.
    const u32 sa_rows0 = ptx::opaque(ptx::smem_addr(smem.sa(0) + r_lo));
    const u32 a_desc_lo0 = smem_desc_lo_k_major_sw128(smem.a(0) + a_off * Layout::kBlockK);
    const u32 b_desc_lo0 = smem_desc_lo_k_major_sw128(smem.b(0) + b_off * Layout::kBlockK);
#pragma unroll
    for (int w = 0; w < kWaves; ++w) {
#pragma unroll
        for (int i = 0; i < Mma::kAccum; ++i) sum[w][i] = 0.0f;
    }
    for (u32 kb = 0; kb < k_blocks; ++kb) {
        float sb[kWaves][kScaleBlocks];
#pragma unroll
        for (int w = 0; w < kWaves; ++w) {
#pragma unroll
            for (int s = 0; s < kScaleBlocks; ++s) sb[w][s] = sb_tile[(w * kScaleBlocks + s) * kRowFloats + kb];
        }
        mbarrier_wait(smem.full(ring.stage), ring.phase, error, p.timeout_ns, kWaitFull);
        // This thread's two rows' activation scales: stage 0's, plus the stage's offset.
        const u32 sa = sa_rows0 + ring.stage * Layout::kSaBytes;
        float sa_lo[kScaleCols], sa_hi[kScaleCols];
#pragma unroll
        for (int g = 0; g < kScaleCols; ++g) {
            sa_lo[g] = ptx::ld_shared_f32(sa + g * BLOCK_M * 4);
            sa_hi[g] = ptx::ld_shared_f32(sa + (g * BLOCK_M + 8) * 4);
        }
        const u32 a_desc_lo = a_desc_lo0 + ring.stage * (Layout::kABytes / 16);
        const u32 b_desc_lo = b_desc_lo0 + ring.stage * (Layout::kBBytes / 16);

#pragma unroll
        for (int g = 0; g < kScaleCols; ++g) {
#pragma unroll
            for (int w = 0; w < kWaves; ++w) {
                float acc[Mma::kAccum];
#pragma unroll
                for (int i = 0; i < Mma::kAccum; ++i) wgmma_fence_operand(acc[i]);
                wgmma_fence();
#pragma unroll
                for (int j = 0; j < kMmaPerGroup; ++j) {
                    const u32 k_bytes = (g * kMmaPerGroup + j) * Mma::kK;
                    const u64 b_desc = smem_desc_from_lo(b_desc_lo + (w * Mma::kN * Layout::kBlockK + k_bytes) / 16);
                    Mma::mma(smem_desc_from_lo(a_desc_lo + k_bytes / 16), b_desc, acc, j > 0);
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
                float s_lo[kScaleBlocks], s_hi[kScaleBlocks];
#pragma unroll
                for (int s = 0; s < kScaleBlocks; ++s) {
                    s_lo[s] = sa_lo[g] * sb[w][s];
                    s_hi[s] = sa_hi[g] * sb[w][s];
                }
#pragma unroll
                for (int i = 0; i < Mma::kAccum; ++i) {
                    const int s = i / 4 < kFirstScaleGroups ? 0 : 1;
                    sum[w][i] = fmaf(acc[i], (i & 2) ? s_hi[s] : s_lo[s], sum[w][i]);
                }
            }
        }
        ring.advance();
    }
}

// A warpgroup's turn at each stage of a tile whose slice it does not compute (its 64 rows all
// padding: the MoE layer's fused kernel at decode sizes): it waits for each stage to fill and
// releases it at once, so the ring turns as it does when both warpgroups compute, and the other
// warpgroup's wgmmas have the tensor cores to themselves.
template <int kClusterM, int BLOCK_M, int BLOCK_N, int kStages, int kGroupSize, int kSaCols>
__device__ __forceinline__ void tile_k_turns(const MainloopParams& p,
                                             const SmemLayout<BLOCK_M, BLOCK_N, kStages, kGroupSize, kSaCols>& smem,
                                             RingCursor<kStages>& ring) {
    using Layout = SmemLayout<BLOCK_M, BLOCK_N, kStages, kGroupSize, kSaCols>;
    auto* error = reinterpret_cast<comm::WaitRecord*>(p.error);
    const u32 k_blocks = p.k / Layout::kBlockK;
    for (u32 kb = 0; kb < k_blocks; ++kb) {
        mbarrier_wait(smem.full(ring.stage), ring.phase, error, p.timeout_ns, kWaitFull);
        if (threadIdx.x % 32 == 0) release_stage<kClusterM>(smem.empty(ring.stage));
        ring.advance();
    }
}

// The rescaled K loop (the opt-in accumulation, megamoe_core::Accumulation::Rescaled): the
// slice of tile_k_loop with the running sum kept in the wgmma accumulators, `sum` itself, and no
// second register set. A wave's accumulators hold the sum in units of the current scale group's
// scale, s = sa[row] * sb[column block] (picked per register as tile_k_loop's promotion picks
// them): before a group's wgmmas the set is multiplied by s_held / s, after the last group by the
// last s. The tensor cores' limited-precision accumulation then spans all of K instead of one
// group, so the error grows with K. The waves are pipelined: each wave's set is rescaled while
// the other's wgmmas run (wait_group kWaves - 1: its previous group is the oldest in flight), and
// a stage is released once the last wave that read it completes, one wave into the next K block.
// A scale that is zero or not finite, or whose ratio to the held one is not a finite non-zero
// f32, keeps the held one: that group is summed at the held scale (exact where its operands are
// zero, as the quantizers leave them under a zero scale), and no ratio makes the sum a NaN.
template <int kWaveN, int kWaves, int kClusterM, int kScaleShift, int BLOCK_M, int BLOCK_N, int kStages, int kGroupSize,
          int kSaCols>
struct RescaledKLoop {
    using Layout = SmemLayout<BLOCK_M, BLOCK_N, kStages, kGroupSize, kSaCols>;
    using Mma = typename WgmmaE4M3<kWaveN>::type;
    static constexpr int kScaleCols = Layout::kScaleCols;
    static constexpr int kMmaPerGroup = kGroupSize / Mma::kK;
    static constexpr int kScaleBlocks = TileWeightScales<kWaveN, kWaves, 0>::kScaleBlocks;
    static constexpr int kFirstScaleGroups = kWaveN == 128 ? Mma::kAccum / 4 : (128 - kScaleShift) / 8;
    static constexpr u32 kRowFloats = Layout::kScaleBRowFloats;
    static_assert(kWaveN == 128 || kWaves == 1, "a 192-column slice is one wave");
    // K blocks per chunk (see chunk()): eight jobs (a wave's wgmmas of one scale group) of
    // two-wave slices; a one-wave slice waits for its previous group at every rescale anyway.
    static constexpr int kChunkBlocks = kWaves == 1 ? 1 : 4 / kScaleCols;

    const MainloopParams& p;
    const Layout& smem;
    RingCursor<kStages>& ring;
    float (&sum)[kWaves][kWaveN / 2];
    const float* sb_tile;  // the tile's weight scales, staged in shared memory (TileWeightScales)
    // Stage 0's addresses, as in tile_k_loop; the current block's come from them.
    u32 sa_rows0, a_desc_lo0, b_desc_lo0;
    u32 a_desc_lo = 0, b_desc_lo = 0;
    float sb[kWaves][kScaleBlocks];
    float sa_row[kScaleCols][2];  // this thread's rows r_lo and r_lo + 8
    // The scale each wave's accumulators are held in, per weight scale block and row.
    float held[kWaves][kScaleBlocks][2];
    int prev_stage = 0;  // the stage of the last block begun

    // Block kb's scales and descriptors, once its stage is full. The previous block's wgmmas
    // are in flight: the wait's expiry path waits for them before it exits, or ptxas would
    // insert that wait on its own and serialize every wgmma of the kernel (C7518); the aligned
    // wait_group needs the whole warp, hence the per-warp wait.
    __device__ __forceinline__ void begin_block(u32 kb) {
#pragma unroll
        for (int w = 0; w < kWaves; ++w) {
#pragma unroll
            for (int s = 0; s < kScaleBlocks; ++s) sb[w][s] = sb_tile[(w * kScaleBlocks + s) * kRowFloats + kb];
        }
        mbarrier_wait_warp(smem.full(ring.stage), ring.phase, reinterpret_cast<comm::WaitRecord*>(p.error),
                           p.timeout_ns, kWaitFull, [] { wgmma_wait<0>(); });
        const u32 sa = sa_rows0 + ring.stage * Layout::kSaBytes;
#pragma unroll
        for (int g = 0; g < kScaleCols; ++g) {
            sa_row[g][0] = ptx::ld_shared_f32(sa + g * BLOCK_M * 4);
            sa_row[g][1] = ptx::ld_shared_f32(sa + (g * BLOCK_M + 8) * 4);
        }
        a_desc_lo = a_desc_lo0 + ring.stage * (Layout::kABytes / 16);
        b_desc_lo = b_desc_lo0 + ring.stage * (Layout::kBBytes / 16);
    }

    // Waits for wave kW's previous group (releasing the previous block's stage when that was
    // its last reader) and rescales the wave's accumulators to scale group kG of this block.
    template <int kG, int kW>
    __device__ __forceinline__ void rescale(bool release) {
        wgmma_wait<kWaves - 1>();
#pragma unroll
        for (int i = 0; i < Mma::kAccum; ++i) wgmma_fence_operand(sum[kW][i]);
        if (release && threadIdx.x % 32 == 0) release_stage<kClusterM>(smem.empty(prev_stage));
        float ratio[kScaleBlocks][2];
#pragma unroll
        for (int s = 0; s < kScaleBlocks; ++s) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float scale = sa_row[kG][h] * sb[kW][s];
                // div.full (2 ulp): an IEEE division's slow path is a call, across which ptxas
                // would serialize every wgmma of the kernel.
                const float r = __fdividef(held[kW][s][h], scale);
                const bool take = r != 0.0f && isfinite(r);
                ratio[s][h] = take ? r : 1.0f;
                held[kW][s][h] = take ? scale : held[kW][s][h];
            }
        }
#pragma unroll
        for (int i = 0; i < Mma::kAccum; ++i) {
            sum[kW][i] *= ratio[i / 4 < kFirstScaleGroups ? 0 : 1][(i & 2) ? 1 : 0];
            wgmma_fence_operand(sum[kW][i]);
        }
    }

    template <int kG, int kW>
    __device__ __forceinline__ void issue() {
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < kMmaPerGroup; ++j) {
            const u32 k_bytes = (kG * kMmaPerGroup + j) * Mma::kK;
            const u64 b_desc = smem_desc_from_lo(b_desc_lo + (kW * Mma::kN * Layout::kBlockK + k_bytes) / 16);
            Mma::mma(smem_desc_from_lo(a_desc_lo + k_bytes / 16), b_desc, sum[kW], true);
        }
        wgmma_commit();
#pragma unroll
        for (int i = 0; i < Mma::kAccum; ++i) wgmma_fence_operand(sum[kW][i]);
    }

    // The jobs of block b of a chunk from group kG, wave kW on, in order. The previous block's
    // stage is released at its last reader's completion: the wait before rescaling the last
    // wave of this block's first group.
    template <int kB, int kG, int kW>
    __device__ __forceinline__ void block_jobs() {
        if constexpr (kG < kScaleCols) {
            rescale<kG, kW>(kB > 0 && kG == 0 && kW == kWaves - 1);
            issue<kG, kW>();
            if constexpr (kW + 1 < kWaves) {
                block_jobs<kB, kG, kW + 1>();
            } else {
                block_jobs<kB, kG + 1, 0>();
            }
        }
    }

    // kBlocks blocks from kb, their wgmmas pipelined, and all of them complete at the end: a
    // wait_group 1 retiring a wave committed in an earlier iteration of a loop makes ptxas
    // serialize every wgmma of the kernel (it tracks the groups in flight within an iteration
    // only), so each chunk starts with none in flight and its first rescale waits.
    template <int kBlocks, int kB = 0>
    __device__ __forceinline__ void chunk(u32 kb) {
        if constexpr (kB < kBlocks) {
            begin_block(kb + kB);
            block_jobs<kB, 0, 0>();
            prev_stage = ring.stage;
            ring.advance();
            chunk<kBlocks, kB + 1>(kb);
        } else {
            wgmma_wait<0>();
#pragma unroll
            for (int w = 0; w < kWaves; ++w) {
#pragma unroll
                for (int i = 0; i < Mma::kAccum; ++i) wgmma_fence_operand(sum[w][i]);
            }
            if (threadIdx.x % 32 == 0) release_stage<kClusterM>(smem.empty(prev_stage));
        }
    }

    __device__ __forceinline__ void run(u32 k_blocks) {
#pragma unroll
        for (int w = 0; w < kWaves; ++w) {
#pragma unroll
            for (int i = 0; i < Mma::kAccum; ++i) sum[w][i] = 0.0f;
#pragma unroll
            for (int s = 0; s < kScaleBlocks; ++s) held[w][s][0] = held[w][s][1] = 1.0f;
        }
        u32 kb = 0;
        for (; kb + kChunkBlocks <= k_blocks; kb += kChunkBlocks) chunk<kChunkBlocks>(kb);
        for (; kb < k_blocks; ++kb) chunk<1>(kb);
#pragma unroll
        for (int w = 0; w < kWaves; ++w) {
#pragma unroll
            for (int i = 0; i < Mma::kAccum; ++i)
                sum[w][i] *= held[w][i / 4 < kFirstScaleGroups ? 0 : 1][(i & 2) ? 1 : 0];
        }
    }
};

template <int kWaveN, int kWaves, int kClusterM, int kScaleShift, int BLOCK_M, int BLOCK_N, int kStages, int kGroupSize,
          int kSaCols>
__device__ __forceinline__ void tile_k_loop_rescaled(
    const MainloopParams& p, const SmemLayout<BLOCK_M, BLOCK_N, kStages, kGroupSize, kSaCols>& smem,
    RingCursor<kStages>& ring, u32 wg, u32 a_off, u32 b_off, float (&sum)[kWaves][kWaveN / 2]) {
    using Layout = SmemLayout<BLOCK_M, BLOCK_N, kStages, kGroupSize, kSaCols>;
    const u32 r_lo = a_off + (threadIdx.x / 32) % 4 * 16 + threadIdx.x % 32 / 4;
    RescaledKLoop<kWaveN, kWaves, kClusterM, kScaleShift, BLOCK_M, BLOCK_N, kStages, kGroupSize, kSaCols> loop{
        p,
        smem,
        ring,
        sum,
        smem.scale_b(wg),
        ptx::opaque(ptx::smem_addr(smem.sa(0) + r_lo)),
        smem_desc_lo_k_major_sw128(smem.a(0) + a_off * Layout::kBlockK),
        smem_desc_lo_k_major_sw128(smem.b(0) + b_off * Layout::kBlockK)};
    loop.run(p.k / Layout::kBlockK);
}

// The K loop of a slice under the kernel's accumulation: promoted per scale group
// (tile_k_loop, the default) or rescaled (tile_k_loop_rescaled, opt-in).
template <bool kRescaled, int kWaveN, int kWaves, int kClusterM, int kScaleShift, int BLOCK_M, int BLOCK_N, int kStages,
          int kGroupSize, int kSaCols>
__device__ __forceinline__ void slice_k_loop(const MainloopParams& p,
                                             const SmemLayout<BLOCK_M, BLOCK_N, kStages, kGroupSize, kSaCols>& smem,
                                             RingCursor<kStages>& ring, const Tile& t, u32 wg, u32 a_off, u32 b_off,
                                             float (&sum)[kWaves][kWaveN / 2]) {
    if constexpr (kRescaled) {
        tile_k_loop_rescaled<kWaveN, kWaves, kClusterM, kScaleShift>(p, smem, ring, wg, a_off, b_off, sum);
    } else {
        tile_k_loop<kWaveN, kWaves, kClusterM, kScaleShift>(p, smem, ring, t, wg, a_off, b_off, sum);
    }
}

template <int BLOCK_M, int BLOCK_N, int kStages, int kGroupSize, int kClusterM, bool kRescaled, typename Scheduler,
          typename Epilogue>
__device__ void wgmma_consumer(const MainloopParams& p, const typename Scheduler::Params& sched_params,
                               const Epilogue& epi, const SmemLayout<BLOCK_M, BLOCK_N, kStages, kGroupSize>& smem,
                               u32 wg) {
    using Layout = SmemLayout<BLOCK_M, BLOCK_N, kStages, kGroupSize>;
    // BLOCK_M 128: the warpgroups split the rows; BLOCK_M 64: they split the columns. A
    // warpgroup's slice is 64 rows by kWaves waves of kWaveN columns.
    static_assert(BLOCK_M == 128 || BLOCK_M == 64, "two warpgroups of 64 rows, or one of 64");
    constexpr int kSliceCols = BLOCK_M == 128 ? BLOCK_N : BLOCK_N / 2;
    constexpr int kWaveN = kSliceCols == 192 ? 192 : 128;
    constexpr int kWaves = kSliceCols / kWaveN;
    static_assert(kWaves * kWaveN == kSliceCols && kWaves >= 1 && kWaves <= 2, "slice of 128, 192 or 256 columns");
    const u32 a_off = BLOCK_M == 128 ? wg * 64 : 0;
    const u32 b_off = BLOCK_M == 128 ? 0 : wg * kSliceCols;

    Scheduler sched(sched_params, smem.rows());
    RingCursor<kStages> ring;
    TileWeightScales<kWaveN, kWaves, Layout::kScaleBRowFloats> scales;
    Tile t;
    bool more = sched.next(t);
    if (more) scales.load(p, t, b_off);
    while (more) {
        scales.stage(smem.scale_b(wg), wg);
        float sum[kWaves][kWaveN / 2];
        if constexpr (kWaveN == 192) {
            // 192-column tiles start 0 or 64 columns into a weight scale block, alternately.
            if (t.n0 % 128 != 0) {
                slice_k_loop<kRescaled, kWaveN, kWaves, kClusterM, 64>(p, smem, ring, t, wg, a_off, b_off, sum);
            } else {
                slice_k_loop<kRescaled, kWaveN, kWaves, kClusterM, 0>(p, smem, ring, t, wg, a_off, b_off, sum);
            }
        } else {
            slice_k_loop<kRescaled, kWaveN, kWaves, kClusterM, 0>(p, smem, ring, t, wg, a_off, b_off, sum);
        }
        // The next tile's scales load while this one's epilogue runs.
        Tile next;
        more = sched.next(next);
        if (more) scales.load(p, next, b_off);
        const u32 rows_valid = t.rows_valid > a_off ? t.rows_valid - a_off : 0;
        epi.store(smem.staging(wg), wg, t.a_row + a_off, t.n0 + b_off, rows_valid, sum);
        t = next;
    }
    epi.finish();
}

}  // namespace megamoe::gemm
