// The fused kernel's waits between CTAs of one rank: per-m-block counters (rows pulled, L1 and
// L2 warpgroup-tasks done) and the grid barrier after the call's plan is built. Every wait has
// the call's deadline; one that expires is recorded in the rank's WaitRecord (wait id, rank,
// the block or barrier, the value seen and expected) and returns false. The wait ids: FusedWait
// (impls/fused_params.cuh).
#pragma once
#include <megamoe/comm/deadline.cuh>
#include <megamoe/ptx/memory.cuh>
#include <megamoe_ep/params.cuh>
#include <megamoe_layer/impls/fused_params.cuh>

namespace megamoe::layer {

// Signal kinds of the fused kernel (ep::comm::Signals counters): a rank's routing is published;
// a rank has written every L2 row it owes the others.
enum FusedSignal : int { kRoutingReady = 0, kRowsWritten = 1 };
static_assert(kRowsWritten < ep::kNumSignals, "a counter of the buffer's signal region");
// Its call counter (the epochs region's first word).
constexpr int kFusedFamily = 0;

__device__ __forceinline__ BlockFlags* block_flags(const FusedRegions& r) {
    return reinterpret_cast<BlockFlags*>(reinterpret_cast<char*>(r.peer_base[r.rank]) + r.off_block_flags);
}

__device__ __forceinline__ ExpertL2* expert_l2(const FusedRegions& r) {
    return reinterpret_cast<ExpertL2*>(reinterpret_cast<char*>(r.peer_base[r.rank]) + r.off_expert_l2);
}

// Rank `rank`'s copy of the expert flags: flag e holds the call (epoch) in which expert e's rank
// finished its L2 rows, so every row of e in that call is in place (written by e's rank, never
// reset: a later call only raises it).
__device__ __forceinline__ u64* expert_done(const FusedRegions& r, int rank) {
    return reinterpret_cast<u64*>(reinterpret_cast<char*>(r.peer_base[rank]) + r.off_expert_done);
}

// Polls until *flag >= target (acquire), then orders the caller's later TMA loads after it.
// Between polls the thread sleeps, 32 ns doubling to 1 µs: the pull warps wait on the ring most
// of a long call, and a tight poll would take issue slots from the math warps of its SM.
__device__ __forceinline__ bool wait_flag(const FusedRegions& r, const u32* flag, u32 target, FusedWait id, u32 block) {
    u32 v = ptx::ld_acquire_gpu_u32(flag);
    if (v < target) {
        const auto deadline = comm::Deadline::after(r.deadline_ns);
        u32 sleep_ns = 32;
        while ((v = ptx::ld_acquire_gpu_u32(flag)) < target) {
            __nanosleep(sleep_ns);
            sleep_ns = min(2 * sleep_ns, 1024u);
            if (deadline.expired()) {
                comm::report_timeout(reinterpret_cast<comm::WaitRecord*>(r.wait_record), id, r.rank, block, v, target);
                return false;
            }
        }
    }
    ptx::fence_proxy_async_global();
    return true;
}

// The releaser's wait for a warpgroup's slice counter in shared memory (acquire) to reach
// `target`; `block` names the task's m-block in the record. Short sleeps: the consumers finish a
// slice every few microseconds, and this warp shares its scheduler with two of theirs.
__device__ __forceinline__ bool wait_slices(const FusedRegions& r, const u32* counter, u32 target, u32 block) {
    u32 v = ptx::ld_acquire_cta_shared_u32(counter);
    if (v >= target) return true;
    const auto deadline = comm::Deadline::after(r.deadline_ns);
    while ((v = ptx::ld_acquire_cta_shared_u32(counter)) < target) {
        __nanosleep(64);
        if (deadline.expired()) {
            comm::report_timeout(reinterpret_cast<comm::WaitRecord*>(r.wait_record), kWaitSlicesDone, r.rank, block, v,
                                 target);
            return false;
        }
    }
    return true;
}

// Raises a block counter once this warpgroup's (or warp's) writes are done: the caller has
// synchronized the writers, each of which fenced its generic writes for the async proxy.
__device__ __forceinline__ void raise_flag(u32* flag) {
    __threadfence();
    ptx::red_release_gpu_add_u32(flag, 1);
}

// Barrier over the CTAs of this rank's grid; the counter only grows (call c waits for c · G
// arrivals), so it is never reset. False when the deadline passed.
__device__ __forceinline__ bool grid_barrier(const FusedRegions& r, u64 epoch, int* s_ok) {
    __syncthreads();
    if (threadIdx.x == 0) {
        u64* counter = reinterpret_cast<u64*>(reinterpret_cast<char*>(r.peer_base[r.rank]) + r.off_grid_barrier);
        __threadfence();
        atomicAdd(counter, 1ull);
        const u64 target = epoch * gridDim.x;
        const auto deadline = comm::Deadline::after(r.deadline_ns);
        u64 v;
        *s_ok = 1;
        while ((v = ptx::ld_acquire_gpu_u64(counter)) < target) {
            if (deadline.expired()) {
                comm::report_timeout(reinterpret_cast<comm::WaitRecord*>(r.wait_record), kWaitGrid, r.rank, blockIdx.x,
                                     v, target);
                *s_ok = 0;
                break;
            }
        }
    }
    __syncthreads();
    return *s_ok != 0;
}

}  // namespace megamoe::layer
