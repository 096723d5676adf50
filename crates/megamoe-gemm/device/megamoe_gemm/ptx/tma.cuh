// Bulk tensor copies (TMA): loads completing on an mbarrier, stores tracked by bulk groups.
#pragma once
#include <megamoe_gemm/ptx/types.cuh>
#include <megamoe_gemm/ptx/mbarrier.cuh>

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

// Shared -> global; the source must be made visible to the async proxy first
// (fence_proxy_async_shared in every writing thread, then a barrier).
__device__ __forceinline__ void tma_store_2d(const TmaDesc* desc, const void* src, i32 x, i32 y) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
                     reinterpret_cast<u64>(desc)),
                 "r"(smem_addr(src)), "r"(x), "r"(y)
                 : "memory");
}

__device__ __forceinline__ void bulk_commit_group() {
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Waits until the committed stores have read their shared-memory sources.
__device__ __forceinline__ void bulk_wait_group_read_all() {
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}

// Waits until the committed stores are complete.
__device__ __forceinline__ void bulk_wait_group_all() {
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

__device__ __forceinline__ void fence_proxy_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Four 8x8 b16 matrices from registers (one b32 per matrix per thread, the mma fragment
// layout) to shared memory; lanes 8i..8i+7 give the row addresses of matrix i.
__device__ __forceinline__ void stmatrix_x4(void* dst, u32 r0, u32 r1, u32 r2, u32 r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(
                     smem_addr(dst)),
                 "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}
