// The call's plan and task stream (megamoe-core plan/stream.rs, replayed here): m-blocks of 128
// rows in local-expert order, units of up to 8 consecutive m-blocks of one expert, and the
// stream of segments (one kind of task over one unit, n-block outer, m-block inner). A single
// wave runs every unit's L1 tasks, then every unit's L2 tasks; a lagged stream emits L1 tasks a
// group of 4 units at a time, each group followed by the L2 tasks of the units that fell `lag`
// units behind. Block b lives in ring slot b mod ring_slots.
//
// CTA 0 builds the plan into the rank's buffer once every rank's routing is published; the
// grid barrier that follows makes it visible to every CTA. Every role of a CTA then walks tasks
// blockIdx.x, blockIdx.x + G, ... of the stream with a TaskCursor.
#pragma once
#include <megamoe/common.cuh>
#include <megamoe_layer/impls/fused_params.cuh>

namespace megamoe::layer {

constexpr u32 kBlockM = 128;      // rows of an m-block and of a ring slot
constexpr u32 kBlockN = 256;      // columns of a task's tile
constexpr u32 kUnitBlocks = 8;    // megamoe-core plan::rules::UNIT_BLOCKS
constexpr u32 kGroupUnits = 4;    // megamoe-core plan::rules::GROUP_UNITS

enum TaskKind : u32 { kL1 = 0, kL2 = 1 };

struct PlanHeader {
    u32 n_blocks, n_segments, n_tasks;
    u32 status;  // 0, or the FusedError that made every rank skip the call
};

struct BlockInfo {
    u32 expert;     // local expert
    u32 first_row;  // inside the expert's rows (ordered by source rank, then token)
    u32 rows;
    u32 pad;
};

struct Segment {
    u32 kind, first_block, n_blocks, first_task;
};

__device__ __forceinline__ char* local_buf(const FusedRegions& r) { return reinterpret_cast<char*>(r.peer_base[r.rank]); }
__device__ __forceinline__ PlanHeader* plan_header(const FusedRegions& r) {
    return reinterpret_cast<PlanHeader*>(local_buf(r) + r.off_plan);
}
__device__ __forceinline__ BlockInfo* plan_blocks(const FusedRegions& r) {
    return reinterpret_cast<BlockInfo*>(local_buf(r) + r.off_blocks);
}
__device__ __forceinline__ Segment* plan_segments(const FusedRegions& r) {
    return reinterpret_cast<Segment*>(local_buf(r) + r.off_segments);
}
// [E_l, R]: first row of source rank s's run inside local expert j.
__device__ __forceinline__ u32* plan_src_base(const FusedRegions& r) {
    return reinterpret_cast<u32*>(local_buf(r) + r.off_src_base);
}
// Rank `src`'s published counts: rows per global expert, then its T and its bound.
__device__ __forceinline__ const u32* published_counts(const FusedRegions& r, int src) {
    return reinterpret_cast<const u32*>(reinterpret_cast<const char*>(r.peer_base[src]) + r.off_counts);
}

// Walks the units of the plan in order: unit u is chunk c of local expert j.
struct UnitWalker {
    const u32* block_first;  // [E_l + 1] exclusive scan of m-blocks per expert
    u32 experts, j = 0, c = 0;
    // The next unit's first block and block count.
    __device__ __forceinline__ void next(u32& first, u32& n) {
        while (block_first[j] + c * kUnitBlocks >= block_first[j + 1]) {
            ++j;
            c = 0;
        }
        first = block_first[j] + c * kUnitBlocks;
        n = min(kUnitBlocks, block_first[j + 1] - first);
        ++c;
    }
};

// CTA 0, every thread: the plan of this call from the published counts. `scratch`: 2·(E_l + 1)
// words of shared memory.
__device__ void build_plan(const FusedRegions& r, u32* scratch) {
    const u32 R = r.ranks, El = r.experts / r.ranks, me = r.rank;
    u32* rows = scratch;              // [E_l]
    u32* block_first = scratch + El + 1;  // [E_l + 1]
    u32* src_base = plan_src_base(r);
    for (u32 j = threadIdx.x; j < El; j += blockDim.x) {
        u32 run = 0;
        for (u32 src = 0; src < R; ++src) {
            src_base[j * R + src] = run;
            run += published_counts(r, src)[me * El + j];
        }
        rows[j] = run;
    }
    __syncthreads();
    __shared__ u32 s_units;
    if (threadIdx.x == 0) {
        u32 b = 0, u = 0;
        for (u32 j = 0; j < El; ++j) {
            block_first[j] = b;
            const u32 nb = (rows[j] + kBlockM - 1) / kBlockM;
            b += nb;
            u += (nb + kUnitBlocks - 1) / kUnitBlocks;
        }
        block_first[El] = b;
        s_units = u;
    }
    __syncthreads();
    const u32 n_blocks = block_first[El];
    PlanHeader* h = plan_header(r);
    const bool overflow = n_blocks > u32(r.max_blocks) || (r.lag_units == 0 && n_blocks > u32(r.ring_slots));
    if (!overflow) {
        BlockInfo* blocks = plan_blocks(r);
        for (u32 j = threadIdx.x; j < El; j += blockDim.x) {
            for (u32 m = 0; block_first[j] + m < block_first[j + 1]; ++m) {
                blocks[block_first[j] + m] = BlockInfo{j, m * kBlockM, min(kBlockM, rows[j] - m * kBlockM), 0};
            }
        }
    }
    if (threadIdx.x == 0) {
        u32 ns = 0, task = 0;
        if (!overflow) {
            Segment* segs = plan_segments(r);
            UnitWalker l1{block_first, El}, l2{block_first, El};
            auto emit = [&](u32 kind, UnitWalker& w) {
                u32 first, n;
                w.next(first, n);
                segs[ns++] = Segment{kind, first, n, task};
                task += n * u32(kind == kL1 ? r.n1 : r.n2);
            };
            const u32 units = s_units, lag = r.lag_units;
            u32 l2_next = 0;
            if (lag == 0) {
                for (u32 u = 0; u < units; ++u) emit(kL1, l1);
            } else {
                for (u32 gs = 0; gs < units; gs += kGroupUnits) {
                    const u32 ge = min(gs + kGroupUnits, units);
                    for (u32 u = gs; u < ge; ++u) emit(kL1, l1);
                    for (; l2_next + lag < ge; ++l2_next) emit(kL2, l2);
                }
            }
            for (; l2_next < units; ++l2_next) emit(kL2, l2);
        }
        *h = PlanHeader{n_blocks, ns, task, overflow ? u32(kRingOverflow) : 0u};
    }
}

// One role's walk over its tasks (each role of a CTA keeps its own).
struct TaskCursor {
    const Segment* segs;
    u32 n1, n2;
    u32 s = 0;
    Segment cur;
    u32 cur_end;  // first task after the current segment

    __device__ __forceinline__ TaskCursor(const FusedRegions& r)
        : segs(plan_segments(r)), n1(r.n1), n2(r.n2) {
        load();
    }

    __device__ __forceinline__ void load() {
        cur = segs[s];
        cur_end = cur.first_task + cur.n_blocks * (cur.kind == kL1 ? n1 : n2);
    }

    // Task i (callers pass increasing i below the stream's task count): its kind, m-block and
    // n-block.
    __device__ __forceinline__ void get(u32 i, u32& kind, u32& block, u32& n) {
        while (i >= cur_end) {
            ++s;
            load();
        }
        const u32 local = i - cur.first_task;
        kind = cur.kind;
        n = local / cur.n_blocks;
        block = cur.first_block + local % cur.n_blocks;
    }
};

}  // namespace megamoe::layer
