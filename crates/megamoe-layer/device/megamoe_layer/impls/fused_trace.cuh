// The fused kernel's optional timeline (the probe instantiation, kProbe = true with
// FusedProbe::trace set: `megamoe bench layer --trace`; the default kernel has none of it): per CTA the times its phases end, per task the
// producer's wait for the block's counter and the consumers' mainloop and epilogue, in globaltimer
// ns: [G] CtaTrace, then [G][tasks per CTA] TaskTrace (impls/fused_params.cuh).
#pragma once
#include <megamoe/common.cuh>
#include <megamoe/ptx/sync.cuh>
#include <megamoe/ptx/timer.cuh>
#include <megamoe_layer/impls/fused_params.cuh>

namespace megamoe::layer {

// Task slots per CTA: every task of the largest call, spread over the grid.
__device__ __forceinline__ u32 trace_tasks_per_cta(const FusedRegions& r) {
    return (u32(r.max_blocks) * u32(r.n1 + r.n2) + gridDim.x - 1) / gridDim.x;
}

__device__ __forceinline__ CtaTrace* cta_trace(u64 trace) {
    return reinterpret_cast<CtaTrace*>(trace) + ptx::ctaid_x();
}

// Task i of the stream, which this CTA runs as its (i - blockIdx.x) / G-th.
__device__ __forceinline__ TaskTrace* task_trace(const FusedRegions& r, u64 trace, u32 i) {
    TaskTrace* tasks = reinterpret_cast<TaskTrace*>(reinterpret_cast<CtaTrace*>(trace) + gridDim.x);
    return tasks + ptx::ctaid_x() * trace_tasks_per_cta(r) + (i - ptx::ctaid_x()) / gridDim.x;
}

}  // namespace megamoe::layer
