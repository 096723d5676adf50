// Cross-rank signalling: epoch-counted signals, deadline-bounded waits (recorded in the rank's
// megamoe::comm::WaitRecord), the record of the other errors.
//
// Every launch of a kernel family adds exactly kUnit to each signal it raises, whatever its grid
// size (block 0 adds kUnit - (gridDim.x - 1), every other block 1), so after the n-th call of a
// family a signal reads n * kUnit and waits need no reset. The call number (epoch) is read from
// the local buffer at kernel start and stored back by block 0 after the kernel's final wait,
// which every block of the rank must have reached: so captured graphs replay correctly.
#pragma once
#include <megamoe/comm/deadline.cuh>
#include <megamoe/ptx/memory.cuh>
#include <megamoe_ep/params.cuh>

namespace ep {
// Kernel families: each keeps its own call counter (epoch) in the local buffer.
enum Family : int { kDispatchFamily = 0, kCombineFamily = 1 };
}  // namespace ep

namespace ep::comm {

constexpr u64 kUnit = 1ull << 20;

// Base of `rank`'s symmetric buffer, where the kernels' data regions live.
__device__ __forceinline__ char* buf(const Layout& l, int rank) { return reinterpret_cast<char*>(l.peer_base[rank]); }

// What the signalling below reads, and nothing of a kernel's data: a kernel with another buffer
// layout builds one of these and signals the same way.
struct Signals {
    const u64* peer_base;                    // each rank's symmetric buffer
    u64 off_epochs, off_signals, off_error;  // regions inside every rank's buffer
    u64 deadline_ns;                         // budget of every wait
    megamoe::comm::WaitRecord* wait_record;  // this rank's (local)
    int rank, ranks;
};

__device__ __forceinline__ Signals signals(const Layout& l) {
    return Signals{l.peer_base, l.off_epochs,  l.off_signals,
                   l.off_error, l.deadline_ns, reinterpret_cast<megamoe::comm::WaitRecord*>(l.wait_record),
                   l.rank,      l.ranks};
}

__device__ __forceinline__ char* peer(const Signals& s, int rank) { return reinterpret_cast<char*>(s.peer_base[rank]); }

__device__ __forceinline__ u64* signal(const Signals& s, int owner, int kind, int source) {
    return reinterpret_cast<u64*>(peer(s, owner) + s.off_signals) + kind * kMaxRanks + source;
}

// The first error of a call wins; later ones are dropped.
__device__ __forceinline__ void record_error(const Signals& s, u32 code, u32 what, u32 peer_rank, u64 seen,
                                             u64 expected) {
    ErrorRecord* e = reinterpret_cast<ErrorRecord*>(peer(s, s.rank) + s.off_error);
    if (atomicCAS(&e->code, 0u, code) == 0u) {
        e->rank = s.rank;
        e->what = what;
        e->peer = peer_rank;
        e->seen = seen;
        e->expected = expected;
        __threadfence();
    }
}

// Called by every block once its threads' writes are done (the barrier orders them before the
// release): raise `kind` on every rank's buffer.
__device__ __forceinline__ void arrive_all(const Signals& s, int kind) {
    __syncthreads();
    if (threadIdx.x < s.ranks) {
        u64 add = blockIdx.x == 0 ? kUnit - (gridDim.x - 1) : 1;
        ptx::red_release_sys_add(signal(s, threadIdx.x, kind, s.rank), add);
    }
}

// As arrive_all, for writes a peer may read through another path than the signal (the fence
// makes them visible system-wide first).
__device__ __forceinline__ void raise_on_all(const Signals& s, int kind) {
    __threadfence_system();
    arrive_all(s, kind);
}

// The wait on each signal kind, in this crate's range of wait ids (named by `megamoe_ep::error::WAITS`).
__device__ __forceinline__ u32 wait_of(int kind) { return kFirstWait + kind; }

// Every block waits until `kind` from every source reached epoch * kUnit. Returns false (after
// recording which wait expired) when the deadline passed.
__device__ __forceinline__ bool wait_all(const Signals& s, int kind, u64 epoch, int* s_ok) {
    if (threadIdx.x == 0) *s_ok = 1;
    __syncthreads();
    if (threadIdx.x < s.ranks) {
        const u64* f = signal(s, s.rank, kind, threadIdx.x);
        const u64 target = epoch * kUnit;
        const auto deadline = megamoe::comm::Deadline::after(s.deadline_ns);
        u64 v;
        while ((v = ptx::ld_acquire_sys(f)) < target) {
            if (deadline.expired()) {
                megamoe::comm::report_timeout(s.wait_record, wait_of(kind), s.rank, threadIdx.x, v, target);
                *s_ok = 0;
                break;
            }
        }
    }
    __syncthreads();
    return *s_ok != 0;
}

// A peer that is slow but alive (the probe kernels' kFaultSlowPeer): every thread idles for `ns`.
__device__ __forceinline__ void sleep_for(u64 ns) {
    const auto until = megamoe::comm::Deadline::after(ns);
    while (!until.expired()) __nanosleep(1000);
}

__device__ __forceinline__ u64 read_epoch(const Signals& s, int family, u64* s_epoch) {
    if (threadIdx.x == 0) *s_epoch = reinterpret_cast<volatile u64*>(peer(s, s.rank) + s.off_epochs)[family] + 1;
    __syncthreads();
    return *s_epoch;
}

__device__ __forceinline__ void store_epoch(const Signals& s, int family, u64 epoch) {
    if (blockIdx.x == 0 && threadIdx.x == 0)
        reinterpret_cast<volatile u64*>(peer(s, s.rank) + s.off_epochs)[family] = epoch;
}

}  // namespace ep::comm
