// Generated from crates/megamoe-layer/src/stage.rs (do not edit: `MEGAMOE_WRITE_HEADERS=1 cargo test` rewrites it).
// The staging kernel's parameters and its record of a bad routing (impls/stage.cuh).
#pragma once
#include <megamoe/common.cuh>

namespace megamoe::layer {

// Threads per block.
constexpr u32 kStageThreads = 1024;

// The record the kernel leaves in host-mapped memory: `code` last, after the rest is
// visible (the host reads it first).
struct RouteFault {
    // 0: none pending; else a `ROUTE_*` code (device: `RouteFaultCode`).
    u32 code;
    i32 row;
    i32 slot;
    // For an expert named twice: the slot that named it first.
    i32 first;
    // The expert id, or the weight's f32 bits.
    i64 value;
};
MEGAMOE_PARAMS_LAYOUT(RouteFault, 24, 8);

// RouteFault::code.
enum RouteFaultCode : u32 {
    kExpertOutOfRange = 1,
    kExpertTwice = 2,
    kWeightNotFinite = 3,
};

// The staging kernel's one parameter struct.
struct StageParams {
    // The caller's `[T, K]`, i64 when `idx64` else i32.
    u64 topk_idx;
    // The caller's f32 `[T, K]`.
    u64 topk_weights;
    // The layer's i32 `[T, K]`.
    u64 out_idx;
    // The layer's f32 `[T, K]`.
    u64 out_weights;
    // The RouteFault record, host-mapped (its device address).
    u64 fault;
    // The caller's e4m3 rows `[T, H]` and f32 scales `[T, H/128]`, or 0 (rows already in
    // place, or bf16 rows the quantizer writes there).
    u64 x;
    u64 x_scales;
    // The symmetric input region's rows and scales.
    u64 out_x;
    u64 out_x_scales;
    // T · H, the rows' bytes (a multiple of 16; 0: no copy).
    u64 x_bytes;
    i32 tokens;
    i32 topk;
    i32 experts;
    i32 idx64;
};
MEGAMOE_PARAMS_LAYOUT(StageParams, 96, 8);

}  // namespace megamoe::layer
