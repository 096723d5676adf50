// Kernels that check the launch path: more than 48 KB of dynamic shared memory, cluster
// dimensions, programmatic dependent launch, and a TMA tile load through a host-encoded
// tensor map with a deadline on its mbarrier.
#pragma once
#include <megamoe/impls/params.cuh>
#include <megamoe/comm/deadline.cuh>
#include <megamoe/ptx/mbarrier.cuh>
#include <megamoe/ptx/sync.cuh>
#include <megamoe/ptx/tma.cuh>

namespace megamoe::impls {

__device__ __forceinline__ void launch_check(const LaunchCheckParams& p) {
    extern __shared__ u32 words[];
    ptx::grid_dependency_wait();
    for (u32 i = threadIdx.x; i < p.smem_words; i += blockDim.x) words[i] = i * 3 + blockIdx.x;
    __syncthreads();
    if (threadIdx.x == 0) {
        u32* out = reinterpret_cast<u32*>(p.out) + blockIdx.x * 3;
        out[0] = words[p.smem_words - 1];
        out[1] = ptx::cluster_cta_rank();
        out[2] = ptx::cluster_cta_count();
    }
}

// One block loads a kTileRows x kTileCols u32 tile at (x, y) with TMA and writes it out
// (the tile: impls/params.cuh).
__device__ __forceinline__ void tma_check(const TmaCheckParams& p) {
    __shared__ alignas(128) u32 tile[kTileRows * kTileCols];
    __shared__ alignas(8) u64 bar;
    if (threadIdx.x == 0) {
        ptx::mbarrier_init(&bar, 1);
        ptx::fence_barrier_init();
        ptx::mbarrier_arrive_expect_tx(&bar, sizeof(tile));
        ptx::tma_load_2d(tile, &p.map, &bar, p.x, p.y, ptx::CacheHint::kEvictNormal);
    }
    __syncthreads();
    const comm::Deadline deadline = comm::Deadline::after(p.timeout_ns);
    while (!ptx::mbarrier_try_wait_parity(&bar, 0)) {
        if (deadline.expired()) {
            comm::report_timeout(reinterpret_cast<comm::WaitRecord*>(p.record), comm::Wait::TmaLoad, 0, 0, 0,
                                 sizeof(tile));
            return;
        }
    }
    for (u32 i = threadIdx.x; i < kTileRows * kTileCols; i += blockDim.x) {
        reinterpret_cast<u32*>(p.out)[i] = tile[i];
    }
}

}  // namespace megamoe::impls
