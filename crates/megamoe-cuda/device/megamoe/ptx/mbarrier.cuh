// mbarrier operations (PTX ISA 9.7.13.15): initialisation, arrivals (local and on a cluster
// peer's barrier) and the non-blocking parity test every deadline-bounded wait is built on.
#pragma once
#include <megamoe/ptx/memory.cuh>

namespace megamoe::ptx {

__device__ __forceinline__ void mbarrier_init(u64* bar, u32 arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(arrivals));
}

// Makes barrier initialisation visible to the async proxy (TMA) and to cluster peers; once after
// every barrier of the block is initialised, before a barrier is synchronised on.
__device__ __forceinline__ void fence_barrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void mbarrier_arrive(u64* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// Arrives only where `pred` holds, as a predicated instruction rather than a branch (a branch
// around it would make ptxas wait for in-flight wgmmas first, warning C7518).
__device__ __forceinline__ void mbarrier_arrive_if(u64* bar, bool pred) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %1, 0;\n@p mbarrier.arrive.shared::cta.b64 _, [%0];\n}" ::"r"(smem_addr(bar)),
        "r"(static_cast<u32>(pred))
        : "memory");
}

// Arrives on the barrier at the same shared-memory offset in cluster CTA `cta` (which may be
// this one). Default (CTA-scope) release semantics: `.release.cluster` compiles to a GPU-wide
// memory barrier (MEMBAR.ALL.GPU) before every arrive, which a pipeline stage release does not
// need (the wgmma reads it orders have completed at wgmma.wait_group) and which made the
// clustered GEMM 1.4-1.5x slower than single CTAs.
__device__ __forceinline__ void mbarrier_arrive_cluster(u64* bar, u32 cta) {
    asm volatile(
        "{\n"
        ".reg .b32 remote;\n"
        "mapa.shared::cluster.u32 remote, %0, %1;\n"
        "mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
        "}\n" ::"r"(smem_addr(bar)),
        "r"(cta)
        : "memory");
}

__device__ __forceinline__ void mbarrier_arrive_expect_tx(u64* bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}

__device__ __forceinline__ bool mbarrier_try_wait_parity(u64* bar, u32 parity) {
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

}  // namespace megamoe::ptx
