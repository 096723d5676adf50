// Generated from crates/megamoe-gemm/src/params.rs (do not edit: `MEGAMOE_WRITE_HEADERS=1 cargo test` rewrites it).
// The mainloop's side of the host/device interface: the threads of a CTA that runs
// its roles (pipeline/roles.cuh), its waits and its params.
#pragma once
#include <megamoe/common.cuh>
#include <megamoe/ptx/tma.cuh>

namespace megamoe::gemm {

// Threads per CTA: two consumer warpgroups and one producer warpgroup.
constexpr u32 kThreads = 384;

// Experts a launch may have (their row counts are staged in shared memory).
constexpr int kMaxExperts = 1024;

// Longest K, in 128-wide blocks (a tile's weight scales are staged in shared memory).
constexpr int kMaxKBlocks = 128;

// The kernel's waits, in this crate's range of wait ids.
enum WaitId : u32 {
    kWaitFull = 0x100,  // consumer waiting for a stage's TMA data (full barrier)
    kWaitEmpty = 0x101,  // producer waiting for a free stage (empty barrier)
};

// The mainloop's parameters: what the TMA producer loads and the wgmma consumer multiplies
// and scales, and the deadline of both roles' waits.
struct alignas(64) MainloopParams {
    // e4m3 activations, 2-D {K, rows}; 128-byte swizzle, box {128, BLOCK_M}.
    ptx::TensorMap tma_a;
    // e4m3 weights W[E, N, K] as 2-D {K, E*N}; box {128, BLOCK_N}.
    ptx::TensorMap tma_b;
    // f32 activation scales, K-group-major 2-D {rows, groups}; box {BLOCK_M, 128/G}.
    ptx::TensorMap tma_sa;
    // f32 weight scales [E, N/128, K/128].
    u64 scale_b;
    // comm::WaitRecord; see WaitId.
    u64 error;
    // Deadline of every device wait.
    u64 timeout_ns;
    u32 k;
    u32 n;
};
MEGAMOE_PARAMS_LAYOUT(MainloopParams, 448, 64);

}  // namespace megamoe::gemm
