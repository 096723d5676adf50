// The grouped GEMM's barriers: the deadline-bounded wait on a ring stage's mbarrier, and the
// named barriers (pipeline/roles.cuh). A wait that expires records which barrier it was in the
// kernel's megamoe::comm::WaitRecord and ends the thread instead of hanging.
#pragma once
#include <megamoe/comm/deadline.cuh>
#include <megamoe/common.cuh>
#include <megamoe/ptx/mbarrier.cuh>
#include <megamoe/ptx/sync.cuh>
#include <megamoe/ptx/timer.cuh>
#include <megamoe_gemm/pipeline/roles.cuh>

namespace megamoe::gemm {

// An mbarrier has no count to report: the record names the wait, its values stay 0 (one rank).
// `id` is a WaitId here (mma/mainloop_params.cuh); kernels built on these waits pass their own ids.
__device__ __forceinline__ void report_expired(comm::WaitRecord* record, u32 id) {
    comm::report_timeout(record, id, 0, 0, 0, 0);
}

// Waits for the phase of `parity` to complete; on deadline records `id` and exits the thread.
__device__ __forceinline__ void mbarrier_wait(u64* bar, u32 parity, comm::WaitRecord* record, u64 timeout_ns, u32 id) {
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
__device__ __forceinline__ void mbarrier_wait_warp(u64* bar, u32 parity, comm::WaitRecord* record, u64 timeout_ns,
                                                   u32 id, OnExpiry on_expiry) {
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

}  // namespace megamoe::gemm
