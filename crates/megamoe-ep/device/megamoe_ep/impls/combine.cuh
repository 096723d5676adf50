// combine_with_unpermute (SPEC §5): every rank PULLS the rows of its own tokens from their
// permuted positions on the experts' owners and reduces them on the spot, in f32 with one
// rounding at the end, in one of three orders:
//   - exact: every copy, in ascending global expert id;
//   - slot: every copy, in ascending slot (the MoE layer's combine);
//   - per_rank: one row per expert rank, in ascending rank. Each owner first sums its copies of
//     a token in ascending local expert id in f32 and rounds to bf16 (step 0); that row is what
//     crosses NVLink, so a token costs one remote row per rank instead of one per copy.
// The same kernel is dispatch's backward: rows are then the row gradients, and with
// `with_prob_grads` each slot's prob gradient is read back into [T, K].
//
//   0. per_rank: warp per (source, token) with two or more copies here: their bf16 sum lands in
//      out_rows at the row of the first copy (the dispatch output is scratch by now: the next
//      dispatch rewrites it); a single copy is read from comb_rows as it is.
//   1. raise kCombineReady (this rank's rows, and step 0's, are written); wait for it from every
//      rank.
//   2. warp per token: order the rows to sum, then for each 16-byte column chunk load every
//      row (all in flight at once), add in order in f32, round once, store.
//   3. raise kCombineDone on every rank; wait until every rank is done reading our rows.
#pragma once
#include <megamoe/ptx/convert.cuh>
#include <megamoe_ep/comm/sync.cuh>

namespace ep {

constexpr int kCombineUnroll = 2;  // 16-byte column vectors per lane per step, per copy

struct CombineShared {
    int ok;
    u64 epoch;
};

// dst = bf16(Σ f32 src[j] for j < n, in j order), rows of V 16-byte vectors; the whole warp calls.
__device__ __forceinline__ void sum_rows(const char* const (&src)[kMaxTopk], int n, char* dst, int V, int lane) {
    for (int c0 = 0; c0 < V; c0 += 32 * kCombineUnroll) {
        uint4 v[kMaxTopk][kCombineUnroll];
#pragma unroll
        for (int j = 0; j < kMaxTopk; ++j)
#pragma unroll
            for (int u = 0; u < kCombineUnroll; ++u) {
                const int c = c0 + u * 32 + lane;
                if (j < n && c < V) v[j][u] = ptx::ld_nc_v4(src[j] + c * 16);
            }
#pragma unroll
        for (int u = 0; u < kCombineUnroll; ++u) {
            const int c = c0 + u * 32 + lane;
            if (c >= V) continue;
            float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int j = 0; j < kMaxTopk; ++j) {
                if (j >= n) continue;
                const u32 w[4] = {v[j][u].x, v[j][u].y, v[j][u].z, v[j][u].w};
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    acc[2 * q] += ptx::bf16_lo(w[q]);
                    acc[2 * q + 1] += ptx::bf16_hi(w[q]);
                }
            }
            const uint4 o = make_uint4(ptx::bf16x2(acc[0], acc[1]), ptx::bf16x2(acc[2], acc[3]),
                                       ptx::bf16x2(acc[4], acc[5]), ptx::bf16x2(acc[6], acc[7]));
            ptx::st_v4(dst + c * 16, o);
        }
    }
}

// Gathers the warp's selected rows into `src` in ascending `key`: lane k < K offers `row` when
// `take`. Returns how many.
__device__ __forceinline__ int order_rows(bool take, int key, const char* row, const char* (&src)[kMaxTopk], int lane) {
    int pos = 0, n = 0;
#pragma unroll
    for (int k = 0; k < kMaxTopk; ++k) {
        const bool tk = __shfl_sync(0xffffffffu, take, k);
        const int kk = __shfl_sync(0xffffffffu, key, k);
        if (tk) {
            ++n;
            if (kk < key) ++pos;
        }
    }
#pragma unroll
    for (int j = 0; j < kMaxTopk; ++j) {
        const int from = __ffs(__ballot_sync(0xffffffffu, take && pos == j)) - 1;
        const u64 ptr = __shfl_sync(0xffffffffu, reinterpret_cast<u64>(row), from < 0 ? 0 : from);
        src[j] = from < 0 ? nullptr : reinterpret_cast<const char*>(ptr);
    }
    return n;
}

// Step 0 (per_rank): this rank's copies of each (source, token), summed per token.
__device__ void reduce_local_copies(const CombineParams& p) {
    const Layout& l = p.l;
    const int R = l.ranks, K = l.topk, lane = threadIdx.x & 31;
    const int* src_tokens = reinterpret_cast<const int*>(l.handle + l.h_src_tokens);
    const int* recv_slot = reinterpret_cast<const int*>(l.handle + l.h_recv_slot);
    const int V = l.hidden / 8;
    const size_t row_bytes = size_t(l.hidden) * 2;
    const char* in = comm::buf(l, l.rank) + l.off_comb_rows;
    char* out = comm::buf(l, l.rank) + l.off_out_rows;
    int total = 0;
    for (int src = 0; src < R; ++src) total += src_tokens[src];
    for (int task = blockIdx.x * kWarps + (threadIdx.x >> 5); task < total; task += gridDim.x * kWarps) {
        int src = 0, t = task;
        while (t >= src_tokens[src]) t -= src_tokens[src++];
        const int row = lane < K ? recv_slot[(size_t(src) * l.max_tokens + t) * K + lane] : -1;
        if (__popc(__ballot_sync(0xffffffffu, row >= 0)) < 2) continue;
        // Rows of one (source, token) ascend with the local expert id (segments are in order);
        // the sum lands at the first of them.
        const char* src_rows[kMaxTopk];
        const int n = order_rows(row >= 0, row, in + size_t(row) * row_bytes, src_rows, lane);
        sum_rows(src_rows, n, out + (src_rows[0] - in), V, lane);
    }
}

__device__ void combine_tokens(const CombineParams& p) {
    const Layout& l = p.l;
    const int K = l.topk, El = l.experts / l.ranks, lane = threadIdx.x & 31;
    const int T = reinterpret_cast<const int*>(l.handle + l.h_src_tokens)[l.rank];
    const int* idx = reinterpret_cast<const int*>(l.handle + l.h_idx);
    const int* send_row = reinterpret_cast<const int*>(l.handle + l.h_send_row);
    const int V = l.hidden / 8;  // 16-byte vectors of bf16 per row
    const size_t row_bytes = size_t(l.hidden) * 2;
    const bool per_rank = p.order == kPerRankOrder;

    for (int t = blockIdx.x * kWarps + (threadIdx.x >> 5); t < T; t += gridDim.x * kWarps) {
        const int e = lane < K ? idx[t * K + lane] : -1;
        const int r = lane < K ? send_row[t * K + lane] : -1;
        const int owner = e >= 0 ? e / El : -1;
        // per_rank sums one row per owner: the lowest expert's slot brings it, from comb_rows
        // when the owner holds one copy, else step 0's sum in out_rows.
        int on_owner = 0;
        bool lowest = true;
#pragma unroll
        for (int k = 0; k < kMaxTopk; ++k) {
            const int ek = __shfl_sync(0xffffffffu, e, k);
            if (k < K && ek >= 0 && owner >= 0 && ek / El == owner) {
                ++on_owner;
                if (ek < e) lowest = false;
            }
        }
        const bool take = e >= 0 && (!per_rank || lowest);
        const u64 region = per_rank && on_owner > 1 ? l.off_out_rows : l.off_comb_rows;
        const char* row = take ? comm::buf(l, owner) + region + size_t(r) * row_bytes : nullptr;
        const char* src[kMaxTopk];
        const int n = order_rows(take, p.order == kSlotOrder ? lane : e, row, src, lane);
        if (p.with_prob_grads && lane < K) {
            float g = 0.f;
            if (e >= 0) g = reinterpret_cast<const float*>(comm::buf(l, owner) + l.off_comb_prob_grads)[r];
            reinterpret_cast<float*>(p.grad_probs)[t * K + lane] = g;
        }
        sum_rows(src, n, reinterpret_cast<char*>(p.y) + size_t(t) * row_bytes, V, lane);
    }
}

// kProbe: as dispatch_kernel's.
template <bool kProbe>
__device__ __forceinline__ void combine_kernel(const CombineParams& p, const FaultSpec& f) {
    __shared__ CombineShared s;
    const comm::Signals sig = comm::signals(p.l);
    const u32 fault = kProbe && u32(p.l.rank) == f.rank ? f.fault : u32(kFaultNone);
    if (fault == kFaultNeverArrives) return;
    const u64 epoch = comm::read_epoch(sig, kCombineFamily, &s.epoch);
    if (p.order == kPerRankOrder) reduce_local_copies(p);
    comm::raise_on_all(sig, kCombineReady);
    if (fault == kFaultStopMidCombine || !comm::wait_all(sig, kCombineReady, epoch, &s.ok)) return;
    combine_tokens(p);
    comm::arrive_all(sig, kCombineDone);
    if (!comm::wait_all(sig, kCombineDone, epoch, &s.ok)) return;
    comm::store_epoch(sig, kCombineFamily, epoch);
}

}  // namespace ep
