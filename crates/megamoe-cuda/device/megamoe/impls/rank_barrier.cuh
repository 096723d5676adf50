// A kernel that is only a rank barrier: used to test barriers and deadlines across ranks.
#pragma once
#include <megamoe/impls/params.cuh>
#include <megamoe/comm/barrier.cuh>

namespace megamoe::impls {

__device__ __forceinline__ void rank_barrier(const RankBarrierParams& p) {
    if (threadIdx.x < 32) {
        comm::rank_barrier_warp(reinterpret_cast<const u64*>(p.peer_signals), p.rank, p.world, p.epoch, p.timeout_ns,
                                reinterpret_cast<comm::WaitRecord*>(p.record));
    }
}

}  // namespace megamoe::impls
