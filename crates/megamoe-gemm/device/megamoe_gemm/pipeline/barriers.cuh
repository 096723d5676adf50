// The grouped GEMM's barriers: the deadline-bounded wait on a ring stage's mbarrier, and every
// named barrier of the kernel. A wait that expires records which barrier it was in the kernel's
// error word and ends the thread instead of hanging.
#pragma once
#include <megamoe/common.cuh>
#include <megamoe/ptx/mbarrier.cuh>
#include <megamoe/ptx/timer.cuh>

namespace megamoe::gemm {

// Error word layout: bit 31 set = a wait expired; bits 0..15 = the wait's id (WaitId).
enum WaitId : u32 {
    kWaitFull = 1,   // consumer waiting for a stage's TMA data
    kWaitEmpty = 2,  // producer waiting for consumers to release a stage
    kWaitWaveDone = 3,    // ordered waves: warpgroup 1 waiting for warpgroup 0's wave to complete
    kWaitWaveIssued = 4,  // ordered waves: warpgroup 0 waiting for warpgroup 1 to issue its wave
};

// Waits for the phase of `parity` to complete; on deadline records `id` and exits the thread.
__device__ __forceinline__ void mbarrier_wait(u64* bar, u32 parity, u32* error, u64 timeout_ns,
                                              WaitId id) {
    if (ptx::mbarrier_try_wait_parity(bar, parity)) return;
    const u64 start = ptx::globaltimer_ns();
    while (!ptx::mbarrier_try_wait_parity(bar, parity)) {
        if (ptx::globaltimer_ns() - start > timeout_ns) {
            atomicCAS(error, 0u, 0x80000000u | static_cast<u32>(id));
            asm volatile("exit;");
        }
    }
}

// Every named barrier of the grouped GEMM kernels. Id 0 is __syncthreads.
enum class NamedBarrier : u32 {
    kBlock = 0,
    kEpilogueWg0 = 1,  // consumer warpgroup 0 staging its tile for a TMA store
    kEpilogueWg1 = 2,  // consumer warpgroup 1, likewise
};

__device__ __forceinline__ NamedBarrier epilogue_barrier(u32 wg) {
    return wg == 0 ? NamedBarrier::kEpilogueWg0 : NamedBarrier::kEpilogueWg1;
}

__device__ __forceinline__ void named_barrier_sync(NamedBarrier id, u32 threads) {
    ptx::named_barrier_sync(static_cast<u32>(id), threads);
}

}  // namespace megamoe::gemm
