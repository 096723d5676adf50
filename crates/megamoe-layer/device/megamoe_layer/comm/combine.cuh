// The fused kernel's combine (SPEC §3 step 5): once every rank has written its L2 rows, warp per
// token of this rank: y_t = bf16(Σ f32(row) over the token's valid slots in ascending slot k),
// one rounding; the same arithmetic as megamoe-ep's combine in slot order, so the split and the
// fused layer agree bit for bit. A token whose slots are all masked gets zeros.
#pragma once
#include <megamoe/ptx/convert.cuh>
#include <megamoe/ptx/memory.cuh>
#include <megamoe_layer/impls/fused_params.cuh>

namespace megamoe::layer {

constexpr int kMaxTopk = 8;
constexpr int kCombineUnroll = 2;  // 16-byte column vectors per lane per step, per copy

__device__ void combine_rows(const FusedRegions& r, u32 warp, u32 warps) {
    const u32 lane = threadIdx.x % 32, K = r.topk, V = r.hidden / 8;
    const char* me = reinterpret_cast<const char*>(r.peer_base[r.rank]);
    const i32* idx = reinterpret_cast<const i32*>(me + r.off_topk_idx);
    const u64 row_bytes = u64(r.hidden) * 2;
    for (u32 t = ptx::ctaid_x() * warps + warp; t < u32(r.tokens); t += gridDim.x * warps) {
        const i32 e = lane < K ? idx[t * K + lane] : -1;
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
}

}  // namespace megamoe::layer
