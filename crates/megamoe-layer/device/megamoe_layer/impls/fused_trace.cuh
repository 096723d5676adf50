// The fused kernel's optional timeline (the probe instantiation, kProbe = true with
// FusedProbe::trace set: `megamoe bench layer --trace`; the default kernel has none of it): per CTA the times its phases end, per task the
// producer's wait for the block's counter and the consumers' mainloop and epilogue, in globaltimer
// ns: [G] CtaTrace, then [G][task slots per CTA] TaskTrace (impls/fused_params.cuh).
#pragma once
#include <megamoe/common.cuh>
#include <megamoe/ptx/sync.cuh>
#include <megamoe/ptx/timer.cuh>
#include <megamoe_layer/impls/fused_params.cuh>

namespace megamoe::layer {

// Task slots per CTA: twice its even share of the largest call's tasks (CTAs claim their tasks,
// so a faster one runs more; src/fused.rs sizes the timeline alike). Tasks past them go
// unrecorded.
__device__ __forceinline__ u32 trace_tasks_per_cta(const FusedRegions& r) {
    return 2 * ((u32(r.max_blocks) * u32(r.n1 + r.n2) + gridDim.x - 1) / gridDim.x);
}

__device__ __forceinline__ CtaTrace* cta_trace(u64 trace) {
    return reinterpret_cast<CtaTrace*>(trace) + ptx::ctaid_x();
}

// This CTA's j-th task, or null past its slots.
__device__ __forceinline__ TaskTrace* task_trace(const FusedRegions& r, u64 trace, u32 j) {
    TaskTrace* tasks = reinterpret_cast<TaskTrace*>(reinterpret_cast<CtaTrace*>(trace) + gridDim.x);
    const u32 slots = trace_tasks_per_cta(r);
    return j < slots ? tasks + ptx::ctaid_x() * slots + j : nullptr;
}

}  // namespace megamoe::layer
