// The single parameter struct of the grouped GEMM kernels: the params of its pieces, each in the
// piece's folder. Mirrored by `GroupedGemmParams` in src/params.rs (sizes and alignments asserted
// on both sides, offsets in Rust).
#pragma once
#include <megamoe/common.cuh>
#include <megamoe_gemm/mma/mainloop_params.cuh>
#include <megamoe_gemm/scheduler/tile_scheduler.cuh>
#include <megamoe_gemm/epilogue/store.cuh>

namespace megamoe::gemm {

struct GroupedGemmParams {
    MainloopParams mainloop;
    SchedulerParams scheduler;
    EpilogueParams epilogue;  // the TmaStoreBf16 and StoreRows epilogues'
};

MEGAMOE_PARAMS_LAYOUT(GroupedGemmParams, 704, 64);

}  // namespace megamoe::gemm
