// Deadlines for device-side waits (SPEC §6). A wait that runs past its deadline records which
// rank, which wait, which peer and what value it saw into a WaitRecord, and the kernel returns;
// the host turns the record into an error. The layout matches `megamoe_cuda::WaitRecord`.
#pragma once
#include <megamoe/common.cuh>
#include <megamoe/ptx/memory.cuh>
#include <megamoe/ptx/timer.cuh>

namespace megamoe::comm {

// The runtime's own waits, decoded by `megamoe_cuda::Wait`. Other crates number theirs in
// ranges of their own (see `megamoe_cuda::WaitNames`); a plain enum, so its values pass as u32.
enum Wait : u32 {
  RankBarrier = 1,
  TmaLoad = 2,
};

struct WaitRecord {
  u32 status;  // 0: no timeout; 1: timed out (first timeout wins)
  u32 wait;    // a Wait, or a wait of another crate's range
  u32 rank;    // the rank that waited
  u32 peer;    // the rank it waited for
  u64 observed;
  u64 expected;
};
MEGAMOE_PARAMS_LAYOUT(WaitRecord, 32, 8);

struct Deadline {
  u64 end_ns;
  __device__ __forceinline__ static Deadline after(u64 timeout_ns) {
    return Deadline{ptx::globaltimer_ns() + timeout_ns};
  }
  __device__ __forceinline__ bool expired() const { return ptx::globaltimer_ns() > end_ns; }
};

__device__ __forceinline__ void report_timeout(WaitRecord* rec, u32 wait, u32 rank, u32 peer,
                                               u64 observed, u64 expected) {
  if (ptx::atomic_cas_u32(&rec->status, 0u, 1u) == 0u) {
    rec->wait = wait;
    rec->rank = rank;
    rec->peer = peer;
    rec->observed = observed;
    rec->expected = expected;
  }
}

}  // namespace megamoe::comm
