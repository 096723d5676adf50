// The warp roles of the warp-specialised kernels, the grouped GEMM (impls/grouped_gemm.cuh) and
// megamoe-layer's fused kernel alike: warpgroups 0 and 1 are the wgmma consumers (the math
// warps), warpgroup 2 the producer warpgroup, whose first warp runs the TMA producer (the fused
// kernel gives its other warps roles of its own). Their register budgets and every named
// barrier of both kernels. The thread count is the host's (mma/mainloop_params.cuh, generated).
#pragma once
#include <megamoe/common.cuh>
#include <megamoe/ptx/sync.cuh>
#include <megamoe_gemm/mma/mainloop_params.cuh>

namespace megamoe::gemm {

constexpr u32 kMathWarps = 8;              // warps 0-7: the two consumer warpgroups
constexpr u32 kProducerWarp = kMathWarps;  // warp 8, the first of the producer warpgroup
static_assert(kThreads == (kMathWarps + 4) * 32, "two consumer warpgroups and the producer warpgroup");

// Registers per thread by warpgroup (setmaxnreg is warpgroup-wide). The CTA's pool is what the
// launch gave it, kThreads x kLaunchRegs (one CTA per SM: the SM's 64 Ki registers, allocated in
// multiples of 8 per thread): the consumers may only take what the producer warpgroup gives back.
constexpr u32 kLaunchRegs = 65536 / kThreads / 8 * 8;
constexpr u32 kProducerRegs = 40;
constexpr u32 kConsumerRegs = 232;
static_assert(256 * (kConsumerRegs - kLaunchRegs) <= 128 * (kLaunchRegs - kProducerRegs), "the CTA's pool");

// Every named barrier of the kernels. Id 0 is __syncthreads.
enum class NamedBarrier : u32 {
    kBlock = 0,
    // One consumer warpgroup's own 128 threads: staging its weight scales at a tile's start,
    // staging its tile for a TMA store at the end.
    kWarpgroup0 = 1,
    kWarpgroup1 = 2,
    // Both consumer warpgroups (kMathWarps warps): the fused kernel's combine step, after the
    // producer warpgroup is done.
    kConsumers = 3,
};

__device__ __forceinline__ NamedBarrier warpgroup_barrier(u32 wg) {
    return wg == 0 ? NamedBarrier::kWarpgroup0 : NamedBarrier::kWarpgroup1;
}

__device__ __forceinline__ void named_barrier_sync(NamedBarrier id, u32 threads) {
    ptx::named_barrier_sync(static_cast<u32>(id), threads);
}

}  // namespace megamoe::gemm
