// combine_with_unpermute (SPEC §5): every rank PULLS the rows of its own tokens from their
// permuted positions on the experts' owners and reduces them on the spot:
// y_t = bf16(Σ f32(row) over the token's slots in ascending global expert id, or in ascending
// slot for the MoE layer), one rounding.
// The same kernel is dispatch's backward: rows are then the row gradients, and with
// `with_prob_grads` each slot's prob gradient is read back into [T, K].
//
//   1. raise kCombineReady (this rank's rows were written before the launch); wait for it from
//      every rank.
//   2. warp per token: order the valid slots, then for each 16-byte column chunk load
//      every copy (all in flight at once), add in order in f32, round once, store.
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

__device__ void combine_tokens(const CombineParams& p) {
    const Layout& l = p.l;
    const int K = l.topk, El = l.experts / l.ranks, lane = threadIdx.x & 31;
    const int T = reinterpret_cast<const int*>(l.handle + l.h_src_tokens)[l.rank];
    const int* idx = reinterpret_cast<const int*>(l.handle + l.h_idx);
    const int* send_row = reinterpret_cast<const int*>(l.handle + l.h_send_row);
    const int V = l.hidden / 8;  // 16-byte vectors of bf16 per row
    const size_t row_bytes = size_t(l.hidden) * 2;

    for (int t = blockIdx.x * kWarps + (threadIdx.x >> 5); t < T; t += gridDim.x * kWarps) {
        const int e = lane < K ? idx[t * K + lane] : -1;
        const int r = lane < K ? send_row[t * K + lane] : -1;
        // Position of this slot among the token's valid slots in the call's order.
        int order = 0, valid = 0;
#pragma unroll
        for (int k = 0; k < kMaxTopk; ++k) {
            const int ek = __shfl_sync(0xffffffffu, e, k);
            if (k < K && ek >= 0) {
                ++valid;
                if (p.order == kSlotOrder ? k < lane : ek < e) ++order;
            }
        }
        // Copy j (ascending expert) comes from lane `order == j`.
        const char* src[kMaxTopk];
#pragma unroll
        for (int j = 0; j < kMaxTopk; ++j) {
            const int from = __ffs(__ballot_sync(0xffffffffu, e >= 0 && order == j)) - 1;
            const int ej = __shfl_sync(0xffffffffu, e, from < 0 ? 0 : from);
            const int rj = __shfl_sync(0xffffffffu, r, from < 0 ? 0 : from);
            src[j] = from < 0 ? nullptr : comm::buf(l, ej / El) + l.off_comb_rows + size_t(rj) * row_bytes;
        }
        if (p.with_prob_grads && lane < K) {
            float g = 0.f;
            if (e >= 0) g = reinterpret_cast<const float*>(comm::buf(l, e / El) + l.off_comb_prob_grads)[r];
            reinterpret_cast<float*>(p.grad_probs)[t * K + lane] = g;
        }
        char* y = reinterpret_cast<char*>(p.y) + size_t(t) * row_bytes;
        for (int c0 = 0; c0 < V; c0 += 32 * kCombineUnroll) {
            uint4 v[kMaxTopk][kCombineUnroll];
#pragma unroll
            for (int j = 0; j < kMaxTopk; ++j)
#pragma unroll
                for (int u = 0; u < kCombineUnroll; ++u) {
                    const int c = c0 + u * 32 + lane;
                    if (j < valid && c < V) v[j][u] = ptx::ld_nc_v4(src[j] + c * 16);
                }
#pragma unroll
            for (int u = 0; u < kCombineUnroll; ++u) {
                const int c = c0 + u * 32 + lane;
                if (c >= V) continue;
                float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
                for (int j = 0; j < kMaxTopk; ++j) {
                    if (j >= valid) continue;
                    const u32 w[4] = {v[j][u].x, v[j][u].y, v[j][u].z, v[j][u].w};
#pragma unroll
                    for (int q = 0; q < 4; ++q) {
                        acc[2 * q] += ptx::bf16_lo(w[q]);
                        acc[2 * q + 1] += ptx::bf16_hi(w[q]);
                    }
                }
                const uint4 o = make_uint4(ptx::bf16x2(acc[0], acc[1]), ptx::bf16x2(acc[2], acc[3]),
                                           ptx::bf16x2(acc[4], acc[5]), ptx::bf16x2(acc[6], acc[7]));
                ptx::st_v4(y + c * 16, o);
            }
        }
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
    comm::raise_on_all(sig, kCombineReady);
    if (fault == kFaultStopMidCombine || !comm::wait_all(sig, kCombineReady, epoch, &s.ok)) return;
    combine_tokens(p);
    comm::arrive_all(sig, kCombineDone);
    if (!comm::wait_all(sig, kCombineDone, epoch, &s.ok)) return;
    comm::store_epoch(sig, kCombineFamily, epoch);
}

}  // namespace ep
