// The fused kernel's combine (SPEC §3 step 5), a warp per item (a token of this rank, or a column
// chunk of it where the grid's warps outnumber the tokens: CombineItems): y_t = bf16(Σ f32(row)
// over the token's valid slots in ascending slot k), one rounding; the same arithmetic as
// megamoe-ep's combine in slot order, so the split and the fused layer agree bit for bit. A
// token whose slots are all masked gets zeros.
//
// The early combine: a consumer warp whose CTA has run its tasks combines, while it waits for
// every rank's L2 rows, those of its tokens whose every expert has already written its rows in
// this call (the expert flags, comm/flags.cuh); the rest follow once every rank has signalled.
// Each token is combined once, by the same arithmetic either way.
#pragma once
#include <megamoe/ptx/convert.cuh>
#include <megamoe/ptx/memory.cuh>
#include <megamoe_layer/comm/flags.cuh>
#include <megamoe_layer/impls/fused_params.cuh>

namespace megamoe::layer {

constexpr int kCombineUnroll = 2;                  // 16-byte column vectors per lane per step, per copy
constexpr u32 kCombineStep = 32 * kCombineUnroll;  // a warp's column vectors per step

__device__ __forceinline__ const i32* combine_topk_idx(const FusedRegions& r) {
    return reinterpret_cast<const i32*>(reinterpret_cast<const char*>(r.peer_base[r.rank]) + r.off_topk_idx);
}

// Columns [c_begin, c_begin + n) (16-byte vectors; n a multiple of kCombineStep) of token t of
// this rank, by one warp.
__device__ void combine_token(const FusedRegions& r, u32 t, u32 c_begin, u32 n) {
    const u32 lane = threadIdx.x % 32, K = r.topk, V = r.hidden / 8;
    const char* me = reinterpret_cast<const char*>(r.peer_base[r.rank]);
    const u64 row_bytes = u64(r.hidden) * 2;
    const i32 e = lane < K ? combine_topk_idx(r)[t * K + lane] : -1;
    const u32 valid_mask = __ballot_sync(0xffffffffu, e >= 0);
    const int valid = __popc(valid_mask);
    const char* src[kMaxTopk];
    u32 m = valid_mask;
#pragma unroll
    for (int j = 0; j < kMaxTopk; ++j) {
        const int k = m ? __ffs(m) - 1 : 0;
        src[j] = me + r.off_combine + (u64(t) * K + k) * row_bytes;
        m &= m - 1;
    }
    char* y = reinterpret_cast<char*>(r.y) + u64(t) * row_bytes;
    const u32 c_end = min(V, c_begin + n);
    for (u32 c0 = c_begin; c0 < c_end; c0 += kCombineStep) {
        uint4 v[kMaxTopk][kCombineUnroll];
#pragma unroll
        for (int j = 0; j < kMaxTopk; ++j)
#pragma unroll
            for (int u = 0; u < kCombineUnroll; ++u) {
                const u32 c = c0 + u * 32 + lane;
                if (j < valid && c < V) v[j][u] = *reinterpret_cast<const uint4*>(src[j] + c * 16);
            }
#pragma unroll
        for (int u = 0; u < kCombineUnroll; ++u) {
            const u32 c = c0 + u * 32 + lane;
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
            ptx::st_v4(y + c * 16, make_uint4(ptx::bf16x2(acc[0], acc[1]), ptx::bf16x2(acc[2], acc[3]),
                                              ptx::bf16x2(acc[4], acc[5]), ptx::bf16x2(acc[6], acc[7])));
        }
    }
}

// A warp's items: the i-th is g = w + i·W over the W = G·warps consumer warps of the grid, item g
// being columns [c·n, (c+1)·n) of token g / C, c = g % C. C = 1 where the tokens are as many as
// the warps; at decode sizes a token is cut into up to W / T chunks (whole steps each): the
// tokens of the last expert to finish are then summed by many warps at once, where one warp's
// pass over a token's rows takes H / 512 round trips of its loads (about 14 at H 7168, over 10 µs
// on the call's critical path).
struct CombineItems {
    u32 first, stride, chunks, chunk_vectors, count;
    __device__ __forceinline__ CombineItems(const FusedRegions& r, u32 warp, u32 warps)
        : first(ptx::ctaid_x() * warps + warp), stride(gridDim.x * warps) {
        const u32 steps = (u32(r.hidden) / 8 + kCombineStep - 1) / kCombineStep;
        const u32 tokens = u32(r.tokens);
        const u32 cuts = min(steps, max(1u, stride / max(1u, tokens)));
        const u32 steps_per_chunk = (steps + cuts - 1) / cuts;
        chunk_vectors = steps_per_chunk * kCombineStep;
        chunks = (steps + steps_per_chunk - 1) / steps_per_chunk;
        count = tokens * chunks;
    }
    __device__ __forceinline__ u32 item(u32 i) const { return first + i * stride; }
    __device__ __forceinline__ u32 token(u32 g) const { return g / chunks; }
    __device__ __forceinline__ void combine(const FusedRegions& r, u32 g) const {
        combine_token(r, g / chunks, g % chunks * chunk_vectors, chunk_vectors);
    }
};

// The early combine's pass over the warp's first 32 items (bit i of `combined`: its i-th item
// is combined): an item not yet combined whose token's valid slots' experts have all written
// their rows in call `epoch` is combined now. 32 / K items are checked at once, lane i·K + k
// reading slot k's flag; the flags of a ready item are acquired (the lanes' fence, then the
// warp's barrier) before its rows are read. Returns `combined` with the items added.
__device__ u32 combine_ready_rows(const FusedRegions& r, u32 warp, u32 warps, u64 epoch, u32 combined) {
    const u32 lane = threadIdx.x % 32, K = r.topk, per_pass = 32 / K;
    const CombineItems mine(r, warp, warps);
    const u64* done = expert_done(r, r.rank);
    for (u32 i0 = 0; i0 < 32 && mine.item(i0) < mine.count; i0 += per_pass) {
        const u32 i = i0 + lane / K, g = mine.item(i), t = mine.token(g);
        const bool pending = lane < per_pass * K && i < 32 && g < mine.count && !(combined >> i & 1);
        bool ready = true;
        if (pending) {
            const i32 e = combine_topk_idx(r)[t * K + lane % K];
            ready = e < 0 || ptx::ld_relaxed_sys(done + e) >= epoch;
        }
        const u32 pend = __ballot_sync(0xffffffffu, pending);
        const u32 waiting = __ballot_sync(0xffffffffu, pending && !ready);
        u32 now = 0;  // bit j: the pass's j-th token is ready
        for (u32 j = 0; j < per_pass; ++j) {
            const u32 group = ((1u << K) - 1) << (j * K);
            if ((pend & group) == group && (waiting & group) == 0) now |= 1u << j;
        }
        if (now == 0) continue;
        ptx::fence_acq_rel_sys();
        __syncwarp();
        for (u32 j = 0; j < per_pass; ++j) {
            if (!(now >> j & 1)) continue;
            mine.combine(r, mine.item(i0 + j));
            combined |= 1u << (i0 + j);
        }
    }
    return combined;
}

// The combine of the warp's items not combined early (bit i of `combined`: its i-th item), once
// every rank's rows are in place.
__device__ void combine_rows(const FusedRegions& r, u32 warp, u32 warps, u32 combined) {
    const CombineItems mine(r, warp, warps);
    for (u32 i = 0, g = mine.first; g < mine.count; ++i, g += mine.stride) {
        if (i < 32 && (combined >> i & 1)) continue;
        mine.combine(r, g);
    }
}

}  // namespace megamoe::layer
