// Generated from crates/megamoe-gemm/src/params.rs (do not edit: `MEGAMOE_WRITE_HEADERS=1 cargo test` rewrites it).
// The grouped GEMM kernels' single parameter struct and its pieces.
#pragma once
#include <megamoe/common.cuh>
#include <megamoe/ptx/tma.cuh>
#include <megamoe_gemm/mma/mainloop_params.cuh>

namespace megamoe::gemm {

// The tile scheduler's walk over the experts.
struct SchedulerParams {
    // i32 [E]: padded segment sizes (contiguous) or valid rows (masked).
    u64 expert_rows;
    u32 num_experts;
    u32 n;
    // Masked: row capacity of each expert; contiguous: unused (0).
    u32 max_m;
    // M-blocks walked together per n-block (L2 reuse of the weight tile).
    u32 group_m;
};
MEGAMOE_PARAMS_LAYOUT(SchedulerParams, 24, 8);

// The output of the GEMM's own epilogues (epilogue/store.cuh: TMA stores or row stores).
struct alignas(64) EpilogueParams {
    // bf16 output 2-D {N, rows}; box {64, 64}, 128-byte swizzle (TmaStoreBf16).
    ptx::TensorMap tma_d;
    // bf16 or f32 output, rows like the activations, N columns (StoreRows).
    u64 out;
    u32 n;
};
MEGAMOE_PARAMS_LAYOUT(EpilogueParams, 192, 64);

// Parameters of one grouped GEMM launch: the params of its pieces.
struct alignas(64) GroupedGemmParams {
    MainloopParams mainloop;
    SchedulerParams scheduler;
    // The TmaStoreBf16 and StoreRows epilogues'.
    EpilogueParams epilogue;
};
MEGAMOE_PARAMS_LAYOUT(GroupedGemmParams, 704, 64);

}  // namespace megamoe::gemm
