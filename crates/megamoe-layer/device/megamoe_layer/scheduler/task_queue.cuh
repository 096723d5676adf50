// The producer's hand-over of this CTA's tasks to its consumer warps, through a ring of slots in
// shared memory.
//
// Resolving a task of the stream takes dependent global loads: the cursor's segments
// (TaskCursor), then the m-block's row (BlockInfo). The consumers cannot issue them early,
// because they broadcast the indices (ptx::warp_uniform) and so wait for the loads at once;
// between two tasks every consumer warp, and with them the tensor cores, waited for them. The
// producer resolves each task anyway to load its tiles, ahead of the consumers by the ring of
// stages: it writes the task here, and a consumer reads it from shared memory.
#pragma once
#include <megamoe/common.cuh>
#include <megamoe/ptx/mbarrier.cuh>
#include <megamoe/ptx/sync.cuh>
#include <megamoe_gemm/pipeline/barriers.cuh>
#include <megamoe_gemm/scheduler/tile.cuh>
#include <megamoe_layer/comm/flags.cuh>
#include <megamoe_layer/impls/fused_params.cuh>

namespace megamoe::layer {

// A task as the consumers run it: its index in the stream, kind, m-block and n-block, and its
// tile. The producer ends a CTA's tasks with `index` kNoTask.
constexpr u32 kNoTask = 0xffffffffu;
struct TaskDesc {
    u32 index, kind, block, n;
    gemm::Tile tile;
};

// Slot j % kSlots holds this CTA's j-th task. `full` completes a phase when the producer wrote
// the slot, `empty` when every reader took it: each consumer warp and the releaser lane (one
// arrival each). The waits are bounded by the call's deadline: the producer stops early when a
// block's counter never comes.
template <u32 kSlots>
struct TaskQueue {
    TaskDesc slot[kSlots];
    alignas(8) u64 full[kSlots];
    alignas(8) u64 empty[kSlots];

    // One thread, before the CTA's first barrier (with ptx::fence_barrier_init).
    __device__ __forceinline__ void init(u32 readers) {
#pragma unroll
        for (u32 s = 0; s < kSlots; ++s) {
            ptx::mbarrier_init(&full[s], 1);
            ptx::mbarrier_init(&empty[s], readers);
        }
    }

    // The producer lane: task j into its slot, once the consumers read the slot's last task.
    __device__ __forceinline__ void push(const FusedRegions& r, u32 j, const TaskDesc& d) {
        const u32 s = j % kSlots;
        gemm::mbarrier_wait(&empty[s], ((j / kSlots) & 1) ^ 1, reinterpret_cast<comm::WaitRecord*>(r.wait_record),
                            r.deadline_ns, kWaitTaskSlot);
        slot[s] = d;
        ptx::mbarrier_arrive(&full[s]);
    }

    // A consumer warp (all lanes): task j, its kind, block and n-block warp-uniform.
    __device__ __forceinline__ TaskDesc pop(const FusedRegions& r, u32 j) {
        const u32 s = j % kSlots;
        gemm::mbarrier_wait_warp(&full[s], (j / kSlots) & 1, reinterpret_cast<comm::WaitRecord*>(r.wait_record),
                                 r.deadline_ns, kWaitTaskReady, [] {});
        TaskDesc d = slot[s];
        d.index = ptx::warp_uniform(d.index);
        d.kind = ptx::warp_uniform(d.kind);
        d.block = ptx::warp_uniform(d.block);
        d.n = ptx::warp_uniform(d.n);
        __syncwarp();
        if (threadIdx.x % 32 == 0) ptx::mbarrier_arrive(&empty[s]);
        return d;
    }

    // The releaser's lane: task j.
    __device__ __forceinline__ TaskDesc pop_lane(const FusedRegions& r, u32 j) {
        const u32 s = j % kSlots;
        gemm::mbarrier_wait(&full[s], (j / kSlots) & 1, reinterpret_cast<comm::WaitRecord*>(r.wait_record),
                            r.deadline_ns, kWaitTaskReady);
        const TaskDesc d = slot[s];
        ptx::mbarrier_arrive(&empty[s]);
        return d;
    }
};

}  // namespace megamoe::layer
