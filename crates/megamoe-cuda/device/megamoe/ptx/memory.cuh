// Thin wrappers over memory PTX: shared-memory addresses and matrix stores, streaming 16-byte
// global loads, and system-scope acquire/release accesses used for flags that peers read over
// NVLink.
#pragma once
#include <megamoe/common.cuh>

namespace megamoe::ptx {

// The 32-bit shared-window address of a pointer into shared memory (what PTX's .shared operands
// and descriptors take).
__device__ __forceinline__ u32 smem_addr(const void* p) { return static_cast<u32>(__cvta_generic_to_shared(p)); }

// A 32-bit load from a shared-window address (ordered after the waits before it).
__device__ __forceinline__ float ld_shared_f32(u32 addr) {
    float v;
    asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(addr));
    return v;
}

// `v` as a value the compiler cannot recompute: it then keeps it in a register instead of
// rebuilding it from the thread index wherever it is used (in a hot loop, that costs more).
__device__ __forceinline__ u32 opaque(u32 v) {
    asm volatile("" : "+r"(v));
    return v;
}

// Four 8x8 b16 matrices from registers (one b32 per matrix per thread, the mma fragment
// layout) to shared memory; lanes 8i..8i+7 give the row addresses of matrix i.
__device__ __forceinline__ void stmatrix_x4(void* dst, u32 r0, u32 r1, u32 r2, u32 r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(smem_addr(dst)), "r"(r0),
                 "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}

// 16-byte load through the non-coherent path, not kept in L1 (data read once), fetching whole
// 256-byte L2 lines from DRAM (the streaming pattern HBM serves best).
__device__ __forceinline__ uint4 ld_stream_v4(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// 16-byte load through the non-coherent path, not kept in L1, without the L2 prefetch hint
// (for peer memory, where whole-line prefetches would cross NVLink).
__device__ __forceinline__ uint4 ld_nc_v4(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ void st_v4(void* p, uint4 v) {
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}

__device__ __forceinline__ void st_v2(void* p, uint2 v) {
    asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(v.x), "r"(v.y) : "memory");
}

__device__ __forceinline__ u64 ld_acquire_sys(const u64* p) {
    u64 v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

// A flag read with no ordering of its own: several can be in flight at once; a reader that acts
// on what it saw follows them with fence_acq_rel_sys (together, an acquire).
__device__ __forceinline__ u64 ld_relaxed_sys(const u64* p) {
    u64 v;
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }

__device__ __forceinline__ void st_release_sys(u64* p, u64 v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Adds to a counter that peers wait on, releasing this thread's earlier writes to them.
__device__ __forceinline__ void red_release_sys_add(u64* p, u64 v) {
    asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ u32 atomic_cas_u32(u32* p, u32 expected, u32 desired) {
    u32 old;
    asm volatile("atom.cas.relaxed.gpu.global.b32 %0, [%1], %2, %3;"
                 : "=r"(old)
                 : "l"(p), "r"(expected), "r"(desired)
                 : "memory");
    return old;
}

// Flags between the CTAs of one GPU (a kernel's own producer/consumer counters).
__device__ __forceinline__ u32 ld_acquire_gpu_u32(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void red_release_gpu_add_u32(u32* p, u32 v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Adds to a counter and returns its value before: acquires the adds before it, releases this
// thread's (and what it acquired) to the adds after it.
__device__ __forceinline__ u32 atomic_add_acq_rel_gpu_u32(u32* p, u32 v) {
    u32 old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

// Brings the line holding `p` into L1 ahead of a load that will need it.
__device__ __forceinline__ void prefetch_l1(const void* p) { asm volatile("prefetch.global.L1 [%0];" ::"l"(p)); }

// A counter in shared memory handed between warps of one CTA.
__device__ __forceinline__ void red_release_cta_shared_add_u32(u32* p, u32 v) {
    asm volatile("red.release.cta.shared::cta.add.u32 [%0], %1;" ::"r"(smem_addr(p)), "r"(v) : "memory");
}

__device__ __forceinline__ u32 ld_acquire_cta_shared_u32(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.cta.shared::cta.u32 %0, [%1];" : "=r"(v) : "r"(smem_addr(p)) : "memory");
    return v;
}

__device__ __forceinline__ u64 ld_acquire_gpu_u64(const u64* p) {
    u64 v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

// Orders this thread's generic-proxy global accesses with its async-proxy (TMA) ones: a writer
// runs it after rows another CTA's TMA will load, a reader after acquiring the flag and before
// issuing the load.
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }

}  // namespace megamoe::ptx
