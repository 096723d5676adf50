// Generated from crates/megamoe-cuda/src/kernels.rs (do not edit: `MEGAMOE_WRITE_HEADERS=1 cargo test` rewrites it).
// The parameters of this crate's kernels (impls/).
#pragma once
#include <megamoe/common.cuh>
#include <megamoe/ptx/tma.cuh>

namespace megamoe::impls {

// bf16 -> e4m3 per-128 quantization (impls/quant_e4m3.cuh).
struct QuantParams {
    // bf16 `[rows, cols]`.
    u64 x;
    // e4m3 `[rows, cols]`.
    u64 q;
    // f32 `[rows, cols / 128]`.
    u64 sf;
    u32 rows;
    // A multiple of 128.
    u32 cols;
};
MEGAMOE_PARAMS_LAYOUT(QuantParams, 32, 8);

// The NVLink copy (impls/nvlink_copy.cuh).
struct CopyParams {
    u64 dst;
    u64 src;
    // A multiple of 16.
    u64 bytes;
};
MEGAMOE_PARAMS_LAYOUT(CopyParams, 24, 8);

// The rank barrier kernel (impls/rank_barrier.cuh).
struct RankBarrierParams {
    // Device address of the peer pointer table (`world` u64 addresses).
    u64 peer_signals;
    // This rank's `WaitRecord`.
    u64 record;
    u64 epoch;
    u64 timeout_ns;
    u32 rank;
    u32 world;
};
MEGAMOE_PARAMS_LAYOUT(RankBarrierParams, 40, 8);

// The launch path's check (impls/launch_check.cuh).
struct LaunchCheckParams {
    // u32 `[gridDim.x, 3]`: last shared word, cluster rank, cluster size.
    u64 out;
    // Dynamic shared memory in u32 words.
    u32 smem_words;
    u32 pad;
};
MEGAMOE_PARAMS_LAYOUT(LaunchCheckParams, 16, 8);

// The TMA check's tile: rows and u32 columns.
constexpr u32 kTileRows = 16;

constexpr u32 kTileCols = 32;

// The TMA tile load's check (impls/launch_check.cuh); the tile is
// `TMA_TILE_ROWS x TMA_TILE_COLS` u32.
struct TmaCheckParams {
    ptx::TensorMap map;
    // u32 `[TMA_TILE_ROWS, TMA_TILE_COLS]`.
    u64 out;
    // This rank's `WaitRecord`.
    u64 record;
    u64 timeout_ns;
    i32 x;
    i32 y;
};
MEGAMOE_PARAMS_LAYOUT(TmaCheckParams, 192, 64);

}  // namespace megamoe::impls
