// A barrier across ranks over symmetric memory, with a deadline.
//
// Each rank owns `world` u64 signal slots in its symmetric buffer; `peer_signals[i]` is the
// address of rank i's slots (the peer pointer table). To arrive at barrier `epoch` (1, 2, ...),
// rank r writes `epoch` into slot r of every rank with a system-scope release; it then waits
// until every slot of its own reaches `epoch` with acquire loads. Epochs only grow, so slots
// are never reset.
#pragma once
#include <megamoe/comm/deadline.cuh>

namespace megamoe::comm {

// Called by one full warp. Returns true when every rank arrived, false when the deadline passed
// (recorded in `rec`, naming the first rank this lane found missing).
__device__ __forceinline__ bool rank_barrier_warp(const u64* peer_signals, u32 rank, u32 world, u64 epoch,
                                                  u64 timeout_ns, WaitRecord* rec) {
    const u32 lane = lane_id();
    for (u32 i = lane; i < world; i += 32) {
        ptx::st_release_sys(reinterpret_cast<u64*>(peer_signals[i]) + rank, epoch);
    }
    const u64* mine = reinterpret_cast<const u64*>(peer_signals[rank]);
    const Deadline deadline = Deadline::after(timeout_ns);
    bool ok = true;
    for (u32 i = lane; i < world && ok; i += 32) {
        u64 seen;
        while ((seen = ptx::ld_acquire_sys(mine + i)) < epoch) {
            if (deadline.expired()) {
                report_timeout(rec, Wait::RankBarrier, rank, i, seen, epoch);
                ok = false;
                break;
            }
            ptx::nanosleep(100);
        }
    }
    return __all_sync(0xffffffffu, ok);
}

}  // namespace megamoe::comm
