// A plain 16-byte-per-thread copy used to measure NVLink: with `src` on a peer it pulls (loads
// cross the link), with `dst` on a peer it pushes (stores cross the link). kUnroll loads are in
// flight per thread before the first store.
#pragma once
#include <megamoe/impls/params.cuh>
#include <megamoe/common.cuh>
#include <megamoe/ptx/memory.cuh>

namespace megamoe::impls {

template <u32 kUnroll>
__device__ __forceinline__ void copy_v4(const CopyParams& p) {
    const u64 n = p.bytes / 16;
    const u64 stride = static_cast<u64>(gridDim.x) * blockDim.x;
    const auto* src = reinterpret_cast<const uint4*>(p.src);
    auto* dst = reinterpret_cast<uint4*>(p.dst);
    for (u64 i = static_cast<u64>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride * kUnroll) {
        uint4 v[kUnroll];
#pragma unroll
        for (u32 u = 0; u < kUnroll; ++u) {
            if (i + u * stride < n) v[u] = ptx::ld_nc_v4(src + i + u * stride);
        }
#pragma unroll
        for (u32 u = 0; u < kUnroll; ++u) {
            if (i + u * stride < n) ptx::st_v4(dst + i + u * stride, v[u]);
        }
    }
}

}  // namespace megamoe::impls
