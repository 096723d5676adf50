// The single parameter struct of the grouped GEMM kernels. Mirrored by
// `GroupedGemmParams` in src/params.rs (size and alignment asserted there).
#pragma once
#include <megamoe/common.cuh>
#include <megamoe/ptx/tma.cuh>

namespace megamoe::gemm {

struct GroupedGemmParams {
    ptx::TensorMap tma_a;    // e4m3 activations, 2-D {K, rows}; 128-byte swizzle, box {128, BLOCK_M}
    ptx::TensorMap tma_b;    // e4m3 weights W[E, N, K] as 2-D {K, E*N}; box {128, BLOCK_N}
    ptx::TensorMap tma_sa;   // f32 activation scales, K-group-major 2-D {rows, groups}; box {BLOCK_M, 128/G}
    ptx::TensorMap tma_d;    // bf16 output 2-D {N, rows}; box {64, 64}, 128-byte swizzle (TMA-store epilogue)
    u64 out;                 // bf16 or f32 output, rows like the activations, N columns
    u64 scale_b;             // f32 weight scales [E, N/128, K/128]
    u64 expert_rows;         // i32 [E]: padded segment sizes (contiguous) or valid rows (masked)
    u64 error;               // megamoe::comm::WaitRecord; see WaitId
    u64 timeout_ns;          // deadline of every device wait
    u32 num_experts;
    u32 n;
    u32 k;
    u32 max_m;               // masked: row capacity of each expert; contiguous: unused (0)
    u32 group_m;             // m-blocks walked together per n-block (L2 reuse of the weight tile)
    u32 reserved[3];
};

MEGAMOE_PARAMS_LAYOUT(GroupedGemmParams, 640, 64);

}  // namespace megamoe::gemm
