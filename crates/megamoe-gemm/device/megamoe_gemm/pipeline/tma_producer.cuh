// The TMA producer: one thread fills the ring, stage by stage, for every tile of its CTA. In a
// cluster pair that shares the weight tile, each CTA loads one half of it (BLOCK_N / 2 rows)
// and multicasts it into both CTAs' stage; otherwise the CTA loads both halves itself. Either
// way each stage's full barrier receives the same bytes. The tiles come from a Scheduler
// (scheduler/tile.cuh) built here from its params, walking the consumers' sequence.
#pragma once
#include <megamoe/ptx/mbarrier.cuh>
#include <megamoe/ptx/tma.cuh>
#include <megamoe_gemm/pipeline/barriers.cuh>
#include <megamoe_gemm/layout/smem_layout.cuh>
#include <megamoe_gemm/scheduler/tile.cuh>
#include <megamoe_gemm/mma/mainloop_params.cuh>

namespace megamoe::gemm {

// Loads every K block of tile `t` into the ring (one stage each), from the operands of `p`.
// `cta_rank`: this CTA's rank in its cluster.
template <bool kMasked, int kClusterM, int BLOCK_M, int BLOCK_N, int kStages, int kGroupSize, int kSaCols>
__device__ __forceinline__ void load_tile(const MainloopParams& p, const Tile& t, u32 cta_rank,
                                          const SmemLayout<BLOCK_M, BLOCK_N, kStages, kGroupSize, kSaCols>& smem,
                                          RingCursor<kStages>& ring) {
    using Layout = SmemLayout<BLOCK_M, BLOCK_N, kStages, kGroupSize, kSaCols>;
    constexpr int kScaleCols = Layout::kScaleCols;
    // Rows of the weight tile one TMA box holds (the map's box, set in src/grouped.rs).
    constexpr u32 kBRowsPerLoad = BLOCK_N / kClusterM;
    auto* error = reinterpret_cast<comm::WaitRecord*>(p.error);
    const u32 k_blocks = p.k / Layout::kBlockK;
    const u32 k_groups = p.k / kGroupSize;
    const i32 b_row = static_cast<i32>(t.expert * p.n + t.n0);
    // Scales: contiguous rows are global rows of one K-group-major matrix; masked rows are
    // rows of the expert's slot, whose K groups follow the previous experts' groups.
    const i32 sa_x = static_cast<i32>(kMasked ? t.m_block * BLOCK_M : t.a_row);
    const i32 sa_y0 = static_cast<i32>(kMasked ? t.expert * k_groups : 0);
    for (u32 kb = 0; kb < k_blocks; ++kb) {
        mbarrier_wait(smem.empty(ring.stage), ring.phase ^ 1, error, p.timeout_ns, kWaitEmpty);
        u64* full = smem.full(ring.stage);
        ptx::mbarrier_arrive_expect_tx(full, Layout::kStageTxBytes);
        const i32 k0 = static_cast<i32>(kb * Layout::kBlockK);
        ptx::tma_load_2d(smem.a(ring.stage), &p.tma_a, full, k0, static_cast<i32>(t.a_row), ptx::CacheHint::kEvictLast);
        if (kClusterM > 1 && t.shared_b) {
            ptx::tma_load_2d_multicast(smem.b(ring.stage) + cta_rank * kBRowsPerLoad * Layout::kBlockK, &p.tma_b, full,
                                       k0, b_row + static_cast<i32>(cta_rank * kBRowsPerLoad), (1u << kClusterM) - 1,
                                       ptx::CacheHint::kEvictNormal);
        } else {
#pragma unroll
            for (int h = 0; h < kClusterM; ++h) {
                ptx::tma_load_2d(smem.b(ring.stage) + h * kBRowsPerLoad * Layout::kBlockK, &p.tma_b, full, k0,
                                 b_row + static_cast<i32>(h * kBRowsPerLoad), ptx::CacheHint::kEvictNormal);
            }
        }
        ptx::tma_load_2d(smem.sa(ring.stage), &p.tma_sa, full, sa_x, sa_y0 + static_cast<i32>(kb * kScaleCols),
                         ptx::CacheHint::kEvictLast);
        ring.advance();
    }
}

template <int BLOCK_M, int BLOCK_N, int kStages, int kGroupSize, bool kMasked, int kClusterM, typename Scheduler>
__device__ void tma_producer(const MainloopParams& p, const typename Scheduler::Params& sched_params,
                             const SmemLayout<BLOCK_M, BLOCK_N, kStages, kGroupSize>& smem) {
    Scheduler sched(sched_params, smem.rows());
    RingCursor<kStages> ring;
    Tile t;
    while (sched.next(t)) load_tile<kMasked, kClusterM>(p, t, sched.rank, smem, ring);
}

}  // namespace megamoe::gemm
