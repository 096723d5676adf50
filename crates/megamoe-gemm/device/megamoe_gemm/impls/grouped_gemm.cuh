// FP8 block-scaled grouped GEMM y = x * W^T over experts (SPEC §3 steps 1 and 4), persistent and
// warp-specialised: warpgroups 0 and 1 run the wgmma consumer, warpgroup 2 the TMA producer.
// Instantiated per configuration by a generated translation unit (src/kernel.rs).
#pragma once
#include <megamoe_gemm/impls/grouped_gemm_params.cuh>
#include <megamoe_gemm/ptx/sync.cuh>
#include <megamoe_gemm/ptx/tma.cuh>
#include <megamoe_gemm/layout/smem_layout.cuh>
#include <megamoe_gemm/pipeline/tma_producer.cuh>
#include <megamoe_gemm/mma/fp8_mainloop.cuh>
#include <megamoe_gemm/epilogue/store.cuh>

constexpr int kMathWarps = 8;
constexpr u32 kProducerRegs = 40;
constexpr u32 kConsumerRegs = 232;

template <int BLOCK_M, int BLOCK_N, int kStages, int kGroupSize, bool kMasked, typename Epilogue>
__device__ __forceinline__ void grouped_gemm_fp8(const GroupedGemmParams& p) {
    using Layout = SmemLayout<BLOCK_M, BLOCK_N, kStages, kGroupSize>;
    extern __shared__ u8 smem_raw[];
    // Swizzled tiles need a 1 KiB-aligned base; the launch asks for 1 KiB of slack.
    const Layout smem{smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023)};
    const u32 warp = warp_index_uniform();

    if (threadIdx.x == kMathWarps * 32) {
        tma_prefetch_desc(&p.tma_a);
        tma_prefetch_desc(&p.tma_b);
        tma_prefetch_desc(&p.tma_sa);
        tma_prefetch_desc(&p.tma_d);
    }
    const i32* expert_rows = reinterpret_cast<const i32*>(p.expert_rows);
    for (u32 e = threadIdx.x; e < p.num_experts; e += blockDim.x) smem.rows()[e] = expert_rows[e];
    if (threadIdx.x == 0) {
#pragma unroll
        for (int s = 0; s < kStages; ++s) {
            mbarrier_init(smem.full(s), 1);
            mbarrier_init(smem.empty(s), kMathWarps);
        }
        fence_barrier_init();
    }
    __syncthreads();

    if (warp >= kMathWarps) {
        setmaxnreg_dec<kProducerRegs>();
        if (threadIdx.x == kMathWarps * 32) {
            tma_producer<BLOCK_M, BLOCK_N, kStages, kGroupSize, kMasked>(p, smem);
        }
    } else {
        setmaxnreg_inc<kConsumerRegs>();
        wgmma_consumer<BLOCK_M, BLOCK_N, kStages, kGroupSize, kMasked, Epilogue>(p, smem, warp / 4);
    }
}
