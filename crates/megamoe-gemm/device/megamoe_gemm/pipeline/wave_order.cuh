// v8, ordered waves: the two consumer warpgroups of a CTA share the tensor cores, and when both
// have a wave in flight the waves progress together, finish together and leave the tensor
// cores idle while both warpgroups promote. Here warpgroup 1 issues each wave only once
// warpgroup 0's same wave has completed, and warpgroup 0 issues a wave only once warpgroup 1 has
// issued the previous one. The two then stay half a wave apart: one warpgroup's promotion runs
// while the other's wave has the tensor cores to itself, at no register cost. Waves are counted
// over the whole persistent loop (both warpgroups walk the same tiles), so each barrier is at
// most one phase ahead of its waiter. The waits are mbarrier waits with the kernel's deadline,
// so a warpgroup that ends on an expired wait cannot hang the other.
#pragma once
#include <megamoe/ptx/mbarrier.cuh>
#include <megamoe_gemm/pipeline/barriers.cuh>
#include <megamoe_gemm/impls/grouped_gemm_params.cuh>

namespace megamoe::gemm {

template <bool kEnabled>
struct WaveOrder {
    u64* done;    // warpgroup 0's wave completed: one arrival per warp of warpgroup 0
    u64* issued;  // warpgroup 1's wave issued: one arrival per warp of warpgroup 1
    u32 wg;
    u32 done_phase = 0, issued_phase = 0;
    bool first = true;

    // Before a warpgroup issues its next wave (no wgmma of its own in flight).
    __device__ __forceinline__ void before_issue(const GroupedGemmParams& p) {
        if constexpr (kEnabled) {
            u32* error = reinterpret_cast<u32*>(p.error);
            if (wg == 1) {
                mbarrier_wait(done, done_phase, error, p.timeout_ns, kWaitWaveDone);
                done_phase ^= 1;
            } else if (!first) {
                mbarrier_wait(issued, issued_phase, error, p.timeout_ns, kWaitWaveIssued);
                issued_phase ^= 1;
            }
            first = false;
        }
    }

    // After the wave's wgmmas are committed.
    __device__ __forceinline__ void after_commit() {
        if constexpr (kEnabled) {
            if (wg == 1 && threadIdx.x % 32 == 0) ptx::mbarrier_arrive(issued);
        }
    }

    // After the wave's wgmmas have completed (wait_group 0).
    __device__ __forceinline__ void after_complete() {
        if constexpr (kEnabled) {
            if (wg == 0 && threadIdx.x % 32 == 0) ptx::mbarrier_arrive(done);
        }
    }
};

}  // namespace megamoe::gemm
