// Warp specialisation and cluster primitives: register reallocation, named barriers, the
// cluster's coordinates and its all-threads barrier.
#pragma once
#include <megamoe/common.cuh>

namespace megamoe::ptx {

// Barrier `id` (0 is __syncthreads) over `threads` threads; each kernel names its ids in one enum.
__device__ __forceinline__ void named_barrier_sync(u32 id, u32 threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

template <u32 kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}

template <u32 kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}

// Lane 0's value, which the compiler then knows is warp-uniform (all 32 lanes must call it):
// values derived from it stay in uniform registers, and branches on it do not diverge.
__device__ __forceinline__ u32 warp_uniform(u32 v) { return __shfl_sync(0xffffffffu, v, 0); }

__device__ __forceinline__ u32 warp_index_uniform() { return warp_uniform(threadIdx.x / 32); }

// This CTA's rank in its cluster, the number of CTAs in it, the cluster's index and the number
// of clusters (x only).
__device__ __forceinline__ u32 cluster_cta_rank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

__device__ __forceinline__ u32 cluster_cta_count() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
    return r;
}

__device__ __forceinline__ u32 cluster_index() {
    u32 r;
    asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(r));
    return r;
}

__device__ __forceinline__ u32 cluster_count() {
    u32 r;
    asm volatile("mov.u32 %0, %%nclusterid.x;" : "=r"(r));
    return r;
}

// Every thread of every CTA of the cluster: barrier initialisation before a peer may signal
// it, and no CTA leaving while a peer may still write its shared memory or arrive on it.
__device__ __forceinline__ void cluster_sync() {
    asm volatile(
        "barrier.cluster.arrive.release;\n"
        "barrier.cluster.wait.acquire;" ::
            : "memory");
}

// blockIdx.x read afresh: ptxas may keep a value computed before a role's setmaxnreg live
// across the role (spilling it where registers are few); a volatile read is never reused.
__device__ __forceinline__ u32 ctaid_x() {
    u32 v;
    asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(v));
    return v;
}

// Programmatic dependent launch: waits until the kernels this launch depends on have completed
// and their writes are visible; without the launch attribute it returns at once. Nothing in
// global memory may be read or written before it.
__device__ __forceinline__ void grid_dependency_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// Lets the next kernel on the stream, if it was launched as a programmatic dependent, be
// scheduled once every CTA of this grid has issued this or exited (its own wait still waits for
// this grid to complete).
__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

}  // namespace megamoe::ptx
