// Bulk tensor copies (TMA): loads completing on an mbarrier (optionally multicast into every CTA
// of a cluster), stores tracked by the issuing thread's bulk groups, and plain bulk stores.
#pragma once
#include <megamoe/common.cuh>
#include <megamoe/ptx/memory.cuh>

namespace megamoe::ptx {

// A CUtensorMap as encoded on the host (`megamoe_cuda::TensorMap`), passed inside the params.
struct alignas(64) TensorMap {
    u64 words[16];
};
static_assert(sizeof(TensorMap) == 128, "CUtensorMap is 128 bytes");

__device__ __forceinline__ void tma_prefetch_desc(const TensorMap* map) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<u64>(map)) : "memory");
}

// L2 cache policies for cp.async.bulk.tensor's .L2::cache_hint operand.
enum class CacheHint : u64 {
    kEvictNormal = 0x1000000000000000ull,
    kEvictFirst = 0x12F0000000000000ull,
    kEvictLast = 0x14F0000000000000ull,
};

__device__ __forceinline__ void tma_load_2d(void* smem_dst, const TensorMap* map, u64* bar, i32 x, i32 y,
                                            CacheHint hint) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(smem_addr(smem_dst)),
        "l"(reinterpret_cast<u64>(map)), "r"(smem_addr(bar)), "r"(x), "r"(y), "l"(static_cast<u64>(hint))
        : "memory");
}

// The same box into the same shared-memory offset of every cluster CTA in `cta_mask`, each
// copy completing on the barrier at `bar`'s offset in its CTA.
__device__ __forceinline__ void tma_load_2d_multicast(void* smem_dst, const TensorMap* map, u64* bar, i32 x, i32 y,
                                                      u16 cta_mask, CacheHint hint) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::"
        "cluster.L2::cache_hint [%0], [%1, {%3, %4}], [%2], %5, %6;" ::"r"(smem_addr(smem_dst)),
        "l"(reinterpret_cast<u64>(map)), "r"(smem_addr(bar)), "r"(x), "r"(y), "h"(cta_mask), "l"(static_cast<u64>(hint))
        : "memory");
}

// Shared -> global; the source must be made visible to the async proxy first
// (fence_proxy_async_shared in every writing thread, then a barrier).
__device__ __forceinline__ void tma_store_2d(const TensorMap* map, const void* smem_src, i32 x, i32 y) {
    asm volatile(
        "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(reinterpret_cast<u64>(map)),
        "r"(smem_addr(smem_src)), "r"(x), "r"(y)
        : "memory");
}

// Orders this thread's earlier generic-proxy writes to shared memory before later bulk copies
// (async proxy) read it; every writing thread fences, then a barrier, then the copy is issued.
__device__ __forceinline__ void fence_proxy_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from shared to global memory
// without passing through registers; part of this thread's next committed bulk group.
__device__ __forceinline__ void bulk_store(void* gmem_dst, const void* smem_src, u32 bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(gmem_dst),
                 "r"(smem_addr(smem_src)), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }

// Waits until at most `Pending` of this thread's committed bulk groups still read their shared
// memory source (the source may then be rewritten).
template <int Pending>
__device__ __forceinline__ void bulk_wait_group_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(Pending) : "memory");
}

// Waits until every committed bulk group of this thread has completed its writes.
__device__ __forceinline__ void bulk_wait_group_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

}  // namespace megamoe::ptx
