// The staging kernel of a call launched without host synchronization (src/stage.rs), before the
// fused kernel on the rank's stream. Block 0 reads the caller's topk_idx (i32 or i64) and
// topk_weights and writes the layer's i32 ids and weights (the fused kernel's inputs): a token with
// an expert id outside [-1, E), an expert twice, or a routed slot whose weight is not finite gets
// every slot masked (-1, weight 0), so its output row is zero and no other token sees it; the first
// such slot (lowest token, then slot) is recorded in host-mapped memory for the host to report,
// unless an earlier record is still pending there. The other blocks copy the caller's e4m3 rows
// and scales into the rank's symmetric input region (one launch instead of two copies). Its
// parameters: impls/stage_params.cuh, generated from src/stage.rs.
#pragma once
#include <megamoe/common.cuh>
#include <megamoe/ptx/sync.cuh>
#include <megamoe_layer/impls/stage_params.cuh>

namespace megamoe::layer {

// The caller's routing of one call, read as the kernel needs it.
struct CallerRouting {
    const StageParams& p;
    __device__ __forceinline__ i64 id(u64 i) const {
        return p.idx64 ? reinterpret_cast<const i64*>(p.topk_idx)[i] : i64(reinterpret_cast<const i32*>(p.topk_idx)[i]);
    }
    __device__ __forceinline__ float weight(u64 i) const { return reinterpret_cast<const float*>(p.topk_weights)[i]; }

    // Slot k of the row from `row`: its fault code against the row's earlier slots (0: fine);
    // `earlier`: for kExpertTwice, the earlier slot.
    __device__ u32 fault(u64 row, int k, int& earlier) const {
        const i64 e = id(row + k);
        if (e < -1 || e >= p.experts) return kExpertOutOfRange;
        if (e < 0) return 0;
        for (int j = 0; j < k; ++j)
            if (id(row + j) == e) {
                earlier = j;
                return kExpertTwice;
            }
        return isfinite(weight(row + k)) ? 0 : kWeightNotFinite;
    }
};

__device__ void check_routing(const StageParams& p) {
    __shared__ unsigned long long s_first;  // (token << 32 | slot << 16 | earlier << 8 | code), lowest wins
    __shared__ i64 s_value;
    if (threadIdx.x == 0) s_first = ~0ull;
    __syncthreads();
    const CallerRouting in{p};
    const int K = p.topk;
    i32* out_idx = reinterpret_cast<i32*>(p.out_idx);
    float* out_w = reinterpret_cast<float*>(p.out_weights);
    unsigned long long mine = ~0ull;
    for (int t = threadIdx.x; t < p.tokens; t += blockDim.x) {
        const u64 row = u64(t) * K;
        u32 code = 0;
        int k = 0, earlier = 0;
        for (; k < K && code == 0; ++k) code = in.fault(row, k, earlier);
        // A thread's tokens ascend: its first fault is its lowest.
        if (code != 0 && mine == ~0ull) mine = u64(t) << 32 | u64(k - 1) << 16 | u64(earlier) << 8 | code;
        for (int j = 0; j < K; ++j) {
            out_idx[row + j] = code == 0 ? i32(in.id(row + j)) : -1;
            out_w[row + j] = code == 0 ? in.weight(row + j) : 0.0f;
        }
    }
    if (mine != ~0ull) atomicMin(&s_first, mine);
    __syncthreads();
    if (mine != ~0ull && mine == s_first) {
        const u64 i = (mine >> 32) * K + ((mine >> 16) & 0xffff);
        s_value = (mine & 0xff) == kWeightNotFinite ? i64(__float_as_uint(in.weight(i))) : in.id(i);
    }
    __syncthreads();
    if (threadIdx.x == 0 && s_first != ~0ull) {
        volatile RouteFault* f = reinterpret_cast<volatile RouteFault*>(p.fault);
        if (f->code == 0) {
            f->row = i32(s_first >> 32);
            f->slot = i32((s_first >> 16) & 0xffff);
            f->first = i32((s_first >> 8) & 0xff);
            f->value = s_value;
            __threadfence_system();
            f->code = u32(s_first & 0xff);
        }
    }
}

// Blocks 1.. copy `bytes` (a multiple of 16) from `src` to `dst`, then the scales (4-byte words).
__device__ void copy_rows(const StageParams& p) {
    const u64 thread = u64(blockIdx.x - 1) * blockDim.x + threadIdx.x;
    const u64 threads = u64(gridDim.x - 1) * blockDim.x;
    const uint4* src = reinterpret_cast<const uint4*>(p.x);
    uint4* dst = reinterpret_cast<uint4*>(p.out_x);
    for (u64 i = thread; i < p.x_bytes / 16; i += threads) dst[i] = src[i];
    const u32* ssrc = reinterpret_cast<const u32*>(p.x_scales);
    u32* sdst = reinterpret_cast<u32*>(p.out_x_scales);
    for (u64 i = thread; i < p.x_bytes / 128; i += threads) sdst[i] = ssrc[i];
}

__device__ void stage_call(const StageParams& p) {
    // The previous kernel on the stream (the last call's fused kernel: peers read the input
    // region, its combine the ids) must be done before any write.
    ptx::grid_dependency_wait();
    if (blockIdx.x == 0) {
        check_routing(p);
    } else {
        copy_rows(p);
    }
}

}  // namespace megamoe::layer
