// The fused MoE layer (SPEC §4 fused): one persistent launch per rank. One CTA per SM, in the
// GEMM's warp roles (megamoe_gemm/pipeline/roles.cuh): warpgroups 0 and 1 run the wgmma
// consumers of both GEMMs, warp 8 the TMA producer, warps 9-10 the token pull (comm/pull.cuh),
// warp 11 the releaser, which raises the block counters for the consumers (release_slices).
//
//   1. routing: count this rank's slots per expert and list them (send lists); publish T and
//      the bound; raise kRoutingReady everywhere and wait for every rank's.
//   2. plan: every CTA checks the bounds every rank published (all ranks reach the same
//      verdict, so a mismatch is an error on every rank, never a hang); CTA 0 builds the
//      m-blocks and the task stream (scheduler/task_stream.cuh); every CTA zeroes its share of
//      the block and expert counters; grid barrier.
//   3. tasks: the producer replays the stream (an L1 task waits for its block's rows, an L2
//      task for its block's L1 tasks) and hands each task to the consumers through shared
//      memory (scheduler/task_queue.cuh), the consumers run L1 with the SwiGLU + weight +
//      re-quantization epilogue into the ring and L2 with the scatter epilogue to the tokens'
//      ranks, the releaser raises each block counter once a warpgroup's slice of it is
//      written, and the pull fills ring slots once the slot's previous block is through L2.
//   4. the consumer warpgroups (the producer warpgroup is done): raise kRowsWritten everywhere;
//      wait for every rank's, each warp combining meanwhile those of its items (tokens, or their
//      column chunks at decode sizes) whose experts have all written their rows (the expert
//      flags, raised by the releaser); combine the rest of this rank's tokens in slot order;
//      zero the published counts for the next call.
//
// The launch is a programmatic dependent one: barrier init and descriptor prefetch overlap the
// kernel before it on the stream, and nothing in global memory is touched before it completes.
//
// Ring slots and block counters live in this rank's buffer and are private to it; what peers
// touch (inputs, counts, send lists, combine rows) is ordered by the two signals, so
// consecutive calls need no barrier across ranks at entry or exit.
#pragma once
#include <megamoe/ptx/mbarrier.cuh>
#include <megamoe/ptx/sync.cuh>
#include <megamoe/ptx/tma.cuh>
#include <megamoe_ep/comm/sync.cuh>
#include <megamoe_gemm/layout/smem_layout.cuh>
#include <megamoe_gemm/mma/fp8_mainloop.cuh>
#include <megamoe_gemm/pipeline/roles.cuh>
#include <megamoe_gemm/pipeline/tma_producer.cuh>
#include <megamoe_layer/comm/combine.cuh>
#include <megamoe_layer/comm/flags.cuh>
#include <megamoe_layer/comm/pull.cuh>
#include <megamoe_layer/epilogue/scatter_rows.cuh>
#include <megamoe_layer/epilogue/swiglu_quant.cuh>
#include <megamoe_layer/impls/fused_params.cuh>
#include <megamoe_layer/impls/fused_trace.cuh>
#include <megamoe_layer/scheduler/task_queue.cuh>
#include <megamoe_layer/scheduler/task_stream.cuh>

namespace megamoe::layer {

// The GEMM's warp roles and register budgets (megamoe_gemm/pipeline/roles.cuh); the producer
// warpgroup's other warps pull and release.
using gemm::kConsumerRegs;
using gemm::kMathWarps;
using gemm::kProducerRegs;
using gemm::kProducerWarp;
constexpr u32 kPullWarps = 2;
constexpr u32 kReleaserWarp = kProducerWarp + 1 + kPullWarps;
// Tasks the producer may hand over ahead of the consumers (scheduler/task_queue.cuh): it runs
// ahead by the ring of stages, which is more than one task only where K is a few blocks.
constexpr u32 kTaskSlots = 4;
using FusedTaskQueue = TaskQueue<kTaskSlots>;

// Step 1: slot i = t·K + k of this rank naming expert e gets the next position of e's send
// list. Each CTA takes a contiguous share of the slots, counts them per expert in shared memory
// (`scratch`: 2·E words), reserves each expert's run with one global atomic, then places its
// slots in that run: one global atomic per CTA and expert instead of one per slot, which
// serialize on an expert's counter. A token's row may sit anywhere in its expert's rows; each
// row's arithmetic is independent of its position, so the output bits are not.
__device__ void publish_routing(const FusedRegions& r, u32* scratch) {
    char* me = local_buf(r);
    const i32* idx = reinterpret_cast<const i32*>(me + r.off_topk_idx);
    u32* counts = reinterpret_cast<u32*>(me + r.off_counts);
    u32* send = reinterpret_cast<u32*>(me + r.off_send_list);
    const u32 n = u32(r.tokens) * r.topk, E = r.experts;
    const u32 share = (n + gridDim.x - 1) / gridDim.x;
    const u32 lo = min(n, blockIdx.x * share), hi = min(n, lo + share);
    u32* placed = scratch;   // [E] this CTA's slots of e counted, then placed
    u32* run = scratch + E;  // [E] the first position of this CTA's run in e's send list
    for (u32 e = threadIdx.x; e < E; e += blockDim.x) placed[e] = 0;
    __syncthreads();
    for (u32 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const i32 e = idx[i];
        if (e >= 0 && e < r.experts) atomicAdd(&placed[e], 1u);
    }
    __syncthreads();
    for (u32 e = threadIdx.x; e < E; e += blockDim.x) {
        const u32 c = placed[e];
        run[e] = c != 0 ? atomicAdd(&counts[e], c) : 0;
        placed[e] = 0;
    }
    __syncthreads();
    for (u32 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const i32 e = idx[i];
        if (e >= 0 && e < r.experts) send[u64(e) * r.t_cap + run[e] + atomicAdd(&placed[e], 1u)] = i;
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        counts[r.experts] = r.tokens;
        counts[r.experts + 1] = r.bound;
    }
    // The scratch is the ring's first stage, which TMA writes later.
    ptx::fence_proxy_async_shared();
}

// Step 2: 0 when every rank passed this rank's bound and none has more tokens, else kBadBound
// (recorded once, by CTA 0, naming the first offending rank).
__device__ u32 check_bounds(const FusedRegions& r, const ep::comm::Signals& sig) {
    for (int src = 0; src < r.ranks; ++src) {
        const u32* c = published_counts(r, src);
        const u32 t = c[r.experts], bound = c[r.experts + 1];
        if (bound != u32(r.bound) || t > bound || bound > u32(r.t_cap)) {
            if (blockIdx.x == 0)
                ep::comm::record_error(sig, kBadBound, src, src, bound != u32(r.bound) ? bound : t, r.bound);
            return kBadBound;
        }
    }
    return 0;
}

// Step 2, CTA 0 of a call every rank passed: adds the rows every rank routes to each of this
// rank's experts (their published counts) to the caller's cumulative statistics.
__device__ void count_received(const FusedRegions& r) {
    const u32 local = u32(r.experts) / u32(r.ranks);
    for (u32 j = threadIdx.x; j < local; j += blockDim.x) {
        u32 rows = 0;
        for (int src = 0; src < r.ranks; ++src) rows += published_counts(r, src)[u32(r.rank) * local + j];
        atomicAdd(reinterpret_cast<int*>(r.recv_stats) + j, int(rows));
    }
}

__device__ __forceinline__ gemm::Tile task_tile(const FusedRegions& r, const BlockInfo* blocks, u32 b, u32 n) {
    const BlockInfo blk = blocks[b];
    return gemm::Tile{blk.expert, 0, n * kBlockN, (b % r.ring_slots) * kBlockM, blk.rows, false};
}

// The producer lane: claims the stream's next task (PlanHeader::next_task, one atomic add, so
// tasks are claimed in stream order and a CTA that streams its tiles faster takes more) until
// none is left, then hands over kNoTask; for each it waits for its block's counter and loads its
// tiles. Every wait of a task is on tasks before it in the stream, claimed before it by CTAs
// that run their tasks in order: the earliest unfinished task always progresses.
template <int kStages, bool kProbe, typename L1Smem, typename L2Smem>
__device__ void produce(const FusedParams& p, const FusedProbe& probe, const L1Smem& s1, const L2Smem& s2, u32 n_tasks,
                        FusedTaskQueue& queue) {
    const FusedRegions& r = p.r;
    TaskCursor cur(r);
    gemm::RingCursor<kStages> ring;
    BlockFlags* flags = block_flags(r);
    const BlockInfo* blocks = plan_blocks(r);
    u32* next_task = &plan_header(r)->next_task;
    for (u32 j = 0;; ++j) {
        const u32 i = atomicAdd(next_task, 1u);
        if (i >= n_tasks) {
            queue.push(r, j, TaskDesc{kNoTask, 0, 0, 0, {}});
            // The timeline's reader stops at this CTA's first slot without a start (a CTA's
            // count of claimed tasks differs between calls).
            if (kProbe && probe.trace != 0)
                if (TaskTrace* end = task_trace(r, probe.trace, j)) end->wg[0][0] = 0;
            return;
        }
        u32 kind, b, n;
        cur.get(i, kind, b, n);
        const gemm::Tile t = task_tile(r, blocks, b, n);
        queue.push(r, j, TaskDesc{i, kind, b, n, t});
        TaskTrace* trace = nullptr;
        if (kProbe && probe.trace != 0) trace = task_trace(r, probe.trace, j);
        if (trace != nullptr) {
            trace->kind = kind;
            trace->block = b;
            trace->wait_start = ptx::globaltimer_ns();
        }
        if (kind == kL1) {
            // The L1 frontier: the pull of block b + pull_ahead may start.
            if (n == 0) reinterpret_cast<volatile u32*>(&flags[b].l1_started)[0] = 1;
            if (!wait_flag(r, &flags[b].rows_pulled, t.rows_valid, kWaitRowsPulled, b)) return;
            if (trace != nullptr) trace->wait_end = ptx::globaltimer_ns();
            gemm::load_tile<false, 1>(p.l1, t, 0, s1, ring);
        } else {
            if (!wait_flag(r, &flags[b].l1_done, 2 * r.n1, kWaitL1Done, b)) return;
            if (trace != nullptr) trace->wait_end = ptx::globaltimer_ns();
            gemm::load_tile<false, 1>(p.l2, t, 0, s2, ring);
        }
        if (trace != nullptr) trace->issued = ptx::globaltimer_ns();
    }
}

// A consumer warp is done with its part of a warpgroup's slice: it counts itself in the
// warpgroup's slice counter in shared memory (a CTA-scope release after the warp's barrier,
// which orders every lane's writes before it).
__device__ __forceinline__ void finish_slice(u32* slices_done) {
    __syncwarp();
    if (threadIdx.x % 32 == 0) ptx::red_release_cta_shared_add_u32(slices_done, 1);
}

// An L2 task of local expert j is written (both warpgroups' slices, acquired): its two
// warpgroup-tasks are counted, and the task that completes the expert raises the expert's flag
// to this call on every rank (the early combine, comm/combine.cuh). The count is an acq_rel
// chain over every task of the expert, and the flag a system-scope release after it: whoever
// acquires the flag sees every row of the expert.
__device__ void count_expert_task(const FusedRegions& r, u32 j, u64 epoch) {
    ExpertL2& e = expert_l2(r)[j];
    if (ptx::atomic_add_acq_rel_gpu_u32(&e.done, 2) + 2 != e.owed) return;
    const u32 global = u32(r.rank) * (u32(r.experts) / u32(r.ranks)) + j;
    for (int rank = 0; rank < r.ranks; ++rank) ptx::st_release_sys(expert_done(r, rank) + global, epoch);
}

// The releaser (warp 11, one lane): takes this CTA's tasks from the queue in the consumers' order
// and, once all four warps of a warpgroup have counted its slice of task j (4·(j+1) in its
// counter, acquired), raises the block's counter with a gpu-scope release. The release is
// cumulative: it covers the consumers' writes it acquired, so readers of the block counter
// see the slice (and order their TMA loads after their acquire, comm/flags.cuh). The consumers
// never wait for their stores to become visible; this warp does, off their path.
__device__ void release_slices(const FusedRegions& r, const u32* slices_done, FusedTaskQueue& queue, u64 epoch) {
    BlockFlags* flags = block_flags(r);
    const BlockInfo* blocks = plan_blocks(r);
    for (u32 j = 0;; ++j) {
        const TaskDesc d = queue.pop_lane(r, j);
        if (d.index == kNoTask) return;
        u32* flag = d.kind == kL1 ? &flags[d.block].l1_done : &flags[d.block].l2_done;
        for (u32 wg = 0; wg < 2; ++wg) {
            if (!wait_slices(r, &slices_done[wg], 4 * (j + 1), d.block)) return;
            ptx::red_release_gpu_add_u32(flag, 1);
        }
        if (d.kind == kL2) count_expert_task(r, blocks[d.block].expert, epoch);
    }
}

template <int kStages, bool kRescaled, bool kProbe, typename L1Smem, typename L2Smem>
__device__ void consume(const FusedParams& p, const FusedProbe& probe, const L1Smem& s1, const L2Smem& s2, u32 wg,
                        u32* slices_done, FusedTaskQueue& queue) {
    const FusedRegions& r = p.r;
    // A warpgroup's slice: 64 rows, two 128-column waves (for L1 a gate block and its up block).
    using Scales = gemm::TileWeightScales<128, 2, L1Smem::kScaleBRowFloats>;
    const u32 a_off = wg * 64;
    gemm::RingCursor<kStages> ring;
    const ScatterRows scatter{r};
    // The task's indices are broadcast from lane 0 (ptx::warp_uniform, in the queue's pop): as
    // per-thread values (loads) the branch on the task's kind would count as divergent, and the
    // ring's stage and phase, advanced inside it, would leave the uniform registers: every
    // wgmma descriptor would then be rebuilt per thread and moved back (R2UR) in the K loop,
    // which took about 9 % longer.
    u32 j = 0;
    TaskDesc task = queue.pop(r, j);
    if (task.index == kNoTask) return;
    u32 kind = task.kind;
    gemm::Tile t = task.tile;
    Scales scales;
    scales.load(kind == kL1 ? p.l1 : p.l2, t, 0);
    // The timeline's writer in each warpgroup (the probe's fields are read where used, from the
    // launch's parameters: no register holds them across the mainloop).
    // Its slot of this CTA's j-th task, or null (impls/fused_trace.cuh).
    auto trace = [&](u32 task_j) {
        return kProbe && probe.trace != 0 && threadIdx.x % 128 == 0 ? task_trace(r, probe.trace, task_j) : nullptr;
    };
    while (true) {
        if (TaskTrace* tt = trace(j)) tt->wg[wg][0] = ptx::globaltimer_ns();
        scales.stage(s1.scale_b(wg), wg);
        // Both epilogues' row data (an L1 slice reads weights, an L2 slice destinations):
        // deciding by kind here would keep one more register across the K loop.
        p.swiglu.prefetch(t.a_row + a_off);
        scatter.prefetch(t.a_row + a_off);
        float sum[2][64];
        // The kind once more through lane 0: uniform as it is (the queue's pop), the compiler
        // loses track of it across the loop and the ring leaves the uniform registers (the K
        // loop 248 instructions with 32 R2UR instead of 217 with none, measured slower).
        // A warpgroup whose 64 rows are all padding (warpgroup 1 in most tasks at decode sizes,
        // and in a segment's last block at prefill) only takes its turn at the stages: its slice
        // is never stored (below), and the other warpgroup's wgmmas run alone. Either GEMM's view
        // of the ring places the barriers alike, so s1 serves both.
        const u32 kind_u = ptx::warp_uniform(kind);
        if (ptx::warp_uniform(u32(t.rows_valid <= a_off)) != 0) {
            gemm::tile_k_turns<1>(kind_u == kL1 ? p.l1 : p.l2, s1, ring);
        } else if (kind_u == kL1) {
            gemm::slice_k_loop<kRescaled, 128, 2, 1, 0>(p.l1, s1, ring, t, wg, a_off, 0, sum);
        } else {
            gemm::slice_k_loop<kRescaled, 128, 2, 1, 0>(p.l2, s2, ring, t, wg, a_off, 0, sum);
        }
        if (TaskTrace* tt = trace(j)) tt->wg[wg][1] = ptx::globaltimer_ns();
        // The next task's weight scales load while this one's epilogue runs (the producer
        // handed it over before its last stages of this one).
        task = queue.pop(r, j + 1);
        const bool more = ptx::warp_uniform(task.index) != kNoTask;
        u32 next_kind = 0;
        gemm::Tile next_t = t;
        if (more) {
            next_kind = task.kind;
            next_t = task.tile;
            scales.load(next_kind == kL1 ? p.l1 : p.l2, next_t, 0);
        }
        const u32 rows_valid = t.rows_valid > a_off ? t.rows_valid - a_off : 0;
        // A warp whose 16 rows of the slice are all padding writes nothing: each row of the
        // L2 GEMM is its own, and a padding row's output is never stored (ScatterRows skips
        // such warps too). That is a block's last rows, and most of every block at decode sizes.
        if (kind == kL1) {
            if (ptx::warp_index_uniform() % 4 * 16 < rows_valid)
                p.swiglu.store(s1.staging(wg), wg, t.a_row + a_off, t.n0, rows_valid, sum);
        } else {
            scatter.store(s1.staging(wg), wg, t.a_row + a_off, t.n0, rows_valid, sum);
        }
        finish_slice(&slices_done[wg]);
        if (TaskTrace* tt = trace(j)) tt->wg[wg][2] = ptx::globaltimer_ns();
        if (!more) break;
        ++j;
        kind = next_kind;
        t = next_t;
    }
}

// The consumer warpgroups' own barrier for the combine step.
__device__ __forceinline__ void consumers_sync() {
    gemm::named_barrier_sync(gemm::NamedBarrier::kConsumers, kMathWarps * 32);
}

// ep::comm::raise_on_all for kRowsWritten, over the consumer threads only: every L2 row this
// CTA wrote is visible system-wide before each rank's counter grows (by kUnit per launch).
// `trace`: the timeline's CTA record (thread 0 of a traced call), else null.
__device__ __forceinline__ void raise_rows_written(const ep::comm::Signals& sig, CtaTrace* trace) {
    __threadfence_system();
    if (trace != nullptr) trace->fenced = ptx::globaltimer_ns();
    consumers_sync();
    if (threadIdx.x < sig.ranks) {
        const u64 add = ptx::ctaid_x() == 0 ? ep::comm::kUnit - (gridDim.x - 1) : 1;
        ptx::red_release_sys_add(ep::comm::signal(sig, threadIdx.x, kRowsWritten, sig.rank), add);
    }
    if (trace != nullptr) trace->raised = ptx::globaltimer_ns();
}

// ep::comm::wait_all for kRowsWritten, by each consumer warp on its own, with the early
// combine (comm/combine.cuh): until every rank has signalled its L2 rows, the warp combines those
// of its tokens whose experts have all written theirs (when `run`: this call runs), marking them
// in `combined`. False when the deadline passed (recorded, naming the rank waited for).
__device__ bool wait_rows_written(const FusedRegions& r, const ep::comm::Signals& sig, u64 epoch, u32 warp, bool run,
                                  u32& combined) {
    const u32 lane = threadIdx.x % 32;
    const u64 target = epoch * ep::comm::kUnit;
    const u64* f = ep::comm::signal(sig, sig.rank, kRowsWritten, lane < u32(sig.ranks) ? lane : 0);
    const auto deadline = comm::Deadline::after(sig.deadline_ns);
    while (true) {
        const u64 v = lane < u32(sig.ranks) ? ptx::ld_acquire_sys(f) : target;
        if (__all_sync(0xffffffffu, v >= target)) break;
        if (__any_sync(0xffffffffu, deadline.expired())) {
            if (v < target)
                comm::report_timeout(sig.wait_record, ep::comm::wait_of(kRowsWritten), sig.rank, lane, v, target);
            return false;
        }
        const u32 before = combined;
        if (run) combined = combine_ready_rows(r, warp, kMathWarps, epoch, combined);
        if (combined == before) __nanosleep(256);
    }
    __syncwarp();
    return true;
}

// kRescaled: the opt-in accumulation, the running sum kept in the wgmma accumulators
// (gemm::tile_k_loop_rescaled); the default promotes each scale group (gemm::tile_k_loop).
// kProbe: the probe instantiation, which records the timeline (impls/fused_trace.cuh) when
// probe.trace is not 0 and injects probe.fault when this rank is probe.fault_rank; the default
// kernel passes kProbe = false and has none of it.
template <int kStages, int kGroup, bool kRescaled, bool kProbe>
__device__ __forceinline__ void fused_moe(const FusedParams& p, const FusedProbe& probe) {
    // Both GEMMs run over one ring of stages: L1's activation scales come per 128 columns, L2's
    // per G; a stage has room for the larger count, so both views place every region alike.
    constexpr int kSaCols = kGroup == 64 ? 2 : 1;
    using L1Smem = gemm::SmemLayout<128, 256, kStages, 128, kSaCols>;
    using L2Smem = gemm::SmemLayout<128, 256, kStages, kGroup, kSaCols>;
    extern __shared__ u8 smem_raw[];
    u8* base = smem_raw + ((1024 - (ptx::smem_addr(smem_raw) & 1023)) & 1023);
    const L1Smem s1{base};
    const L2Smem s2{base};
    __shared__ int s_ok;
    __shared__ u32 s_bad;
    __shared__ u64 s_epoch;
    __shared__ u32 s_pull_items;
    __shared__ bool s_run;            // every rank passed the bounds and the plan fits: run the tasks
    __shared__ u32 s_slices_done[2];  // per consumer warpgroup: warp-slices written (finish_slice)
    __shared__ FusedTaskQueue s_tasks;
    const FusedRegions& r = p.r;
    const ep::comm::Signals sig{r.peer_base, r.off_epochs,  r.off_signals,
                                r.off_error, r.deadline_ns, reinterpret_cast<comm::WaitRecord*>(r.wait_record),
                                r.rank,      r.ranks};
    const u32 warp = ptx::warp_index_uniform();
    const bool tracer = kProbe && probe.trace != 0 && threadIdx.x == 0;
    const u64 start_ns = tracer ? ptx::globaltimer_ns() : 0;
    // The fault this rank injects, read from the launch's parameters where tested: a register
    // would be held across the consumers' task loop.
    auto my_fault = [&] { return kProbe && u32(p.r.rank) == probe.fault_rank ? probe.fault : u32(kNoFault); };

    if (threadIdx.x == kProducerWarp * 32) {
        ptx::tma_prefetch_desc(&p.l1.tma_a);
        ptx::tma_prefetch_desc(&p.l1.tma_b);
        ptx::tma_prefetch_desc(&p.l1.tma_sa);
        ptx::tma_prefetch_desc(&p.l2.tma_a);
        ptx::tma_prefetch_desc(&p.l2.tma_b);
        ptx::tma_prefetch_desc(&p.l2.tma_sa);
    }
    if (threadIdx.x == 0) {
#pragma unroll
        for (int s = 0; s < kStages; ++s) {
            ptx::mbarrier_init(s1.full(s), 1);
            ptx::mbarrier_init(s1.empty(s), kMathWarps);
        }
        s_tasks.init(kMathWarps + 1);  // the consumer warps and the releaser
        ptx::fence_barrier_init();
    }
    // The launch is a programmatic dependent (src/fused.rs): everything above overlapped the
    // previous kernel on the stream; nothing in global memory is touched before it completes.
    ptx::grid_dependency_wait();
    if (tracer) {
        cta_trace(probe.trace)->start = start_ns;
        cta_trace(probe.trace)->combined_early = 0;
    }

    // 1. Routing.
    const u64 epoch = ep::comm::read_epoch(sig, kFusedFamily, &s_epoch);
    if (my_fault() == kSlowPeer) ep::comm::sleep_for(probe.sleep_ns);
    publish_routing(r, reinterpret_cast<u32*>(base));
    // The thread that published T overwrites it.
    if (my_fault() == kCorruptCount && blockIdx.x == 0 && threadIdx.x == 0)
        reinterpret_cast<u32*>(local_buf(r) + r.off_counts)[r.experts] = u32(r.t_cap) + 1;
    ep::comm::raise_on_all(sig, kRoutingReady);
    if (my_fault() == kStopAfterRouting) return;
    if (!ep::comm::wait_all(sig, kRoutingReady, epoch, &s_ok)) return;
    if (tracer) cta_trace(probe.trace)->routed = ptx::globaltimer_ns();

    // 2. Plan. CTA 0's scratch is the ring's first stage, idle until the grid barrier.
    if (threadIdx.x == 0) {
        s_bad = check_bounds(r, sig);
        s_slices_done[0] = s_slices_done[1] = 0;
    }
    __syncthreads();
    if (blockIdx.x == 0 && s_bad == 0 && r.recv_stats != 0) count_received(r);
    if (blockIdx.x == 0 && s_bad == 0) {
        build_plan(r, reinterpret_cast<u32*>(base));
        ptx::fence_proxy_async_shared();
    }
    {
        u32* words = reinterpret_cast<u32*>(block_flags(r));
        const u32 n = u32(r.max_blocks) * 4;
        for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) words[i] = 0;
        ExpertL2* experts = expert_l2(r);
        const u32 local = u32(r.experts) / u32(r.ranks);
        for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < local; i += gridDim.x * blockDim.x) experts[i].done = 0;
    }
    if (!grid_barrier(r, epoch, &s_ok)) return;
    if (tracer) cta_trace(probe.trace)->planned = ptx::globaltimer_ns();
    PlanHeader h = *plan_header(r);
    if (my_fault() == kStopMidTasks) h.n_tasks /= 2;
    if (threadIdx.x == 0) {
        s_pull_items = h.n_blocks * kBlockM;
        s_run = s_bad == 0 && h.status == 0;
    }
    __syncthreads();
    const bool run = s_run;
    if (blockIdx.x == 0 && threadIdx.x == 0 && s_bad == 0 && h.status != 0)
        ep::comm::record_error(sig, h.status, 0, r.rank, h.n_blocks, r.ring_slots);

    // 3. Tasks. The producer warpgroup is done after its role; the consumer warpgroups go on
    // to the combine on their own (named barrier kConsumers).
    if (warp >= kMathWarps) {
        if (run) {
            ptx::setmaxnreg_dec<kProducerRegs>();
            if (warp == kProducerWarp) {
                if (threadIdx.x % 32 == 0) produce<kStages, kProbe>(p, probe, s1, s2, h.n_tasks, s_tasks);
            } else if (warp == kReleaserWarp) {
                if (threadIdx.x % 32 == 0) release_slices(r, s_slices_done, s_tasks, epoch);
            } else {
                pull_rows(r, ptx::ctaid_x() * kPullWarps + (warp - kProducerWarp - 1), gridDim.x * kPullWarps,
                          s_pull_items);
            }
        }
        return;
    }
    if (run) {
        ptx::setmaxnreg_inc<kConsumerRegs>();
        consume<kStages, kRescaled, kProbe>(p, probe, s1, s2, warp / 4, s_slices_done, s_tasks);
    }
    if (my_fault() == kStopMidTasks || my_fault() == kStopMidCombine) return;
    if (tracer) cta_trace(probe.trace)->tasks_done = ptx::globaltimer_ns();

    // 4. Combine. Every CTA of the grid is resident (it passed the grid barrier), so the next
    // kernel on the stream may be scheduled onto the SMs this grid frees as it exits.
    if (threadIdx.x == 0) ptx::launch_dependents();
    raise_rows_written(sig, tracer ? cta_trace(probe.trace) : nullptr);
    // s_run read again: a register would be held across the consumers' whole task loop.
    u32 combined = 0;
    if (!wait_rows_written(r, sig, epoch, warp, s_run, combined)) return;
    if (tracer) cta_trace(probe.trace)->rows_written = ptx::globaltimer_ns();
    if (kProbe && probe.trace != 0 && threadIdx.x % 32 == 0)
        atomicAdd(reinterpret_cast<unsigned long long*>(&cta_trace(probe.trace)->combined_early), __popc(combined));
    if (s_run) combine_rows(r, warp, kMathWarps, combined);
    {
        u32* counts = reinterpret_cast<u32*>(local_buf(r) + r.off_counts);
        const u32 threads = kMathWarps * 32;
        for (u32 i = ptx::ctaid_x() * threads + threadIdx.x; i < u32(r.experts); i += gridDim.x * threads)
            counts[i] = 0;
    }
    if (tracer) cta_trace(probe.trace)->end = ptx::globaltimer_ns();
    ep::comm::store_epoch(sig, kFusedFamily, epoch);
}

}  // namespace megamoe::layer
