// The global nanosecond timer, the clock of every device-side deadline.
#pragma once
#include <megamoe/common.cuh>

namespace megamoe::ptx {

__device__ __forceinline__ u64 globaltimer_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ void nanosleep(u32 ns) { asm volatile("nanosleep.u32 %0;" ::"r"(ns)); }

}  // namespace megamoe::ptx
