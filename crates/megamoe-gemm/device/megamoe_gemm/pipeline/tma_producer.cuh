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

// The loads of one tile into the ring, one K block per stage, from the operands of `p`.
// `cta_rank`: this CTA's rank in its cluster. A stage's full barrier expects the whole K block
// (activations, weights, activation scales) once armed, so the weights may go first and the
// activations follow later.
template <bool kMasked, int kClusterM, int BLOCK_M, int BLOCK_N, int kStages, int kGroupSize, int kSaCols>
struct TileLoads {
    using Layout = SmemLayout<BLOCK_M, BLOCK_N, kStages, kGroupSize, kSaCols>;
    // Rows of the weight tile one TMA box holds (the map's box, set in src/grouped.rs).
    static constexpr u32 kBRowsPerLoad = BLOCK_N / kClusterM;

    const MainloopParams& p;
    const Tile& t;
    u32 cta_rank;
    const Layout& smem;

    __device__ __forceinline__ u32 k_blocks() const { return p.k / Layout::kBlockK; }

    // Waits for the stage to be free and arms its full barrier with a whole K block's bytes.
    __device__ __forceinline__ void arm(const RingCursor<kStages>& ring) const {
        mbarrier_wait(smem.empty(ring.stage), ring.phase ^ 1, reinterpret_cast<comm::WaitRecord*>(p.error),
                      p.timeout_ns, kWaitEmpty);
        ptx::mbarrier_arrive_expect_tx(smem.full(ring.stage), Layout::kStageTxBytes);
    }

    // Requests the weight tile's K block kb into an armed stage.
    __device__ __forceinline__ void weights(u32 kb, const RingCursor<kStages>& ring) const {
        u64* full = smem.full(ring.stage);
        const i32 k0 = static_cast<i32>(kb * Layout::kBlockK);
        const i32 b_row = static_cast<i32>(t.expert * p.n + t.n0);
        if (kClusterM > 1 && t.shared_b) {
            ptx::tma_load_2d_multicast(smem.b(ring.stage) + cta_rank * kBRowsPerLoad * Layout::kBlockK,
                                       &p.tma_b, full, k0, b_row + static_cast<i32>(cta_rank * kBRowsPerLoad),
                                       (1u << kClusterM) - 1, ptx::CacheHint::kEvictNormal);
        } else {
#pragma unroll
            for (int h = 0; h < kClusterM; ++h) {
                ptx::tma_load_2d(smem.b(ring.stage) + h * kBRowsPerLoad * Layout::kBlockK, &p.tma_b, full, k0,
                                 b_row + static_cast<i32>(h * kBRowsPerLoad), ptx::CacheHint::kEvictNormal);
            }
        }
    }

    // Requests the activations and their scales of K block kb into an armed stage.
    __device__ __forceinline__ void activations(u32 kb, const RingCursor<kStages>& ring) const {
        u64* full = smem.full(ring.stage);
        ptx::tma_load_2d(smem.a(ring.stage), &p.tma_a, full, static_cast<i32>(kb * Layout::kBlockK),
                         static_cast<i32>(t.a_row), ptx::CacheHint::kEvictLast);
        // Scales: contiguous rows are global rows of one K-group-major matrix; masked rows are
        // rows of the expert's slot, whose K groups follow the previous experts' groups.
        const i32 sa_x = static_cast<i32>(kMasked ? t.m_block * BLOCK_M : t.a_row);
        const i32 sa_y0 = static_cast<i32>(kMasked ? t.expert * (p.k / kGroupSize) : 0);
        ptx::tma_load_2d(smem.sa(ring.stage), &p.tma_sa, full, sa_x,
                         sa_y0 + static_cast<i32>(kb * Layout::kScaleCols), ptx::CacheHint::kEvictLast);
    }
};

// Loads every K block of tile `t` into the ring (one stage each), from the operands of `p`.
template <bool kMasked, int kClusterM, int BLOCK_M, int BLOCK_N, int kStages, int kGroupSize, int kSaCols>
__device__ __forceinline__ void load_tile(const MainloopParams& p, const Tile& t, u32 cta_rank,
                                          const SmemLayout<BLOCK_M, BLOCK_N, kStages, kGroupSize, kSaCols>& smem,
                                          RingCursor<kStages>& ring) {
    const TileLoads<kMasked, kClusterM, BLOCK_M, BLOCK_N, kStages, kGroupSize, kSaCols> loads{p, t, cta_rank, smem};
    for (u32 kb = 0; kb < loads.k_blocks(); ++kb) {
        loads.arm(ring);
        loads.activations(kb, ring);
        loads.weights(kb, ring);
        ring.advance();
    }
}

// The same for a tile whose activations may not be there yet: the weights of its first K blocks
// (as many as the ring has stages) are requested first, then `rows_ready()` waits for the
// activations; false (it expired) stops here, true loads the rest. The weight stream goes on
// while the rows are awaited.
template <bool kMasked, int kClusterM, int BLOCK_M, int BLOCK_N, int kStages, int kGroupSize, int kSaCols,
          typename RowsReady>
__device__ __forceinline__ bool load_tile_weights_first(
    const MainloopParams& p, const Tile& t, u32 cta_rank,
    const SmemLayout<BLOCK_M, BLOCK_N, kStages, kGroupSize, kSaCols>& smem, RingCursor<kStages>& ring,
    RowsReady rows_ready) {
    const TileLoads<kMasked, kClusterM, BLOCK_M, BLOCK_N, kStages, kGroupSize, kSaCols> loads{p, t, cta_rank, smem};
    const u32 k_blocks = loads.k_blocks();
    const u32 first = min(k_blocks, static_cast<u32>(kStages));
    RingCursor<kStages> ahead = ring;
    for (u32 kb = 0; kb < first; ++kb) {
        loads.arm(ahead);
        loads.weights(kb, ahead);
        ahead.advance();
    }
    if (!rows_ready()) return false;
    for (u32 kb = 0; kb < k_blocks; ++kb) {
        if (kb >= first) {
            loads.arm(ring);
            loads.weights(kb, ring);
        }
        loads.activations(kb, ring);
        ring.advance();
    }
    return true;
}

template <int BLOCK_M, int BLOCK_N, int kStages, int kGroupSize, bool kMasked, int kClusterM,
          typename Scheduler>
__device__ void tma_producer(const MainloopParams& p, const typename Scheduler::Params& sched_params,
                             const SmemLayout<BLOCK_M, BLOCK_N, kStages, kGroupSize>& smem) {
    Scheduler sched(sched_params, smem.rows());
    RingCursor<kStages> ring;
    Tile t;
    while (sched.next(t)) load_tile<kMasked, kClusterM>(p, t, sched.rank, smem, ring);
}

}  // namespace megamoe::gemm
