// The split layer's L1 kernel: the grouped GEMM over the dispatched pool (x · W1ᵀ, W1's gate and
// up blocks interleaved) with the SwiGLU + weight + re-quantization epilogue. Mirrored by
// `SplitL1Params` in src/kernel.rs (size and offsets asserted on both sides).
#pragma once
#include <megamoe_gemm/impls/grouped_gemm.cuh>
#include <megamoe_layer/epilogue/swiglu_quant.cuh>

namespace megamoe::layer {

struct SplitL1Params {
    gemm::GroupedGemmParams gemm;
    SwigluQuant epilogue;
};

MEGAMOE_PARAMS_LAYOUT(SwigluQuant, 64, 8);
MEGAMOE_PARAMS_LAYOUT(SplitL1Params, 704 + 64, 64);

}  // namespace megamoe::layer
