// Persistent tile scheduler over experts. Every role (producer and consumers) walks the same
// sequence: CTA b takes tiles b, b + gridDim.x, ... of a dense index space in which each expert
// contributes ceil(rows / BLOCK_M) * ceil(N / BLOCK_N) tiles, so empty experts cost nothing and
// the work is balanced whatever the per-expert counts. A BLOCK_N that does not divide N (192)
// leaves a partial last n-block, whose columns past N are computed and never stored. Inside an
// expert, groups of `group_m` m-blocks are walked n-block by n-block so concurrent CTAs share
// each weight tile through L2.
//
// With clusters of two CTAs (kClusterM = 2) the index space is one of tile pairs, cluster c
// taking pairs c, c + clusters, ...: the two CTAs get m-blocks 2i and 2i + 1 of the same expert
// and n-block (they share the weight tile, `shared_b`), and an expert's odd last m-block is
// paired along N instead (n-blocks 2j and 2j + 1, nothing shared). Both CTAs of a cluster thus
// always hold a tile, or both are done.
//
// The shape every scheduler has is in tile.cuh.
#pragma once
#include <megamoe/common.cuh>
#include <megamoe/ptx/sync.cuh>
#include <megamoe_gemm/impls/grouped_gemm_params.cuh>
#include <megamoe_gemm/scheduler/tile.cuh>

namespace megamoe::gemm {

template <int BLOCK_M, int BLOCK_N, bool kMasked, int kClusterM>
struct TileScheduler {
    static_assert(kClusterM == 1 || kClusterM == 2, "single CTAs or pairs");
    using Params = SchedulerParams;
    const i32* rows;  // per-expert rows, in shared memory
    u32 num_experts;
    u32 n_blocks;
    u32 max_m;
    u32 group_m;
    u32 rank;  // in the cluster
    u32 stride;

    u32 next_tile;
    u32 expert = 0;
    u32 expert_first_tile = 0;
    u32 expert_tiles;
    u32 expert_m_blocks;
    u32 expert_row0 = 0;  // contiguous: first row of the expert's segment

    // rows_: p.expert_rows, staged in shared memory by the kernel.
    __device__ TileScheduler(const SchedulerParams& p, const i32* rows_)
        : rows(rows_),
          num_experts(p.num_experts),
          n_blocks((p.n + BLOCK_N - 1) / BLOCK_N),
          max_m(p.max_m),
          group_m(p.group_m) {
        if constexpr (kClusterM == 1) {
            rank = 0;
            next_tile = blockIdx.x;
            stride = gridDim.x;
        } else {
            rank = ptx::cluster_cta_rank();
            next_tile = ptx::cluster_index();
            stride = ptx::cluster_count();
        }
        load_expert();
    }

    __device__ __forceinline__ void load_expert() {
        expert_m_blocks = (static_cast<u32>(rows[expert]) + BLOCK_M - 1) / BLOCK_M;
        expert_tiles = expert_m_blocks * n_blocks / kClusterM;
    }

    __device__ __forceinline__ bool next(Tile& t) {
        const u32 tile = next_tile;
        next_tile += stride;
        while (tile >= expert_first_tile + expert_tiles) {
            expert_first_tile += expert_tiles;
            if (!kMasked) expert_row0 += static_cast<u32>(rows[expert]);
            if (++expert >= num_experts) return false;
            load_expert();
        }
        const u32 local = tile - expert_first_tile;
        // Units along M: m-blocks, or m-block pairs (the odd last m-block is handled below).
        const u32 m_units = expert_m_blocks / kClusterM;
        const u32 group_units = max(group_m / kClusterM, 1u);
        t.expert = expert;
        if (local < m_units * n_blocks) {
            const u32 group_tiles = group_units * n_blocks;
            const u32 group = local / group_tiles;
            const u32 first = group * group_units;
            const u32 gm = min(group_units, m_units - first);
            const u32 within = local - group * group_tiles;
            t.m_block = (first + within % gm) * kClusterM + rank;
            t.n0 = (within / gm) * BLOCK_N;
            t.shared_b = kClusterM > 1;
        } else {
            const u32 j = local - m_units * n_blocks;
            t.m_block = expert_m_blocks - 1;
            t.n0 = (j * kClusterM + rank) * BLOCK_N;
            t.shared_b = false;
        }
        const u32 m0 = t.m_block * BLOCK_M;
        t.a_row = (kMasked ? expert * max_m : expert_row0) + m0;
        t.rows_valid = min(static_cast<u32>(BLOCK_M), static_cast<u32>(rows[expert]) - m0);
        return true;
    }
};

}  // namespace megamoe::gemm
