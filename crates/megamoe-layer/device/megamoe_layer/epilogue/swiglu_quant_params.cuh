// Generated from crates/megamoe-layer/src/kernel.rs (do not edit: `MEGAMOE_WRITE_HEADERS=1 cargo test` rewrites it).
// The SwiGLU epilogue's parameters (epilogue/swiglu_quant.cuh).
#pragma once
#include <megamoe/common.cuh>

namespace megamoe::layer {

// The SwiGLU epilogue's parameters (the device's `SwigluQuant` epilogue derives from them).
struct SwigluQuantParams {
    // e4m3 `[rows, I]`.
    u64 out;
    // f32 `[I/G, rows_ld]`.
    u64 out_scales;
    // f32 `[rows]`: each pool row's routing weight (0 on padding rows).
    u64 weights;
    // Rows of the pool: the stride of `out_scales`.
    u32 rows_ld;
    // I.
    u32 inter;
    // G, 64 or 128.
    u32 group;
    u32 has_clamp;
    float clamp;
    u32 reserved[5];
};
MEGAMOE_PARAMS_LAYOUT(SwigluQuantParams, 64, 8);

}  // namespace megamoe::layer
