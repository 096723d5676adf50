// The separate permute pass of the baseline path (Megatron's alltoall dispatcher): row i of the
// output is row index[i] of the input, or zeros where index[i] < 0. Warp per row, 16-byte vectors.
#pragma once
#include <megamoe/ptx/memory.cuh>
#include <megamoe_ep/params.cuh>

namespace ep {

__device__ void gather_kernel(const GatherParams& p) {
    const int lane = threadIdx.x & 31, V = p.row_bytes / 16;
    const int* index = reinterpret_cast<const int*>(p.index);
    for (int i = blockIdx.x * kWarps + (threadIdx.x >> 5); i < p.rows; i += gridDim.x * kWarps) {
        const int from = index[i];
        char* dst = reinterpret_cast<char*>(p.dst) + size_t(i) * p.row_bytes;
        const char* src = reinterpret_cast<const char*>(p.src) + size_t(from) * p.row_bytes;
        for (int c = lane; c < V; c += 32)
            ptx::st_v4(dst + c * 16, from < 0 ? make_uint4(0, 0, 0, 0) : ptx::ld_nc_v4(src + c * 16));
    }
}

}  // namespace ep
