// The fused kernel's combine (SPEC §3 step 5), warp per token of this rank: y_t = bf16(Σ f32(row)
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

constexpr int kCombineUnroll = 2;  // 16-byte column vectors per lane per step, per copy

__device__ __forceinline__ const i32* combine_topk_idx(const FusedRegions& r) {
    return reinterpret_cast<const i32*>(reinterpret_cast<const char*>(r.peer_base[r.rank]) + r.off_topk_idx);
}

// Token t of this rank, by one warp.
__device__ void combine_token(const FusedRegions& r, u32 t) {
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
    for (u32 c0 = 0; c0 < V; c0 += 32 * kCombineUnroll) {
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

// A warp's tokens: the i-th is t = w + i·W over the W = G·warps consumer warps of the grid.
struct WarpTokens {
    u32 first, stride;
    __device__ __forceinline__ WarpTokens(u32 warp, u32 warps)
        : first(ptx::ctaid_x() * warps + warp), stride(gridDim.x * warps) {}
};

// The early combine's pass over the warp's first 32 tokens (bit i of `combined`: its i-th token
// is combined): a token not yet combined whose valid slots' experts have all written their rows
// in call `epoch` is combined now. 32 / K tokens are checked at once, lane i·K + k reading slot
// k's flag; the flags of a ready token are acquired (the lanes' fence, then the warp's barrier)
// before its rows are read. Returns `combined` with the tokens added.
__device__ u32 combine_ready_rows(const FusedRegions& r, u32 warp, u32 warps, u64 epoch, u32 combined) {
    const u32 lane = threadIdx.x % 32, K = r.topk, per_pass = 32 / K;
    const WarpTokens mine(warp, warps);
    const u64* done = expert_done(r, r.rank);
    for (u32 i0 = 0; i0 < 32 && mine.first + i0 * mine.stride < u32(r.tokens); i0 += per_pass) {
        const u32 i = i0 + lane / K, t = mine.first + i * mine.stride;
        const bool pending = lane < per_pass * K && i < 32 && t < u32(r.tokens) && !(combined >> i & 1);
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
            combine_token(r, mine.first + (i0 + j) * mine.stride);
            combined |= 1u << (i0 + j);
        }
    }
    return combined;
}

// The combine of the warp's tokens not combined early (bit i of `combined`: its i-th token),
// once every rank's rows are in place.
__device__ void combine_rows(const FusedRegions& r, u32 warp, u32 warps, u32 combined) {
    const WarpTokens mine(warp, warps);
    for (u32 i = 0, t = mine.first; t < u32(r.tokens); ++i, t += mine.stride) {
        if (i < 32 && (combined >> i & 1)) continue;
        combine_token(r, t);
    }
}

}  // namespace megamoe::layer
