// The grouped GEMM's barriers: the deadline-bounded wait on a ring stage's mbarrier, and every
// named barrier of the kernel. A wait that expires records which barrier it was in the kernel's
// megamoe::comm::WaitRecord and ends the thread instead of hanging.
#pragma once
#include <megamoe/comm/deadline.cuh>
#include <megamoe/common.cuh>
#include <megamoe/ptx/mbarrier.cuh>
#include <megamoe/ptx/sync.cuh>
#include <megamoe/ptx/timer.cuh>

namespace megamoe::gemm {

// The kernel's waits, in this crate's range of wait ids (named by `megamoe_gemm::grouped::WAITS`).
enum WaitId : u32 {
    kWaitFull = 0x100,   // consumer waiting for a stage's TMA data
    kWaitEmpty = 0x101,  // producer waiting for consumers to release a stage
};

// An mbarrier has no count to report: the record names the wait, its values stay 0 (one rank).
// `id` is a WaitId here; kernels built on these waits pass their own ids.
__device__ __forceinline__ void report_expired(comm::WaitRecord* record, u32 id) {
    comm::report_timeout(record, id, 0, 0, 0, 0);
}

// Waits for the phase of `parity` to complete; on deadline records `id` and exits the thread.
__device__ __forceinline__ void mbarrier_wait(u64* bar, u32 parity, comm::WaitRecord* record,
                                              u64 timeout_ns, u32 id) {
    if (ptx::mbarrier_try_wait_parity(bar, parity)) return;
    const u64 start = ptx::globaltimer_ns();
    while (!ptx::mbarrier_try_wait_parity(bar, parity)) {
        if (ptx::globaltimer_ns() - start > timeout_ns) {
            report_expired(record, id);
            asm volatile("exit;");
        }
    }
}

// The same wait decided per warp (votes), for a warp that does warpgroup-collective work after
// it: the whole warp leaves together, and on expiry runs on_expiry() (converged) before it exits.
template <typename OnExpiry>
__device__ __forceinline__ void mbarrier_wait_warp(u64* bar, u32 parity, comm::WaitRecord* record,
                                                   u64 timeout_ns, u32 id, OnExpiry on_expiry) {
    if (__all_sync(~0u, ptx::mbarrier_try_wait_parity(bar, parity))) return;
    const u64 start = ptx::globaltimer_ns();
    while (!__all_sync(~0u, ptx::mbarrier_try_wait_parity(bar, parity))) {
        if (__any_sync(~0u, ptx::globaltimer_ns() - start > timeout_ns)) {
            report_expired(record, id);
            on_expiry();
            asm volatile("exit;");
        }
    }
}

// Every named barrier of the grouped GEMM kernels. Id 0 is __syncthreads.
enum class NamedBarrier : u32 {
    kBlock = 0,
    // One consumer warpgroup's own 128 threads: staging its weight scales at a tile's start,
    // staging its tile for a TMA store at the end.
    kWarpgroup0 = 1,
    kWarpgroup1 = 2,
};

__device__ __forceinline__ NamedBarrier warpgroup_barrier(u32 wg) {
    return wg == 0 ? NamedBarrier::kWarpgroup0 : NamedBarrier::kWarpgroup1;
}

__device__ __forceinline__ void named_barrier_sync(NamedBarrier id, u32 threads) {
    ptx::named_barrier_sync(static_cast<u32>(id), threads);
}

}  // namespace megamoe::gemm
