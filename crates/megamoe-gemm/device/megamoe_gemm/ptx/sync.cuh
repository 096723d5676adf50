// Warp-specialisation primitives: register reallocation and named barriers.
#pragma once
#include <megamoe_gemm/ptx/types.cuh>

// Every named barrier of the grouped GEMM kernels. Id 0 is __syncthreads.
enum class NamedBarrier : u32 {
    kBlock = 0,
    kEpilogueWg0 = 1,  // consumer warpgroup 0 staging its tile for a TMA store
    kEpilogueWg1 = 2,  // consumer warpgroup 1, likewise
};

__device__ __forceinline__ NamedBarrier epilogue_barrier(u32 wg) {
    return wg == 0 ? NamedBarrier::kEpilogueWg0 : NamedBarrier::kEpilogueWg1;
}

__device__ __forceinline__ void named_barrier_sync(NamedBarrier id, u32 threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(static_cast<u32>(id)), "r"(threads) : "memory");
}

template <u32 kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}

template <u32 kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}

__device__ __forceinline__ u32 warp_index_uniform() {
    // Broadcast from lane 0 so the compiler knows the value is warp-uniform.
    return __shfl_sync(0xffffffffu, threadIdx.x / 32, 0);
}
