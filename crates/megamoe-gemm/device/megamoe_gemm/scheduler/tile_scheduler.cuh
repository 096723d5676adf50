// Persistent tile scheduler over experts. Every role (producer and consumers) walks the same
// sequence: CTA b takes tiles b, b + gridDim.x, ... of a dense index space in which each expert
// contributes ceil(rows / BLOCK_M) * (N / BLOCK_N) tiles, so empty experts cost nothing and the
// work is balanced whatever the per-expert counts. Inside an expert, groups of `group_m`
// m-blocks are walked n-block by n-block so concurrent CTAs share each weight tile through L2.
#pragma once
#include <megamoe_gemm/ptx/types.cuh>

struct Tile {
    u32 expert;
    u32 m_block;     // within the expert
    u32 n0;          // first output column
    u32 a_row;       // first row in the 2-D views of A and the output
    u32 rows_valid;  // rows of this tile that hold results (<= BLOCK_M)
};

template <int BLOCK_M, int BLOCK_N, bool kMasked>
struct TileScheduler {
    const i32* rows;  // per-expert rows, in shared memory
    u32 num_experts;
    u32 n_blocks;
    u32 max_m;
    u32 group_m;

    u32 next_tile;
    u32 expert = 0;
    u32 expert_first_tile = 0;
    u32 expert_tiles;
    u32 expert_m_blocks;
    u32 expert_row0 = 0;  // contiguous: first row of the expert's segment

    __device__ TileScheduler(const i32* rows_, u32 num_experts_, u32 n, u32 max_m_, u32 group_m_)
        : rows(rows_), num_experts(num_experts_), n_blocks(n / BLOCK_N), max_m(max_m_),
          group_m(group_m_), next_tile(blockIdx.x) {
        load_expert();
    }

    __device__ __forceinline__ void load_expert() {
        expert_m_blocks = (static_cast<u32>(rows[expert]) + BLOCK_M - 1) / BLOCK_M;
        expert_tiles = expert_m_blocks * n_blocks;
    }

    __device__ __forceinline__ bool next(Tile& t) {
        const u32 tile = next_tile;
        next_tile += gridDim.x;
        while (tile >= expert_first_tile + expert_tiles) {
            expert_first_tile += expert_tiles;
            if (!kMasked) expert_row0 += static_cast<u32>(rows[expert]);
            if (++expert >= num_experts) return false;
            load_expert();
        }
        const u32 local = tile - expert_first_tile;
        const u32 group_tiles = group_m * n_blocks;
        const u32 group = local / group_tiles;
        const u32 first_m = group * group_m;
        const u32 gm = min(group_m, expert_m_blocks - first_m);
        const u32 within = local - group * group_tiles;
        t.expert = expert;
        t.m_block = first_m + within % gm;
        t.n0 = (within / gm) * BLOCK_N;
        const u32 m0 = t.m_block * BLOCK_M;
        t.a_row = (kMasked ? expert * max_m : expert_row0) + m0;
        t.rows_valid = min(static_cast<u32>(BLOCK_M), static_cast<u32>(rows[expert]) - m0);
        return true;
    }
};
