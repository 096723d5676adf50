// Bulk tensor copies (TMA), global -> shared, completing on an mbarrier.
#pragma once
#include "ptx/types.cuh"
#include "ptx/mbarrier.cuh"

__device__ __forceinline__ void tma_prefetch_desc(const TmaDesc* desc) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<u64>(desc)) : "memory");
}

// L2 cache policies for cp.async.bulk.tensor's .L2::cache_hint operand.
enum class CacheHint : u64 {
    kEvictNormal = 0x1000000000000000ull,
    kEvictFirst = 0x12F0000000000000ull,
    kEvictLast = 0x14F0000000000000ull,
};

__device__ __forceinline__ void tma_load_2d(void* dst, const TmaDesc* desc, u64* bar, i32 x, i32 y,
                                            CacheHint hint) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(smem_addr(dst)),
        "l"(reinterpret_cast<u64>(desc)), "r"(smem_addr(bar)), "r"(x), "r"(y),
        "l"(static_cast<u64>(hint))
        : "memory");
}
