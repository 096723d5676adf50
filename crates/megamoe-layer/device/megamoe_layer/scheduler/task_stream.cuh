// The call's plan and task stream (megamoe-core plan/stream.rs, built here the same): m-blocks of 128
// rows in local-expert order, units of up to 8 consecutive m-blocks of one expert, and the
// stream of segments (one kind of task over one unit, n-block outer, m-block inner). A single
// wave runs every unit's L1 tasks, then every unit's L2 tasks; a lagged stream emits L1 tasks a
// group of 4 units at a time, each group followed by the L2 tasks of the units that fell `lag`
// units behind. Block b lives in ring slot b mod ring_slots.
//
// CTA 0 builds the plan into the rank's buffer once every rank's routing is published; the
// grid barrier that follows makes it visible to every CTA. Each CTA's producer then claims the
// stream's next task (PlanHeader::next_task), finds it with a TaskCursor and hands it to its
// consumers and releaser (scheduler/task_queue.cuh): every CTA's tasks are in stream order.
#pragma once
#include <megamoe/common.cuh>
#include <megamoe_layer/comm/flags.cuh>
#include <megamoe_layer/impls/fused_params.cuh>

namespace megamoe::layer {

__device__ __forceinline__ char* local_buf(const FusedRegions& r) {
    return reinterpret_cast<char*>(r.peer_base[r.rank]);
}
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

__device__ __forceinline__ u32 div_up(u32 a, u32 b) { return (a + b - 1) / b; }

// Exclusive prefix sum of `v` over the CTA's threads in thread order; `total` gets the sum.
// Every thread calls it; `tmp`: 32 words of shared memory.
__device__ u32 cta_exclusive_scan(u32 v, u32* tmp, u32& total) {
    const u32 lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    u32 x = v;
#pragma unroll
    for (u32 o = 1; o < 32; o <<= 1) {
        const u32 y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) tmp[warp] = x;
    __syncthreads();
    if (warp == 0) {
        u32 w = lane < warps ? tmp[lane] : 0;
#pragma unroll
        for (u32 o = 1; o < 32; o <<= 1) {
            const u32 y = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += y;
        }
        if (lane < warps) tmp[lane] = w;
    }
    __syncthreads();
    total = tmp[warps - 1];
    const u32 before = x - v + (warp > 0 ? tmp[warp - 1] : 0);
    __syncthreads();
    return before;
}

// The segment at stream position p (0 <= p < 2·units): its kind and unit. A single wave
// (lag 0) runs every unit's L1, then every unit's L2. A lagged stream runs the L1 of groups of
// kGroupUnits units, each followed by the L2 of the units that then lie `lag` units behind the
// L1 frontier, and the L2 of the last `lag` units at the end: group g (the tail: g = groups)
// starts at position f + l2(f), f = min(4g, units) units' L1 before it, where l2(f) =
// max(0, f − lag) units' L2 run before L1 frontier f.
__device__ __forceinline__ void stream_position(u32 p, u32 units, u32 lag, u32& kind, u32& unit) {
    if (lag == 0) {
        kind = p < units ? kL1 : kL2;
        unit = p < units ? p : p - units;
        return;
    }
    auto l2_before = [&](u32 frontier) { return frontier > lag ? frontier - lag : 0; };
    auto group_start = [&](u32 g) {
        const u32 f = min(g * kGroupUnits, units);
        return f + l2_before(f);
    };
    // The last group (or the tail, g = groups) that starts at or before p.
    u32 lo = 0, hi = div_up(units, kGroupUnits);
    while (lo < hi) {
        const u32 mid = (lo + hi + 1) / 2;
        if (group_start(mid) <= p)
            lo = mid;
        else
            hi = mid - 1;
    }
    const u32 g = lo, first_l1 = g * kGroupUnits, off = p - group_start(g);
    const u32 l1_units = min(first_l1 + kGroupUnits, units) - min(first_l1, units);
    kind = off < l1_units ? kL1 : kL2;
    unit = off < l1_units ? first_l1 + off : l2_before(min(first_l1, units)) + off - l1_units;
}

// CTA 0, every thread: the plan of this call from the published counts, the same as
// megamoe-core's Stream::build (the selftest compares them). Every step is spread over the
// threads (each takes a contiguous run of experts, then of stream positions) with two prefix
// sums, so that no thread walks the whole plan. `scratch`: 3·(E_l + 1) + 32 words of shared
// memory.
__device__ void build_plan(const FusedRegions& r, u32* scratch) {
    const u32 R = r.ranks, El = r.experts / r.ranks, me = r.rank;
    u32* rows = scratch;                     // [E_l]
    u32* block_first = rows + El + 1;        // [E_l + 1] exclusive scan of m-blocks per expert
    u32* unit_first = block_first + El + 1;  // [E_l + 1] exclusive scan of units per expert
    u32* tmp = unit_first + El + 1;          // [32]
    u32* src_base = plan_src_base(r);
    const u32 per = div_up(El, blockDim.x);
    const u32 j0 = min(El, threadIdx.x * per), j1 = min(El, j0 + per);
    u32 my_blocks = 0, my_units = 0;
    for (u32 j = j0; j < j1; ++j) {
        u32 run = 0;
        for (u32 src = 0; src < R; ++src) {
            src_base[j * R + src] = run;
            run += published_counts(r, src)[me * El + j];
        }
        rows[j] = run;
        my_blocks += div_up(run, kBlockM);
        my_units += div_up(div_up(run, kBlockM), kUnitBlocks);
    }
    u32 n_blocks, units;
    u32 b = cta_exclusive_scan(my_blocks, tmp, n_blocks);
    u32 u = cta_exclusive_scan(my_units, tmp, units);
    ExpertL2* experts = expert_l2(r);
    for (u32 j = j0; j < j1; ++j) {
        block_first[j] = b;
        unit_first[j] = u;
        experts[j].owed = div_up(rows[j], kBlockM) * u32(r.n2) * 2;
        b += div_up(rows[j], kBlockM);
        u += div_up(div_up(rows[j], kBlockM), kUnitBlocks);
    }
    if (threadIdx.x == 0) {
        block_first[El] = n_blocks;
        unit_first[El] = units;
    }
    __syncthreads();
    PlanHeader* h = plan_header(r);
    const bool overflow = n_blocks > u32(r.max_blocks) || (r.lag_units == 0 && n_blocks > u32(r.ring_slots));
    if (overflow) {
        if (threadIdx.x == 0) *h = PlanHeader{n_blocks, 0, 0, u32(kRingOverflow), 0};
        return;
    }
    BlockInfo* blocks = plan_blocks(r);
    for (u32 j = j0; j < j1; ++j) {
        for (u32 m = 0; block_first[j] + m < block_first[j + 1]; ++m) {
            blocks[block_first[j] + m] = BlockInfo{j, m * kBlockM, min(kBlockM, rows[j] - m * kBlockM), 0};
        }
    }
    // The segment at position p: its unit is chunk c of local expert j (the last j whose first
    // unit is at or before it).
    const u32 n_segments = 2 * units, lag = r.lag_units;
    auto segment = [&](u32 p) {
        u32 kind, unit;
        stream_position(p, units, lag, kind, unit);
        u32 lo = 0, hi = El - 1;
        while (lo < hi) {
            const u32 mid = (lo + hi + 1) / 2;
            if (unit_first[mid] <= unit)
                lo = mid;
            else
                hi = mid - 1;
        }
        const u32 first = block_first[lo] + (unit - unit_first[lo]) * kUnitBlocks;
        return Segment{kind, first, min(kUnitBlocks, block_first[lo + 1] - first), 0};
    };
    auto tasks_of = [&](const Segment& s) { return s.n_blocks * u32(s.kind == kL1 ? r.n1 : r.n2); };
    const u32 pp = div_up(n_segments, blockDim.x);
    const u32 p0 = min(n_segments, threadIdx.x * pp), p1 = min(n_segments, p0 + pp);
    u32 my_tasks = 0;
    for (u32 p = p0; p < p1; ++p) my_tasks += tasks_of(segment(p));
    u32 n_tasks;
    u32 task = cta_exclusive_scan(my_tasks, tmp, n_tasks);
    Segment* segs = plan_segments(r);
    for (u32 p = p0; p < p1; ++p) {
        Segment s = segment(p);
        s.first_task = task;
        task += tasks_of(s);
        segs[p] = s;
    }
    if (threadIdx.x == 0) *h = PlanHeader{n_blocks, n_segments, n_tasks, 0, 0};
}

// One role's walk over its tasks (each role of a CTA keeps its own).
struct TaskCursor {
    const Segment* segs;
    u32 n1, n2;
    u32 s = 0;
    Segment cur;
    u32 cur_end;  // first task after the current segment

    __device__ __forceinline__ TaskCursor(const FusedRegions& r) : segs(plan_segments(r)), n1(r.n1), n2(r.n2) {
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
