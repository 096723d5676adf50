// Deadlines for device-side waits (SPEC §6). A wait that runs past its deadline records which
// rank, which wait, which peer and what value it saw into a WaitRecord, and the kernel returns;
// the host turns the record into an error (comm/wait_record.cuh, generated from megamoe-cuda's
// src/wait.rs).
#pragma once
#include <megamoe/comm/wait_record.cuh>
#include <megamoe/common.cuh>
#include <megamoe/ptx/memory.cuh>
#include <megamoe/ptx/timer.cuh>

namespace megamoe::comm {

struct Deadline {
    u64 end_ns;
    __device__ __forceinline__ static Deadline after(u64 timeout_ns) {
        return Deadline{ptx::globaltimer_ns() + timeout_ns};
    }
    __device__ __forceinline__ bool expired() const { return ptx::globaltimer_ns() > end_ns; }
};

__device__ __forceinline__ void report_timeout(WaitRecord* rec, u32 wait, u32 rank, u32 peer, u64 observed,
                                               u64 expected) {
    if (ptx::atomic_cas_u32(&rec->status, 0u, 1u) == 0u) {
        rec->wait = wait;
        rec->rank = rank;
        rec->peer = peer;
        rec->observed = observed;
        rec->expected = expected;
    }
}

}  // namespace megamoe::comm
