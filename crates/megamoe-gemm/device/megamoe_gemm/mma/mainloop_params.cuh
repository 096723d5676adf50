// The mainloop's parameters: what the TMA producer loads and the wgmma consumer multiplies and
// scales, and the deadline of both roles' waits. Mirrored by `MainloopParams` in src/params.rs.
#pragma once
#include <megamoe/common.cuh>
#include <megamoe/ptx/tma.cuh>

namespace megamoe::gemm {

struct MainloopParams {
    ptx::TensorMap tma_a;   // e4m3 activations, 2-D {K, rows}; 128-byte swizzle, box {128, BLOCK_M}
    ptx::TensorMap tma_b;   // e4m3 weights W[E, N, K] as 2-D {K, E*N}; box {128, BLOCK_N}
    ptx::TensorMap tma_sa;  // f32 activation scales, K-group-major 2-D {rows, groups}; box {BLOCK_M, 128/G}
    u64 scale_b;            // f32 weight scales [E, N/128, K/128]
    u64 error;              // megamoe::comm::WaitRecord; see WaitId
    u64 timeout_ns;         // deadline of every device wait
    u32 k;
    u32 n;
};

MEGAMOE_PARAMS_LAYOUT(MainloopParams, 448, 64);

}  // namespace megamoe::gemm
