// Kernel parameter structs, mirrored field for field by src/params.rs (sizes asserted on both
// sides). Every kernel takes exactly one of them as `const __grid_constant__ Params p`.
#pragma once
#include <megamoe/common.cuh>

namespace megamoe::ptx {}

namespace ep {

using megamoe::u32;
using megamoe::u64;
namespace ptx = megamoe::ptx;

constexpr int kMaxRanks = 8;
constexpr int kMaxTopk = 8;
constexpr int kMaxExperts = 1024;
constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
// Dispatch stores rows with bulk copies from shared memory: every warp stages its row in chunks
// of kChunkBytes, double-buffered, and the block keeps one chunk of zeros for the padding rows.
constexpr int kChunkBytes = 4096;
constexpr int kDispatchDynamicSmem = (2 * kWarps + 1) * kChunkBytes;  // DISPATCH_DYNAMIC_SMEM

// Signal kinds: one u64 counter per (kind, source rank) in every rank's buffer.
enum Signal : int { kDispatchReady = 0, kDispatchDone = 1, kCombineReady = 2, kCombineDone = 3, kNumSignals = 4 };
// Kernel families: each keeps its own call counter (epoch) in the local buffer.
enum Family : int { kDispatchFamily = 0, kCombineFamily = 1 };
// CombineParams::order. Each sums in f32 and rounds once per row it produces.
enum CombineOrder : int {
    kExpertOrder = 0,  // ascending global expert id (SPEC §5 `exact`)
    kSlotOrder = 1,    // ascending slot k (SPEC §3 step 5, the MoE layer's combine)
    kPerRankOrder = 2, // each owner's copies summed and rounded there, then ascending rank (SPEC §5 `per_rank`)
};
// Error codes of the device error record (a wait past its deadline is recorded in the rank's
// `megamoe::comm::WaitRecord` instead).
enum ErrorCode : u32 { kOk = 0, kBadTopk = 2, kOverflow = 3, kBadCount = 6 };

// Faults the probe instantiations of dispatch and combine (ep_dispatch_probe, ep_combine_probe)
// inject on one rank, for the fault checks; the default kernels are instantiated without them.
enum Fault : u32 {
    kFaultNone = 0,
    kFaultNeverArrives = 1,     // dispatch and combine return at entry
    kFaultStopMidDispatch = 2,  // dispatch publishes its counts and meta, raises kDispatchReady, stops
    kFaultStopMidCombine = 3,   // combine raises kCombineReady, then stops
    kFaultCorruptCount = 4,     // dispatch publishes a count no routing gives (expert 0: T + 1)
    kFaultSlowPeer = 5,         // dispatch sleeps sleep_ns before raising kDispatchReady, then goes on
};

struct FaultSpec {
    u64 sleep_ns;
    u32 rank;   // the rank that takes the fault
    u32 fault;  // a Fault
};

// Where everything lives: byte offsets inside every rank's symmetric buffer (the same on all
// ranks) and inside this rank's handle block.
struct Layout {
    u64 peer_base[kMaxRanks];  // each rank's buffer, valid here under unified addressing
    u64 handle;                // this rank's handle block (local)
    u64 deadline_ns;           // budget of every wait
    u64 wait_record;           // this rank's megamoe::comm::WaitRecord (local)
    // buffer regions
    u64 off_epochs, off_signals, off_status, off_counts, off_meta, off_in_rows, off_in_scales;
    u64 off_out_rows, off_out_scales, off_out_probs, off_comb_rows, off_comb_prob_grads, off_error;
    // handle regions
    u64 h_recv_slot, h_send_row, h_idx, h_padded, h_counts, h_seg_base, h_src_tokens, h_total_rows;
    int rank, ranks, experts, topk, hidden, max_tokens, max_rows, _pad0;
};

struct DispatchParams {
    Layout l;
    u64 topk_idx;  // [T, K] i32, this rank's routing (full mode), 16-byte aligned
    u64 probs;     // [T, K] f32 (full mode)
    int tokens, pad_multiple, row_bytes, scales_per_row, row_bound, mode;
    int scales_stride;  // 0: output scales row-major [rows, S]; else group-major [S, scales_stride]
    int _pad0;
};

struct CombineParams {
    Layout l;
    u64 y;           // [T, H] bf16 output
    u64 grad_probs;  // [T, K] f32 output, or 0
    int with_prob_grads;
    int order;  // CombineOrder: the order in which a token's copies are summed
    int _pad0, _pad1;
};

struct DispatchProbeParams {
    DispatchParams p;
    FaultSpec fault;
};

struct CombineProbeParams {
    CombineParams p;
    FaultSpec fault;
};

struct GatherParams {
    u64 src, dst, index;  // rows [*, row_bytes], rows [rows, row_bytes], i32 [rows]
    int rows, row_bytes;
};

// What a failed call leaves behind on its rank (read by the host after a sync).
struct ErrorRecord {
    u32 code, rank, what, peer;
    u64 seen, expected;
};

}  // namespace ep

MEGAMOE_PARAMS_LAYOUT(ep::Layout, 8 * 8 + 24 * 8 + 8 * 4, 8);
MEGAMOE_PARAMS_LAYOUT(ep::DispatchParams, sizeof(ep::Layout) + 16 + 32, 8);
MEGAMOE_PARAMS_LAYOUT(ep::CombineParams, sizeof(ep::Layout) + 16 + 16, 8);
MEGAMOE_PARAMS_LAYOUT(ep::DispatchProbeParams, sizeof(ep::DispatchParams) + 16, 8);
MEGAMOE_PARAMS_LAYOUT(ep::CombineProbeParams, sizeof(ep::CombineParams) + 16, 8);
MEGAMOE_PARAMS_LAYOUT(ep::GatherParams, 32, 8);
MEGAMOE_PARAMS_LAYOUT(ep::ErrorRecord, 32, 8);
