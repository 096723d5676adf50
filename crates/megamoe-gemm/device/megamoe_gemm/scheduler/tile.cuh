// What a tile scheduler hands the producer and the consumers. Both roles take the scheduler as a
// template parameter and each builds its own from the scheduler's params, so the scheduler must
// give every role of a CTA the same sequence. Its shape:
//   using Params = ...;                              // its own params struct
//   Sched(const Params& p, const i32* rows);         // rows: the per-expert rows in shared memory
//   bool next(Tile& t);                              // the next tile, or false when done
//   u32 rank;                                        // the CTA's rank in its cluster
// TileScheduler (tile_scheduler.cuh) is the grouped GEMM's.
#pragma once
#include <megamoe/common.cuh>

namespace megamoe::gemm {

struct Tile {
    u32 expert;
    u32 m_block;     // within the expert
    u32 n0;          // first output column
    u32 a_row;       // first row in the 2-D views of A and the output
    u32 rows_valid;  // rows of this tile that hold results (<= BLOCK_M)
    bool shared_b;   // clusters: both CTAs multiply the same weight tile
};

}  // namespace megamoe::gemm
