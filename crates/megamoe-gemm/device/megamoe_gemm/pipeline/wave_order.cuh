// v9, ordered waves: the two consumer warpgroups of a CTA take turns. The tensor cores share
// two queued waves out evenly, so two waves issued together finish together, and then both
// warpgroups promote (drain, 64 FFMAs per thread each, next issue) while the tensor cores have
// nothing to do. Here a warpgroup promotes its finished wave only once its partner has the next
// wave of the turn order queued: warpgroup 0 promotes wave i once warpgroup 1 has issued wave
// i, warpgroup 1 promotes wave i once warpgroup 0 has issued wave i + 1. The promotions then
// alternate, each one running while the other warpgroup's wave has the tensor cores.
// The turns are named barriers (a few cycles, where an mbarrier round trip costs a wave's
// share). A warpgroup whose full-barrier wait expires must not leave its partner in a named
// barrier: it raises the CTA's abort flag and arrives for the wave it will never issue; a
// warpgroup released by a barrier checks the flag and ends too. Waves are counted over the
// whole persistent loop (both warpgroups walk the same tiles); neither warpgroup gets more than
// one wave ahead, so every arrival meets exactly one wait.
#pragma once
#include <megamoe/ptx/sync.cuh>
#include <megamoe_gemm/pipeline/barriers.cuh>

namespace megamoe::gemm {

template <bool kEnabled>
struct WaveOrder {
    volatile u32* abort;  // in shared memory, zeroed before the consumers start
    u32 wg;
    bool first = true;

    static constexpr u32 kThreads = 256;

    __device__ __forceinline__ NamedBarrier mine() const {
        return wg == 0 ? NamedBarrier::kWaveIssuedWg0 : NamedBarrier::kWaveIssuedWg1;
    }

    // Waits for the partner's next issue in the turn order; ends if the partner gave up.
    __device__ __forceinline__ void wait_partner() {
        named_barrier_sync(wg == 0 ? NamedBarrier::kWaveIssuedWg1 : NamedBarrier::kWaveIssuedWg0,
                           kThreads);
        if (*abort) asm volatile("exit;");
    }

    // Before this warpgroup issues a wave: warpgroup 1's first wave follows warpgroup 0's.
    __device__ __forceinline__ void before_issue() {
        if constexpr (kEnabled) {
            if (wg == 1 && first) wait_partner();
            first = false;
        }
    }

    // After the wave's wgmmas are committed.
    __device__ __forceinline__ void after_commit() {
        if constexpr (kEnabled) named_barrier_arrive(mine(), kThreads);
    }

    // After the wave's wgmmas completed, before its promotion.
    __device__ __forceinline__ void before_promote() {
        if constexpr (kEnabled) wait_partner();
    }

    // An expired wait of this (converged) warp: the partner may be waiting for this wave.
    __device__ __forceinline__ void expire() {
        if constexpr (kEnabled) {
            *abort = 1;
            __threadfence_block();
            named_barrier_arrive(mine(), kThreads);
        }
    }

    // After the last tile: warpgroup 1 waits, before promoting its last wave, for a wave
    // warpgroup 0 will not issue.
    __device__ __forceinline__ void finish() {
        if constexpr (kEnabled) {
            if (wg == 0 && !first) named_barrier_arrive(mine(), kThreads);
        }
    }
};

}  // namespace megamoe::gemm
