// FP8 block-scaled grouped GEMM y = x * W^T over experts (SPEC §3 steps 1 and 4), persistent and
// warp-specialised: warpgroups 0 and 1 run the wgmma consumer, warpgroup 2 the TMA producer.
// kClusterM = 2: clusters of two CTAs that share (multicast) the weight tile of a tile pair.
// kRescaled: the opt-in accumulation, the running sum kept in the wgmma accumulators
// (tile_k_loop_rescaled).
// Scheduler: the tile sequence (TileScheduler, or any of the shape in scheduler/tile.cuh whose
// params are SchedulerParams). Epilogue: what happens to each finished slice (epilogue/store.cuh).
// Instantiated per configuration by a generated translation unit (src/kernel.rs).
#pragma once
#include <megamoe/ptx/mbarrier.cuh>
#include <megamoe/ptx/sync.cuh>
#include <megamoe/ptx/tma.cuh>
#include <megamoe_gemm/epilogue/store.cuh>
#include <megamoe_gemm/impls/grouped_gemm_params.cuh>
#include <megamoe_gemm/layout/smem_layout.cuh>
#include <megamoe_gemm/pipeline/roles.cuh>
#include <megamoe_gemm/pipeline/tma_producer.cuh>
#include <megamoe_gemm/mma/fp8_mainloop.cuh>
#include <megamoe_gemm/scheduler/tile_scheduler.cuh>

namespace megamoe::gemm {

template <int BLOCK_M, int BLOCK_N, int kStages, int kGroupSize, bool kMasked, int kClusterM, bool kRescaled,
          typename Scheduler, typename Epilogue>
__device__ __forceinline__ void grouped_gemm_fp8(const GroupedGemmParams& p, const Epilogue& epi) {
    using Layout = SmemLayout<BLOCK_M, BLOCK_N, kStages, kGroupSize>;
    extern __shared__ u8 smem_raw[];
    // Swizzled tiles need a 1 KiB-aligned base; the launch asks for 1 KiB of slack.
    const Layout smem{smem_raw + ((1024 - (ptx::smem_addr(smem_raw) & 1023)) & 1023)};
    const u32 warp = ptx::warp_index_uniform();

    if (threadIdx.x == kProducerWarp * 32) {
        ptx::tma_prefetch_desc(&p.mainloop.tma_a);
        ptx::tma_prefetch_desc(&p.mainloop.tma_b);
        ptx::tma_prefetch_desc(&p.mainloop.tma_sa);
        ptx::tma_prefetch_desc(&p.epilogue.tma_d);
    }
    const i32* expert_rows = reinterpret_cast<const i32*>(p.scheduler.expert_rows);
    for (u32 e = threadIdx.x; e < p.scheduler.num_experts; e += blockDim.x) smem.rows()[e] = expert_rows[e];
    if (threadIdx.x == 0) {
#pragma unroll
        for (int s = 0; s < kStages; ++s) {
            ptx::mbarrier_init(smem.full(s), 1);
            ptx::mbarrier_init(smem.empty(s), kMathWarps * kClusterM);
        }
        ptx::fence_barrier_init();
    }
    if constexpr (kClusterM > 1) {
        ptx::cluster_sync();
    } else {
        __syncthreads();
    }

    if (warp >= kMathWarps) {
        ptx::setmaxnreg_dec<kProducerRegs>();
        if (threadIdx.x == kProducerWarp * 32) {
            tma_producer<BLOCK_M, BLOCK_N, kStages, kGroupSize, kMasked, kClusterM, Scheduler>(p.mainloop, p.scheduler,
                                                                                               smem);
        }
    } else {
        ptx::setmaxnreg_inc<kConsumerRegs>();
        wgmma_consumer<BLOCK_M, BLOCK_N, kStages, kGroupSize, kClusterM, kRescaled, Scheduler, Epilogue>(
            p.mainloop, p.scheduler, epi, smem, warp / 4);
    }
    if constexpr (kClusterM > 1) ptx::cluster_sync();
}

}  // namespace megamoe::gemm
