// dispatch_with_permute (SPEC §5): every rank PULLS each source token it needs once over NVLink
// and stores it straight into every final, expert-grouped, padded row it owns for that token.
// Pulling de-duplicates: a token routed to several experts of one rank crosses NVLink once.
//
// Full mode, per rank:
//   1. meta: validate topk_idx, write (idx, pos, prob) of every local slot into the local meta
//      region, where pos is the token's index among this rank's tokens routed to that expert
//      (a counting sort over the grid); push this rank's per-expert counts and T to every rank.
//   2. raise kDispatchReady everywhere; wait for it from every rank.
//   3. layout: from the count matrix every block derives segment bases and source prefixes
//      (the layout of megamoe-core's PermutePlan), checks every rank's validation status and
//      the row bound.
//   4. pull: warp per (source, token): read its meta remotely, its row once (into registers,
//      then a shared-memory chunk), and bulk-copy the chunk to each destination row (TMA
//      stores: the fan-out costs no store instructions per lane); bulk-copy a chunk of zeros to
//      every padding row; record everything the handle needs.
//   5. raise kDispatchDone on every source; wait until every rank is done reading from us.
// Cached mode (the backward of combine): steps 2, 4, 5 only, with the rows taken from the handle.
#pragma once
#include <megamoe/ptx/tma.cuh>
#include <megamoe_ep/comm/sync.cuh>

namespace ep {

constexpr int kRowUnroll = kChunkBytes / (32 * 16);  // 16-byte vectors per lane per row chunk

constexpr int kNoBadCount = 0x7fffffff;

struct DispatchShared {
    int send_base[kMaxExperts];  // seg_base[e] + rows of lower source ranks, for this rank's tokens
    int recv_base[kMaxExperts];  // [R][E_l]: first row of source s's run in local expert j
    int seg_base[kMaxExperts];   // [E_l] local segment starts
    int count[kMaxExperts];      // [E_l] local unpadded rows
    int padded[kMaxExperts];     // [E_l]
    int pad_start[kMaxExperts];  // [E_l] exclusive prefix of padding rows
    int pad_total;
    int tokens[kMaxRanks];  // T of every source rank
    int ok;
    int skip;
    int bad_count;  // the first entry of the count matrix no routing gives, else kNoBadCount
    u64 epoch;
};

__device__ __forceinline__ int* meta_of(const Layout& l, int rank) {
    return reinterpret_cast<int*>(comm::buf(l, rank) + l.off_meta);
}
__device__ __forceinline__ int* count_rows(const Layout& l) {
    return reinterpret_cast<int*>(comm::buf(l, l.rank) + l.off_counts);
}
// This rank's row (its per-expert counts, then its T) in rank d's count matrix.
__device__ __forceinline__ int* count_row_on(const Layout& l, int d) {
    return reinterpret_cast<int*>(comm::buf(l, d) + l.off_counts) + l.rank * (kMaxExperts + 1);
}
__device__ __forceinline__ int* handle_i32(const Layout& l, u64 off) { return reinterpret_cast<int*>(l.handle + off); }

// Where scale c of output row `row` goes: row-major [rows, S], or group-major [S, stride] (the
// grouped GEMM's TMA layout) when the call asks for it.
__device__ __forceinline__ size_t scale_index(const DispatchParams& p, int row, int c) {
    return p.scales_stride ? size_t(c) * p.scales_stride + row : size_t(row) * p.scales_per_row + c;
}

// Dynamic shared memory: [kWarps][2] row chunks, then one chunk of zeros.
extern __shared__ __align__(128) char dispatch_smem[];
__device__ __forceinline__ char* warp_chunks() { return dispatch_smem + (threadIdx.x >> 5) * 2 * kChunkBytes; }
__device__ __forceinline__ char* zero_chunk() { return dispatch_smem + 2 * kWarps * kChunkBytes; }

// Keeps kLoadBatch loads in flight per thread: use(i, load(i)) for i = begin, begin + step, …
// below end. A plain loop waits for each load before the next, since the load cannot pass the
// previous iteration's stores; here every batch's loads are issued before any of its stores.
constexpr int kLoadBatch = 8;
template <class Load, class Use>
__device__ __forceinline__ void for_each_loaded(int begin, int end, int step, Load load, Use use) {
    using V = decltype(load(begin));
    for (int i0 = begin; i0 < end; i0 += kLoadBatch * step) {
        V v[kLoadBatch];
#pragma unroll
        for (int u = 0; u < kLoadBatch; ++u)
            if (i0 + u * step < end) v[u] = load(i0 + u * step);
#pragma unroll
        for (int u = 0; u < kLoadBatch; ++u)
            if (i0 + u * step < end) use(i0 + u * step, v[u]);
    }
}

// Step 1 works in the dynamic shared memory (the row chunks are idle until step 4): the block's
// per-expert histogram of the slots below its tokens, its per-expert running count, and tiles
// of its own slots (expert, rank inside the block).
constexpr int kMetaTileSlots = (kDispatchDynamicSmem - 2 * kMaxExperts * 4) / 8;
static_assert(kMetaTileSlots >= 32 * kMaxTopk, "a meta tile holds at least a warp's tokens");

// Step 1, one tile: warp 0 ranks the tile's slots in order (slot order is token order, and a
// token names an expert at most once): a slot's rank is the count of earlier slots of the block
// with the same expert. Slots of one 32-slot step that share an expert find each other with
// match.any; the lowest of them advances the expert's running count.
__device__ __forceinline__ void rank_tile(const int* tile_e, int* tile_rank, int n, int* running, int E) {
    const int lane = threadIdx.x & 31;
    for (int i0 = 0; i0 < n; i0 += 32) {
        const int i = i0 + lane;
        const int e = i < n ? tile_e[i] : -1;
        const bool valid = e >= 0 && e < E;
        const u32 same = __match_any_sync(0xffffffffu, valid ? e : -1);
        const u32 before = same & megamoe::lanemask_lt();
        if (valid) tile_rank[i] = running[e] + __popc(before);
        __syncwarp();
        if (valid && before == 0) running[e] += __popc(same);
        __syncwarp();
    }
}

// Step 1: a counting sort of this rank's slots over the grid. Block b owns tokens
// [b·per, (b+1)·per) (per = ⌈T / blocks⌉). It histograms every slot below its tokens (16-byte
// loads in flight, shared atomics; warps 1…15) while warp 0 ranks its own slots stably; a
// slot's index inside its expert's run is then histogram + rank. Each token's meta row is
// idx[K], pos[K], prob bits[K]; invalid slots are reported as before. The last block sees every
// slot (below its tokens or in them): it pushes this rank's per-expert counts and T to every
// rank. Serially, a block walks only its own T·K / blocks slots; the one pass over all T·K
// slots (the last block's histogram) keeps its loads in flight.
__device__ void dispatch_meta(const DispatchParams& p, u64 epoch) {
    const Layout& l = p.l;
    const int K = l.topk, E = l.experts, T = p.tokens, G = gridDim.x, b = blockIdx.x;
    const int* idx = reinterpret_cast<const int*>(p.topk_idx);
    const float* probs = reinterpret_cast<const float*>(p.probs);
    int* meta = meta_of(l, l.rank);
    const int warp = threadIdx.x >> 5;

    const int per = (T + G - 1) / G;
    const int t0 = min(T, b * per), t1 = min(T, t0 + per);
    const bool counts_here = b == G - 1;  // its tokens end at T: every slot is below or in them
    if (t0 == t1 && !counts_here) return;

    int* below = reinterpret_cast<int*>(dispatch_smem);
    int* running = below + kMaxExperts;
    int* tile_e = running + kMaxExperts;
    int* tile_rank = tile_e + kMetaTileSlots;
    const int tile_slots = kMetaTileSlots / K * K;  // whole tokens per tile
    for (int e = threadIdx.x; e < E; e += blockDim.x) below[e] = running[e] = 0;

    const int first = t0 * K, last = t1 * K;
    int base = first;
    do {
        const int n = min(tile_slots, last - base);
        __syncthreads();  // the counters are zero, the previous tile is written out
        for_each_loaded(
            threadIdx.x, n, blockDim.x, [&](int i) { return __ldg(idx + base + i); },
            [&](int i, int e) { tile_e[i] = e; });
        __syncthreads();
        if (warp == 0) {
            rank_tile(tile_e, tile_rank, n, running, E);
        } else if (base == first) {  // four slots per 16-byte load (topk_idx is 256-byte aligned)
            auto count = [&](int e) {
                if (e >= 0 && e < E) atomicAdd(&below[e], 1);
            };
            const int h = threadIdx.x - 32, hs = blockDim.x - 32;
            for_each_loaded(
                h, first / 4, hs, [&](int i) { return __ldg(reinterpret_cast<const int4*>(idx) + i); },
                [&](int, int4 v) {
                    count(v.x);
                    count(v.y);
                    count(v.z);
                    count(v.w);
                });
            if (h < first % 4) count(__ldg(idx + first / 4 * 4 + h));
        }
        __syncthreads();
        for_each_loaded(
            threadIdx.x, n, blockDim.x, [&](int i) { return __ldg(probs + base + i); },
            [&](int i, float prob) {
                const int slot = base + i, t = slot / K, k = slot - t * K;
                const int e = tile_e[i];
                const bool valid = e >= 0 && e < E;
                int* row = meta + size_t(t) * 3 * K;
                row[k] = e;
                row[K + k] = valid ? below[e] + tile_rank[i] : 0;
                row[2 * K + k] = __float_as_int(prob);
                // The first bad slot (lowest t·K + k) of a rank is reported on every
                // rank through an epoch-tagged atomicMax; range before duplicate.
                int bad = valid || e == -1 ? -1 : slot << 1;
                for (int j = 0; j < k && bad < 0 && valid; ++j)
                    if (tile_e[i - k + j] == e) bad = (slot << 1) | 1;
                if (bad >= 0) {
                    const u64 tag = (epoch << 32) | (0xffffffffu - u32(bad));
                    for (int d = 0; d < l.ranks; ++d)
                        atomicMax(reinterpret_cast<unsigned long long*>(comm::buf(l, d) + l.off_status) + l.rank, tag);
                }
            });
        base += n;
    } while (base < last);

    if (counts_here) {  // the histogram and the running counts are final since the last tile's ranking
        for (int e = threadIdx.x; e < E; e += blockDim.x)
            for (int d = 0; d < l.ranks; ++d) count_row_on(l, d)[e] = below[e] + running[e];
        if (threadIdx.x < l.ranks) count_row_on(l, threadIdx.x)[kMaxExperts] = T;
    }
}

// Step 3: the layout of megamoe-core's plan_permute, from the exchanged count matrix. The
// matrix (with every rank's T) is first copied into shared memory in one pass; then warp d
// scans owner d's experts (32 at a time).
__device__ void dispatch_layout(const DispatchParams& p, DispatchShared& s, u64 epoch) {
    const Layout& l = p.l;
    const int R = l.ranks, E = l.experts, El = E / R, me = l.rank;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row = E + 1;  // E counts, then T
    int* counts = reinterpret_cast<int*>(dispatch_smem);
    if (threadIdx.x == 0) s.bad_count = kNoBadCount;
    for_each_loaded(
        threadIdx.x, R * row, blockDim.x,
        [&](int i) {
            const int src = i / row, j = i - src * row;
            return count_rows(l)[src * (kMaxExperts + 1) + (j == E ? kMaxExperts : j)];
        },
        [&](int i, int c) { counts[i] = c; });
    __syncthreads();
    if (threadIdx.x < R) s.tokens[threadIdx.x] = counts[threadIdx.x * row + E];
    // A count above its source's T (a token names an expert at most once) or a T above the
    // capacity is corrupt: the rows would run past their segments. Every rank reads the same
    // matrix, so every rank rejects the call.
    for (int i = threadIdx.x; i < R * row; i += blockDim.x) {
        const int src = i / row, c = counts[i];
        if (c < 0 || c > (i - src * row < E ? counts[src * row + E] : l.max_tokens)) atomicMin(&s.bad_count, i);
    }
    if (warp < R) {
        const int d = warp;
        int carry = 0;
        for (int j0 = 0; j0 < El; j0 += 32) {
            const int j = j0 + lane, e = d * El + j;
            int total = 0, below = 0;
            if (j < El)
                for (int src = 0; src < R; ++src) {
                    const int c = counts[src * row + e];
                    if (src < me) below += c;
                    total += c;
                }
            const int pad = (total + p.pad_multiple - 1) / p.pad_multiple * p.pad_multiple;
            int incl = pad;
            for (int o = 1; o < 32; o <<= 1) {
                const int v = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += v;
            }
            const int base = carry + incl - pad;
            if (j < El) {
                s.send_base[e] = base + below;
                if (d == me) {
                    s.seg_base[j] = base;
                    s.count[j] = total;
                    s.padded[j] = pad;
                    int run = base;
                    for (int src = 0; src < R; ++src) {
                        s.recv_base[src * El + j] = run;
                        run += counts[src * row + e];
                    }
                }
            }
            carry += __shfl_sync(0xffffffffu, incl, 31);
        }
    }
    __syncthreads();
    // Any rank's rejected routing (the first in rank order is recorded), else the row bound.
    if (warp == 0) {
        const u64 st = lane < R ? reinterpret_cast<volatile u64*>(comm::buf(l, me) + l.off_status)[lane] : 0;
        const u32 bad = __ballot_sync(0xffffffffu, lane < R && (st >> 32) == epoch);
        if (bad && blockIdx.x == 0 && lane == __ffs(bad) - 1)
            comm::record_error(comm::signals(l), kBadTopk, 0xffffffffu - u32(st), lane, 0, 0);
        if (lane == 0) {
            s.skip = bad != 0;
            if (!s.skip && s.bad_count != kNoBadCount) {
                s.skip = 1;
                const int src = s.bad_count / row, j = s.bad_count - src * row;
                if (blockIdx.x == 0)
                    comm::record_error(comm::signals(l), kBadCount, j, src, u32(counts[s.bad_count]),
                                       j < E ? counts[src * row + E] : l.max_tokens);
            }
            const int rows = El ? s.seg_base[El - 1] + s.padded[El - 1] : 0;
            if (!s.skip && rows > p.row_bound) {
                s.skip = 1;
                if (blockIdx.x == 0) comm::record_error(comm::signals(l), kOverflow, 0, me, rows, p.row_bound);
            }
        }
    }
    __syncthreads();
}

__device__ __forceinline__ void record_handle(const DispatchParams& p, DispatchShared& s) {
    const Layout& l = p.l;
    const int R = l.ranks, El = l.experts / R, K = l.topk;
    if (blockIdx.x == 0) {
        for (int j = threadIdx.x; j < El; j += blockDim.x) {
            handle_i32(l, l.h_padded)[j] = s.padded[j];
            handle_i32(l, l.h_counts)[j] = s.count[j];
            handle_i32(l, l.h_seg_base)[j] = s.seg_base[j];
        }
        if (threadIdx.x < R) handle_i32(l, l.h_src_tokens)[threadIdx.x] = s.tokens[threadIdx.x];
        if (threadIdx.x == 0) *handle_i32(l, l.h_total_rows) = El ? s.seg_base[El - 1] + s.padded[El - 1] : 0;
    }
    // This rank's own slots: where each one's row lives on its owner (for combine).
    const int* meta = meta_of(l, l.rank);
    for_each_loaded(
        blockIdx.x * blockDim.x + threadIdx.x, p.tokens * K, gridDim.x * blockDim.x,
        [&](int i) {
            const int t = i / K, k = i - t * K;
            return make_int2(meta[t * 3 * K + k], meta[t * 3 * K + K + k]);
        },
        [&](int i, int2 m) {
            handle_i32(l, l.h_idx)[i] = m.x;
            handle_i32(l, l.h_send_row)[i] = m.x < 0 ? -1 : s.send_base[m.x] + m.y;
        });
}

// A call that moves no rows (rejected, or a wait expired before the layout) leaves a handle of
// no rows and no tokens, so that the kernels queued after it on this rank's stream (the layer's
// GEMMs, combine) read nothing a previous call left.
__device__ __forceinline__ void record_empty_handle(const DispatchParams& p) {
    const Layout& l = p.l;
    if (blockIdx.x != 0) return;
    const int El = l.experts / l.ranks;
    for (int j = threadIdx.x; j < El; j += blockDim.x) {
        handle_i32(l, l.h_padded)[j] = 0;
        handle_i32(l, l.h_counts)[j] = 0;
        handle_i32(l, l.h_seg_base)[j] = 0;
    }
    if (threadIdx.x < l.ranks) handle_i32(l, l.h_src_tokens)[threadIdx.x] = 0;
    if (threadIdx.x == 0) *handle_i32(l, l.h_total_rows) = 0;
}

// Step 4, padding: rows past each local expert's tokens are zero, with prob 0 and scales 0.
// Warp per padding row over the whole grid (warp 0 of each block first numbers them).
__device__ void zero_padding(const DispatchParams& p, DispatchShared& s) {
    const Layout& l = p.l;
    const int El = l.experts / l.ranks, lane = threadIdx.x & 31;
    for (int i = threadIdx.x; i < kChunkBytes / 16; i += blockDim.x)
        reinterpret_cast<uint4*>(zero_chunk())[i] = make_uint4(0, 0, 0, 0);
    ptx::fence_proxy_async_shared();
    if (threadIdx.x < 32) {
        int carry = 0;
        for (int j0 = 0; j0 < El; j0 += 32) {
            const int j = j0 + lane;
            const int n = j < El ? s.padded[j] - s.count[j] : 0;
            int incl = n;
            for (int o = 1; o < 32; o <<= 1) {
                const int v = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += v;
            }
            if (j < El) s.pad_start[j] = carry + incl - n;
            carry += __shfl_sync(0xffffffffu, incl, 31);
        }
        if (lane == 0) s.pad_total = carry;
    }
    __syncthreads();
    char* me = comm::buf(l, l.rank);
    for (int i = blockIdx.x * kWarps + (threadIdx.x >> 5); i < s.pad_total; i += gridDim.x * kWarps) {
        int lo = 0, hi = El - 1;  // last expert whose padding starts at or before i
        while (lo < hi) {
            const int mid = (lo + hi + 1) >> 1;
            if (s.pad_start[mid] <= i)
                lo = mid;
            else
                hi = mid - 1;
        }
        const int row = s.seg_base[lo] + s.count[lo] + (i - s.pad_start[lo]);
        char* dst = me + l.off_out_rows + size_t(row) * p.row_bytes;
        for (int c = lane * kChunkBytes; c < p.row_bytes; c += 32 * kChunkBytes)
            ptx::bulk_store(dst + c, zero_chunk(), min(kChunkBytes, p.row_bytes - c));
        float* sc = reinterpret_cast<float*>(me + l.off_out_scales);
        for (int c = lane; c < p.scales_per_row; c += 32) sc[scale_index(p, row, c)] = 0.f;
        if (lane == 0 && p.mode == kFull) reinterpret_cast<float*>(me + l.off_out_probs)[row] = 0.f;
    }
    ptx::bulk_commit_group();
}

// Step 4, rows: warp per (source, token). Lane k < K holds slot k's destination row here (−1
// when the slot's expert is not local); the row is read once and stored to every destination.
__device__ void pull_rows(const DispatchParams& p, const DispatchShared& s) {
    const Layout& l = p.l;
    const int R = l.ranks, K = l.topk, El = l.experts / R, me = l.rank;
    const int lane = threadIdx.x & 31;
    const int V = p.row_bytes / 16, S = p.scales_per_row;
    const int* src_tokens = s.tokens;
    int total = 0;
    for (int src = 0; src < R; ++src) total += src_tokens[src];
    char* out = comm::buf(l, me);
    int* recv_slot = handle_i32(l, l.h_recv_slot);

    // Meta of the next task is loaded while the current row moves (it is remote in full mode).
    auto locate = [&](int task, int& src, int& t) {
        src = 0;
        t = task;
        while (t >= src_tokens[src]) t -= src_tokens[src++];
    };
    auto load_meta = [&](int task) {
        int m = 0;
        if (p.mode != kCached && task < total && lane < 3 * K) {
            int src, t;
            locate(task, src, t);
            m = meta_of(l, src)[size_t(t) * 3 * K + lane];
        }
        return m;
    };
    const int stride = gridDim.x * kWarps;
    char* chunks = warp_chunks();
    int half = 0;  // which of the warp's two chunks the next row chunk goes to
    int next = load_meta(blockIdx.x * kWarps + (threadIdx.x >> 5));
    for (int task = blockIdx.x * kWarps + (threadIdx.x >> 5); task < total; task += stride) {
        const int m = next;
        next = load_meta(task + stride);
        int src, t;
        locate(task, src, t);
        int* slot = recv_slot + (size_t(src) * l.max_tokens + t) * K;
        const int e = __shfl_sync(0xffffffffu, m, lane) - me * El;
        const int pos = __shfl_sync(0xffffffffu, m, (K + lane) & 31);
        const float prob = __int_as_float(__shfl_sync(0xffffffffu, m, (2 * K + lane) & 31));
        int row = -1;
        if (lane < K) {
            if (p.mode == kCached) {
                row = slot[lane];
            } else if (e >= 0 && e < El) {
                row = p.mode == kFull ? s.recv_base[src * El + e] + pos : src * l.max_tokens + t;
            }
            if (p.mode == kFull) slot[lane] = row;
        }
        if (p.mode == kUnpermuted) {  // one destination per (source, token)
            const u32 any = __ballot_sync(0xffffffffu, row >= 0);
            row = (lane == 0 && any) ? src * l.max_tokens + t : -1;
        }
        int drow[kMaxTopk];
        bool any = false;
#pragma unroll
        for (int k = 0; k < kMaxTopk; ++k) {
            drow[k] = __shfl_sync(0xffffffffu, row, k);
            if (k >= K) drow[k] = -1;
            any |= drow[k] >= 0;
        }
        if (!any) continue;
        const char* in = comm::buf(l, src) + l.off_in_rows + size_t(t) * p.row_bytes;
        for (int c0 = 0; c0 < V; c0 += 32 * kRowUnroll) {
            uint4 v[kRowUnroll];
#pragma unroll
            for (int u = 0; u < kRowUnroll; ++u) {
                const int c = c0 + u * 32 + lane;
                if (c < V) v[u] = ptx::ld_nc_v4(in + c * 16);
            }
            // The bulk stores that last read this chunk (two chunks ago) must be done reading it.
            char* chunk = chunks + half * kChunkBytes;
            half ^= 1;
            if (lane == 0) ptx::bulk_wait_group_read<1>();
            __syncwarp();
#pragma unroll
            for (int u = 0; u < kRowUnroll; ++u)
                if (c0 + u * 32 + lane < V) reinterpret_cast<uint4*>(chunk)[u * 32 + lane] = v[u];
            ptx::fence_proxy_async_shared();
            __syncwarp();
            if (lane == 0) {
                const int bytes = min(32 * kRowUnroll, V - c0) * 16;
#pragma unroll
                for (int k = 0; k < kMaxTopk; ++k)
                    if (drow[k] >= 0)
                        ptx::bulk_store(out + l.off_out_rows + size_t(drow[k]) * p.row_bytes + c0 * 16, chunk, bytes);
                ptx::bulk_commit_group();
            }
        }
        if (S) {
            const float* sin = reinterpret_cast<const float*>(comm::buf(l, src) + l.off_in_scales) + size_t(t) * S;
            float* sout = reinterpret_cast<float*>(out + l.off_out_scales);
            for (int c = lane; c < S; c += 32) {
                const float sc = sin[c];
#pragma unroll
                for (int k = 0; k < kMaxTopk; ++k)
                    if (drow[k] >= 0) sout[scale_index(p, drow[k], c)] = sc;
            }
        }
        if (p.mode == kFull && row >= 0) reinterpret_cast<float*>(out + l.off_out_probs)[row] = prob;
    }
}

// kProbe: the probe instantiation, which injects f.fault when this rank is f.rank (a rank that
// stops leaves an empty handle, so that its own later kernels of the call read no rows); the
// default kernel passes kProbe = false and has none of it.
template <bool kProbe>
__device__ __forceinline__ void dispatch_kernel(const DispatchParams& p, const FaultSpec& f) {
    __shared__ DispatchShared s;
    const Layout& l = p.l;
    const comm::Signals sig = comm::signals(l);
    const bool fresh = p.mode != kCached;  // routing comes with the call, not from a handle
    const u32 fault = kProbe && u32(l.rank) == f.rank ? f.fault : u32(kFaultNone);
    if (fault == kFaultNeverArrives) {
        if (fresh) record_empty_handle(p);
        return;
    }
    const u64 epoch = comm::read_epoch(sig, kDispatchFamily, &s.epoch);
    if (fresh) dispatch_meta(p, epoch);
    if (fault == kFaultCorruptCount && blockIdx.x == gridDim.x - 1) {
        __syncthreads();  // this block pushed the counts (dispatch_meta)
        if (threadIdx.x < l.ranks) count_row_on(l, threadIdx.x)[0] = p.tokens + 1;
    }
    if (fault == kFaultSlowPeer) comm::sleep_for(f.sleep_ns);
    comm::raise_on_all(sig, kDispatchReady);
    if (fault == kFaultStopMidDispatch || !comm::wait_all(sig, kDispatchReady, epoch, &s.ok)) {
        if (fresh) record_empty_handle(p);
        return;
    }
    if (fresh) {
        dispatch_layout(p, s, epoch);
        if (s.skip) {
            record_empty_handle(p);
        } else {
            record_handle(p, s);
        }
    } else {
        const int El = l.experts / l.ranks;
        for (int j = threadIdx.x; j < El; j += blockDim.x) {
            s.seg_base[j] = handle_i32(l, l.h_seg_base)[j];
            s.count[j] = handle_i32(l, l.h_counts)[j];
            s.padded[j] = handle_i32(l, l.h_padded)[j];
        }
        if (threadIdx.x < l.ranks) s.tokens[threadIdx.x] = handle_i32(l, l.h_src_tokens)[threadIdx.x];
        if (threadIdx.x == 0) s.skip = 0;
    }
    __syncthreads();
    if (!s.skip) {
        if (p.mode != kUnpermuted) zero_padding(p, s);
        pull_rows(p, s);
        ptx::bulk_wait_group_all();
    }
    // Every block tells every source it is done reading from it; the last wait keeps this
    // rank's inputs and meta alive until every rank is done with them.
    comm::arrive_all(sig, kDispatchDone);
    if (!comm::wait_all(sig, kDispatchDone, epoch, &s.ok)) return;
    comm::store_epoch(sig, kDispatchFamily, epoch);
}

}  // namespace ep
