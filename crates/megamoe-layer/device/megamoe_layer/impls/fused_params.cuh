// The fused kernel's one parameter struct: the two GEMMs' mainloops, the L1 epilogue, and where
// everything of the call lives. Mirrored by `FusedParams` in src/fused_kernel.rs (size, alignment
// and offsets asserted on both sides). Region offsets are those of megamoe-core's fused
// `SymmetricLayout`, the same in every rank's buffer.
#pragma once
#include <megamoe/common.cuh>
#include <megamoe_gemm/mma/mainloop_params.cuh>
#include <megamoe_layer/epilogue/swiglu_quant.cuh>

namespace megamoe::layer {

constexpr int kMaxRanks = 8;
// Signal kinds of the fused kernel (ep::comm::Signals counters): a rank's routing is published;
// a rank has written every L2 row it owes the others.
enum FusedSignal : int { kRoutingReady = 0, kRowsWritten = 1 };
// Its call counter (the epochs region's first word).
constexpr int kFusedFamily = 0;

struct FusedRegions {
    u64 peer_base[kMaxRanks];  // each rank's symmetric buffer
    u64 off_epochs, off_signals, off_error;
    u64 off_x, off_x_scales, off_topk_idx, off_topk_weights;  // this call's inputs (peers read)
    u64 off_counts, off_send_list;  // the routing as published (peers read)
    u64 off_l1_pool, off_l1_scales, off_ring_weights, off_row_dest;  // the ring (l2 pool: swiglu)
    u64 off_plan, off_src_base, off_blocks, off_segments, off_block_flags;
    u64 off_expert_l2;    // per local expert: L2 warpgroup-tasks done and owed (comm/flags.cuh)
    u64 off_expert_done;  // [E] the call in which each expert's last L2 rows were written
    u64 off_grid_barrier;
    u64 off_combine;  // [t_cap, K, H] bf16 rows the experts' ranks write back
    u64 y;            // this rank's output, bf16 [T, H] (local)
    u64 wait_record;  // this rank's megamoe::comm::WaitRecord
    u64 deadline_ns;
    u64 pull_ahead;   // the pull of block b waits for the first L1 task of b - pull_ahead
    u64 recv_stats;   // i32 [E_l]: rows this call routes to each local expert are added; 0: none
    i32 rank, ranks, hidden, inter, experts, topk;
    i32 t_cap;       // token capacity: the stride of the send lists and the combine rows
    i32 tokens;      // this rank's T
    i32 bound;       // this rank's num_tokens_bound (checked against every rank's)
    i32 ring_rows;   // rows of the l1 and l2 pools
    i32 ring_slots;  // 128-row slots of this call's ring
    i32 lag_units;   // 0: single wave; else L2 trails L1 by this many units
    i32 n1, n2;      // n-blocks of an L1 and of an L2 task's m-block (256 columns each)
    i32 max_blocks, max_segments;
};

struct FusedParams {
    gemm::MainloopParams l1;  // pool rows x W1 (gate/up interleaved), K = H
    gemm::MainloopParams l2;  // intermediate x W2, K = I
    SwigluQuant swiglu;       // L1's epilogue: into the ring's l2 pool
    FusedRegions r;
};

// Faults the probe instantiation injects on one rank (the selftest's fault checks).
enum FusedFault : u32 {
    kNoFault = 0,
    kStopAfterRouting = 1,  // publish the routing, then stop: the others pull from it and wait
    kStopMidTasks = 2,      // stop after half of the rank's tasks: its L2 rows never all arrive
    kStopMidCombine = 3,    // run every task (its L2 rows are written), stop before signalling them
    kCorruptCount = 4,      // publish T = t_cap + 1, a count no call has
    kSlowPeer = 5,          // sleep sleep_ns before publishing the routing, then go on
};

// What the probe instantiation is told beyond the call: its timeline (impls/fused_trace.cuh)
// or 0, and a fault for rank fault_rank (kSlowPeer sleeps sleep_ns).
struct FusedProbe {
    u64 trace;
    u32 fault_rank;
    u32 fault;
    u64 sleep_ns;
};

struct FusedProbeParams {
    FusedParams fused;
    FusedProbe probe;
};

MEGAMOE_PARAMS_LAYOUT(FusedRegions, 35 * 8 + 16 * 4, 8);
MEGAMOE_PARAMS_LAYOUT(FusedParams, 1344, 64);       // 448 · 2 + 64 + 344, rounded up to the alignment
MEGAMOE_PARAMS_LAYOUT(FusedProbeParams, 1408, 64);  // 1344 + 24, rounded up to the alignment

// Error codes of the buffer's error record (megamoe-core's layout; ep::ErrorRecord's shape).
enum FusedError : u32 { kBadBound = 4, kRingOverflow = 5 };

}  // namespace megamoe::layer
