// Generated from crates/megamoe-layer/src/kernel.rs (do not edit: `MEGAMOE_WRITE_HEADERS=1 cargo test` rewrites it).
// The split layer's L1 kernel: the grouped GEMM over the dispatched pool (x · W1ᵀ,
// W1's gate and up blocks interleaved) with the SwiGLU + weight + re-quantization
// epilogue.
#pragma once
#include <megamoe/common.cuh>
#include <megamoe_gemm/impls/grouped_gemm.cuh>
#include <megamoe_layer/epilogue/swiglu_quant.cuh>

namespace megamoe::layer {

// The split layer's L1 kernel's one parameter struct.
struct alignas(64) SplitL1Params {
    gemm::GroupedGemmParams gemm;
    SwigluQuant epilogue;
};
MEGAMOE_PARAMS_LAYOUT(SplitL1Params, 768, 64);

}  // namespace megamoe::layer
