// Generated from crates/megamoe-ep/src/params.rs (do not edit: `MEGAMOE_WRITE_HEADERS=1 cargo test` rewrites it).
// Kernel parameter structs, codes and constants of dispatch and combine. Every kernel
// takes exactly one of the structs as `const __grid_constant__ Params p`.
#pragma once
#include <megamoe/common.cuh>
#include <megamoe/ptx/memory.cuh>

namespace ep {
using megamoe::i32;
using megamoe::u32;
using megamoe::u64;
namespace ptx = megamoe::ptx;

constexpr int kMaxRanks = 8;

constexpr int kMaxTopk = 8;

constexpr int kMaxExperts = 1024;

// Threads per block.
constexpr int kThreads = 512;

constexpr int kWarps = 16;

// Dispatch stores rows with bulk copies from shared memory: every warp stages its row in
// chunks of kChunkBytes, double-buffered, and the block keeps one chunk of zeros for the
// padding rows.
constexpr int kChunkBytes = 4096;

constexpr int kDispatchDynamicSmem = 135168;

// Signal kinds: one u64 counter per (kind, source rank) in every rank's buffer.
enum Signal : int {
    kDispatchReady = 0,
    kDispatchDone = 1,
    kCombineReady = 2,
    kCombineDone = 3,
    kNumSignals = 4,
};

// The wait on each signal kind is wait kFirstWait + kind, in this crate's range of wait ids.
constexpr u32 kFirstWait = 0x200;

// CombineParams::order. Each sums in f32 and rounds once per row it produces.
enum CombineOrder : int {
    kExpertOrder = 0,
    kSlotOrder = 1,
    kPerRankOrder = 2,
};

// DispatchParams::mode.
enum DispatchMode : int {
    kFull = 0,
    kCached = 1,
    kUnpermuted = 2,
};

// Error codes of the device error record (a wait past its deadline is recorded in the
// rank's `megamoe::comm::WaitRecord` instead).
enum ErrorCode : u32 {
    kOk = 0,
    kBadTopk = 2,
    kOverflow = 3,
    kBadCount = 6,
};

// Faults the probe instantiations of dispatch and combine inject on one rank.
enum Fault : u32 {
    kFaultNone = 0,
    kFaultNeverArrives = 1,
    kFaultStopMidDispatch = 2,
    kFaultStopMidCombine = 3,
    kFaultCorruptCount = 4,
    kFaultSlowPeer = 5,
};

// `InjectedFault` as the device takes it.
struct FaultSpec {
    u64 sleep_ns;
    // The rank that takes the fault.
    u32 rank;
    // A `FAULT_*` code (device: `Fault`).
    u32 fault;
};
MEGAMOE_PARAMS_LAYOUT(FaultSpec, 16, 8);

// Where everything lives: byte offsets inside every rank's symmetric buffer (the same on
// all ranks) and inside this rank's handle block.
struct Layout {
    // Each rank's buffer, valid here under unified addressing.
    u64 peer_base[8];
    // This rank's handle block (local).
    u64 handle;
    // Budget of every wait.
    u64 deadline_ns;
    // This rank's `megamoe_cuda::WaitRecord`, where a wait past its deadline is recorded.
    u64 wait_record;
    // Buffer regions.
    u64 off_epochs;
    u64 off_signals;
    u64 off_status;
    u64 off_counts;
    u64 off_meta;
    u64 off_in_rows;
    u64 off_in_scales;
    u64 off_out_rows;
    u64 off_out_scales;
    u64 off_out_probs;
    u64 off_comb_rows;
    u64 off_comb_prob_grads;
    u64 off_error;
    // Handle regions.
    u64 h_recv_slot;
    u64 h_send_row;
    u64 h_idx;
    u64 h_padded;
    u64 h_counts;
    u64 h_seg_base;
    u64 h_src_tokens;
    u64 h_total_rows;
    i32 rank;
    i32 ranks;
    i32 experts;
    i32 topk;
    i32 hidden;
    i32 max_tokens;
    i32 max_rows;
    i32 _pad0;
};
MEGAMOE_PARAMS_LAYOUT(Layout, 288, 8);

// The dispatch kernel's parameters.
struct DispatchParams {
    Layout l;
    // `[T, K]` i32, this rank's routing (full mode), 16-byte aligned.
    u64 topk_idx;
    // `[T, K]` f32 (full mode).
    u64 probs;
    i32 tokens;
    i32 pad_multiple;
    i32 row_bytes;
    i32 scales_per_row;
    i32 row_bound;
    // A `DISPATCH_*` mode (device: `DispatchMode`).
    i32 mode;
    // 0: output scales row-major `[rows, S]`; else group-major `[S, scales_stride]`.
    i32 scales_stride;
    i32 _pad0;
};
MEGAMOE_PARAMS_LAYOUT(DispatchParams, 336, 8);

// The combine kernel's parameters.
struct CombineParams {
    Layout l;
    // `[T, H]` bf16 output.
    u64 y;
    // `[T, K]` f32 output, or 0.
    u64 grad_probs;
    i32 with_prob_grads;
    // `CombineOrder` as its device value: the order in which a token's copies are summed.
    i32 order;
    i32 _pad0;
    i32 _pad1;
};
MEGAMOE_PARAMS_LAYOUT(CombineParams, 320, 8);

// The dispatch probe instantiation's parameters.
struct DispatchProbeParams {
    DispatchParams p;
    FaultSpec fault;
};
MEGAMOE_PARAMS_LAYOUT(DispatchProbeParams, 352, 8);

// The combine probe instantiation's parameters.
struct CombineProbeParams {
    CombineParams p;
    FaultSpec fault;
};
MEGAMOE_PARAMS_LAYOUT(CombineProbeParams, 336, 8);

// The row gather of the NCCL baseline's permutes.
struct GatherParams {
    // Rows `[*, row_bytes]`.
    u64 src;
    // Rows `[rows, row_bytes]`.
    u64 dst;
    // i32 `[rows]`.
    u64 index;
    i32 rows;
    i32 row_bytes;
};
MEGAMOE_PARAMS_LAYOUT(GatherParams, 32, 8);

// What a call rejected on the device (bad routing, overflow) leaves in its rank's buffer
// (read by the host after a sync).
struct ErrorRecord {
    // An `ERR_*` code (device: `ErrorCode`).
    u32 code;
    u32 rank;
    u32 what;
    u32 peer;
    u64 seen;
    u64 expected;
};
MEGAMOE_PARAMS_LAYOUT(ErrorRecord, 32, 8);

}  // namespace ep
