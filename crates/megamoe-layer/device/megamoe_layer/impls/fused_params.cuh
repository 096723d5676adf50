// Generated from crates/megamoe-layer/src/kernel.rs (do not edit: `MEGAMOE_WRITE_HEADERS=1 cargo test` rewrites it).
// The fused kernel's host/device interface: its one parameter struct (the two GEMMs'
// mainloops, the L1 epilogue, and where everything of the call lives), its codes,
// waits and shapes, and the timeline of its probe instantiation.
#pragma once
#include <megamoe/common.cuh>
#include <megamoe_gemm/mma/mainloop_params.cuh>
#include <megamoe_layer/epilogue/swiglu_quant.cuh>

namespace megamoe::layer {

// Ranks a buffer can have.
constexpr int kMaxRanks = 8;

// Slots per token.
constexpr int kMaxTopk = 8;

// Rows of an m-block and of a ring slot.
constexpr u32 kBlockM = 128;

// Columns of a task's tile.
constexpr u32 kBlockN = 256;

// M-blocks of a unit of the task stream.
constexpr u32 kUnitBlocks = 8;

// Units of a group of the task stream.
constexpr u32 kGroupUnits = 4;

// Blocks the pull runs ahead of the L1 frontier where a block reuses a slot.
constexpr u32 kPullAheadBlocks = 4;

// Faults the probe instantiation injects on one rank (the selftest's fault checks).
enum FusedFault : u32 {
    kNoFault = 0,
    kStopAfterRouting = 1,
    kStopMidTasks = 2,
    kStopMidCombine = 3,
    kCorruptCount = 4,
    kSlowPeer = 5,
};

// Error codes of the buffer's error record (megamoe-ep's `ErrorRecord`).
enum FusedError : u32 {
    kBadBound = 4,
    kRingOverflow = 5,
};

// The kernel's own waits, in this crate's range of wait ids (comm/flags.cuh).
enum FusedWait : u32 {
    kWaitRowsPulled = 0x300,  // an L1 task waiting for its m-block's pulled rows
    kWaitL1Done = 0x301,  // an L2 task waiting for its m-block's L1 tasks
    kWaitSlotFree = 0x302,  // the pull waiting for a ring slot's previous m-block to finish L2
    kWaitGrid = 0x303,  // the grid barrier after the call's plan
    kWaitPullTurn = 0x304,  // the pull waiting for the L1 frontier to come within pull_ahead blocks
    kWaitSlicesDone = 0x305,  // the releaser waiting for a consumer warpgroup's slice of a task
    kWaitTaskSlot = 0x306,  // the producer waiting for the consumers to read a task slot
    kWaitTaskReady = 0x307,  // a consumer warp waiting for the producer to hand over its next task
};

// A task's GEMM (megamoe-core's `TaskKind`).
enum TaskKind : u32 {
    kL1 = 0,
    kL2 = 1,
};

// Where a fused call's data lives: byte offsets of megamoe-core's fused `SymmetricLayout`
// (`FusedOffsets`), the same in every rank's buffer, and the call's sizes.
struct FusedRegions {
    // Each rank's symmetric buffer.
    u64 peer_base[8];
    u64 off_epochs;
    u64 off_signals;
    u64 off_error;
    // This call's inputs (peers read them).
    u64 off_x;
    u64 off_x_scales;
    u64 off_topk_idx;
    u64 off_topk_weights;
    // The routing as published (peers read it).
    u64 off_counts;
    u64 off_send_list;
    // The ring (the L2 pool is the SwiGLU epilogue's).
    u64 off_l1_pool;
    u64 off_l1_scales;
    u64 off_ring_weights;
    u64 off_row_dest;
    u64 off_plan;
    u64 off_src_base;
    u64 off_blocks;
    u64 off_segments;
    u64 off_block_flags;
    // Per local expert: L2 warpgroup-tasks done and owed (comm/flags.cuh).
    u64 off_expert_l2;
    // `[E]`: the call in which each expert's last L2 rows were written.
    u64 off_expert_done;
    u64 off_grid_barrier;
    // `[t_cap, K, H]` bf16 rows the experts' ranks write back.
    u64 off_combine;
    // This rank's output, bf16 `[T, H]` (local).
    u64 y;
    // This rank's `megamoe::comm::WaitRecord`.
    u64 wait_record;
    u64 deadline_ns;
    // The call's megamoe-core `rules::pull_ahead`: the pull of block b waits until the
    // first L1 task of block b - pull_ahead is handed out (`u64::MAX`: it never waits).
    u64 pull_ahead;
    // i32 `[E_l]`: the rows each local expert receives in the call are added to it; 0: none.
    u64 recv_stats;
    i32 rank;
    i32 ranks;
    i32 hidden;
    i32 inter;
    i32 experts;
    i32 topk;
    // Token capacity: the stride of the send lists and the combine rows.
    i32 t_cap;
    // This rank's T.
    i32 tokens;
    // This rank's `num_tokens_bound` (checked against every rank's).
    i32 bound;
    // Rows of the L1 and L2 pools.
    i32 ring_rows;
    // 128-row slots of this call's ring.
    i32 ring_slots;
    // 0: a single wave; else the lag of L2 behind L1 in units.
    i32 lag_units;
    // N-blocks of an L1 and of an L2 task's m-block (`FUSED_BLOCK_N` columns each).
    i32 n1;
    i32 n2;
    i32 max_blocks;
    i32 max_segments;
};
MEGAMOE_PARAMS_LAYOUT(FusedRegions, 344, 8);

// The fused kernel's one parameter struct: the two GEMMs' mainloops, the L1 epilogue, and
// where everything of the call lives.
struct alignas(64) FusedParams {
    // Pool rows x W1 (gate/up interleaved), K = H.
    gemm::MainloopParams l1;
    // Intermediate x W2, K = I.
    gemm::MainloopParams l2;
    // L1's epilogue: into the ring's L2 pool.
    SwigluQuant swiglu;
    FusedRegions r;
};
MEGAMOE_PARAMS_LAYOUT(FusedParams, 1344, 64);

// What the probe instantiation is told beyond the call: its timeline
// (impls/fused_trace.cuh) or 0, and a fault for rank `fault_rank`.
struct FusedProbe {
    // The timeline (`CtaTrace`s, then `TaskTrace`s), or 0.
    u64 trace;
    // The rank that takes `fault`.
    u32 fault_rank;
    // One of the `FUSED_*` faults (device: `FusedFault`).
    u32 fault;
    // How long `FUSED_SLOW_PEER` sleeps.
    u64 sleep_ns;
};
MEGAMOE_PARAMS_LAYOUT(FusedProbe, 24, 8);

// The probe instantiation's parameters: the call's, the timeline and an injected fault.
struct alignas(64) FusedProbeParams {
    FusedParams fused;
    FusedProbe probe;
};
MEGAMOE_PARAMS_LAYOUT(FusedProbeParams, 1408, 64);

// The call's plan as the kernel built it (the `plan` region).
struct PlanHeader {
    u32 n_blocks;
    u32 n_segments;
    u32 n_tasks;
    // 0, or the `FusedError` that made every rank skip the call.
    u32 status;
    // The stream's first task no CTA has claimed (each producer claims its next task with
    // an atomic add, so tasks are claimed in stream order).
    u32 next_task;
};
MEGAMOE_PARAMS_LAYOUT(PlanHeader, 20, 4);

// One m-block of the plan (the `blocks` region).
struct BlockInfo {
    // Local expert.
    u32 expert;
    // Inside the expert's rows (ordered by source rank, then token).
    u32 first_row;
    u32 rows;
    u32 pad;
};
MEGAMOE_PARAMS_LAYOUT(BlockInfo, 16, 4);

// One segment of the task stream (the `segments` region): tasks of one kind over
// consecutive m-blocks.
struct Segment {
    // A `TaskKind`.
    u32 kind;
    u32 first_block;
    u32 n_blocks;
    u32 first_task;
};
MEGAMOE_PARAMS_LAYOUT(Segment, 16, 4);

// Counters of one m-block (the `block_flags` region), zeroed by every call before its grid
// barrier.
struct BlockFlags {
    // Rows of the block in its ring slot.
    u32 rows_pulled;
    // L1 warpgroup-tasks done (2 per task).
    u32 l1_done;
    // L2 warpgroup-tasks done (2 per task).
    u32 l2_done;
    // 1 once the block's first L1 task is handed out (its producer reached it).
    u32 l1_started;
};
MEGAMOE_PARAMS_LAYOUT(BlockFlags, 16, 4);

// A local expert's L2 warpgroup-tasks (the `expert_l2` region): done (zeroed by every call
// before its grid barrier, like the block counters) and owed (its m-blocks · n2 · 2,
// written by the plan).
struct ExpertL2 {
    u32 done;
    u32 owed;
};
MEGAMOE_PARAMS_LAYOUT(ExpertL2, 8, 4);

// One CTA's part of the timeline: the times (globaltimer ns) its phases end.
struct CtaTrace {
    u64 start;
    u64 routed;
    u64 planned;
    u64 tasks_done;
    u64 rows_written;
    u64 end;
    // Combine items (tokens, or their column chunks at decode sizes) its consumer warps
    // combined while they waited for every rank's rows.
    u64 combined_early;
    // Its thread 0 between the tasks and the wait: past its system-scope fence, and past
    // the consumers' barrier and its rows-written signal.
    u64 fenced;
    u64 raised;
};
MEGAMOE_PARAMS_LAYOUT(CtaTrace, 72, 8);

// One task's part of the timeline (globaltimer ns).
struct TaskTrace {
    // The producer: the block-counter wait, all stages issued.
    u64 wait_start;
    u64 wait_end;
    u64 issued;
    // Each consumer warpgroup: task start, mainloop end, epilogue end.
    u64 wg[2][3];
    u32 kind;
    u32 block;
};
MEGAMOE_PARAMS_LAYOUT(TaskTrace, 80, 8);

}  // namespace megamoe::layer
