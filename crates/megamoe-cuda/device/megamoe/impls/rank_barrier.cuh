// A kernel that is only a rank barrier: used to test barriers and deadlines across ranks.
#pragma once
#include <megamoe/comm/barrier.cuh>

namespace megamoe::impls {

struct RankBarrierParams {
  u64 peer_signals;  // device address of the peer pointer table (world u64 addresses)
  u64 record;        // WaitRecord* of this rank
  u64 epoch;
  u64 timeout_ns;
  u32 rank;
  u32 world;
};
MEGAMOE_PARAMS_LAYOUT(RankBarrierParams, 40, 8);

__device__ __forceinline__ void rank_barrier(const RankBarrierParams& p) {
  if (threadIdx.x < 32) {
    comm::rank_barrier_warp(reinterpret_cast<const u64*>(p.peer_signals), p.rank, p.world, p.epoch,
                            p.timeout_ns, reinterpret_cast<comm::WaitRecord*>(p.record));
  }
}

}  // namespace megamoe::impls
