// Warp-specialisation primitives: register reallocation and named barriers.
#pragma once
#include "ptx/types.cuh"

// Every named barrier of the grouped GEMM kernels. Id 0 is __syncthreads.
enum class NamedBarrier : u32 {
    kBlock = 0,
};

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
