// mbarrier wrappers (PTX ISA 9.7.13.15). Waits carry a deadline: a wait that expires records
// which barrier it was in the kernel's error word and ends the thread instead of hanging.
#pragma once
#include <megamoe_gemm/ptx/types.cuh>

__device__ __forceinline__ u32 smem_addr(const void* p) {
    return static_cast<u32>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ u64 global_timer_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ void mbarrier_init(u64* bar, u32 arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(arrivals));
}

// Makes barrier initialisation visible to the async proxy (TMA) before first use.
__device__ __forceinline__ void fence_barrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void mbarrier_arrive(u64* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ void mbarrier_arrive_expect_tx(u64* bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
                 "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ bool mbarrier_try_wait(u64* bar, u32 parity) {
    u32 done;
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
    return done != 0;
}

// Error word layout: bit 31 set = a wait expired; bits 0..15 = the wait's id (WaitId).
enum WaitId : u32 {
    kWaitFull = 1,   // consumer waiting for a stage's TMA data
    kWaitEmpty = 2,  // producer waiting for consumers to release a stage
};

// Waits for the phase of `parity` to complete; on deadline records `id` and exits the thread.
__device__ __forceinline__ void mbarrier_wait(u64* bar, u32 parity, u32* error, u64 timeout_ns,
                                              WaitId id) {
    if (mbarrier_try_wait(bar, parity)) return;
    const u64 start = global_timer_ns();
    while (!mbarrier_try_wait(bar, parity)) {
        if (global_timer_ns() - start > timeout_ns) {
            atomicCAS(error, 0u, 0x80000000u | static_cast<u32>(id));
            asm volatile("exit;");
        }
    }
}
