//! Device sources of the layer (embedded), the L1 kernel's parameter struct and the
//! configurations the layer runs. The L1 kernel is the grouped GEMM of megamoe-gemm with the
//! SwiGLU + weight + re-quantization epilogue of device/megamoe_layer/epilogue/; the L2 kernel
//! is megamoe-gemm's own (bf16 rows through TMA stores).

use megamoe_cuda::jit::Headers;
use megamoe_cuda::{KernelSpec, Pod};
use megamoe_gemm::heuristics::{max_stages, GemmConfig, GemmProblem, Layout, OutDtype};
use megamoe_gemm::params::GroupedGemmParams;

use crate::spec::POOL_PAD;

/// This crate's device headers, included as `<megamoe_layer/...>`.
pub const HEADERS: Headers = megamoe_cuda::header_set!(
    "device",
    [
        "megamoe_layer/epilogue/swiglu_quant.cuh",
        "megamoe_layer/impls/split_l1.cuh",
    ]
);

/// The SwiGLU epilogue's parameters (device: `megamoe::layer::SwigluQuant`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SwigluQuant {
    /// e4m3 `[rows, I]`.
    pub out: u64,
    /// f32 `[I/G, rows_ld]`.
    pub out_scales: u64,
    /// f32 `[rows]`: each pool row's routing weight.
    pub weights: u64,
    pub rows_ld: u32,
    pub inter: u32,
    pub group: u32,
    pub has_clamp: u32,
    pub clamp: f32,
    pub reserved: [u32; 5],
}

/// The L1 kernel's one parameter struct (device: `megamoe::layer::SplitL1Params`).
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
pub struct SplitL1Params {
    pub gemm: GroupedGemmParams,
    pub epilogue: SwigluQuant,
}

const _: () = assert!(std::mem::size_of::<SwigluQuant>() == 64);
const _: () = assert!(std::mem::size_of::<SplitL1Params>() == 704 + 64);
const _: () = assert!(std::mem::align_of::<SplitL1Params>() == 64);
const _: () = assert!(std::mem::offset_of!(SplitL1Params, epilogue) == 704);
const _: () = assert!(std::mem::offset_of!(SwigluQuant, rows_ld) == 24);
const _: () = assert!(std::mem::offset_of!(SwigluQuant, clamp) == 40);
// SAFETY: plain data (tensor maps, integers, a float), sizes and offsets asserted above and in
// split_l1.cuh.
unsafe impl Pod for SplitL1Params {}

/// The L1 GEMM's problem over the pool: N = 2I (gate and up interleaved), K = H.
pub fn l1_problem(
    hidden: usize,
    inter: usize,
    local_experts: usize,
    rows_per_expert: usize,
) -> GemmProblem {
    GemmProblem {
        experts: local_experts,
        n: 2 * inter,
        k: hidden,
        group_size: 128,
        layout: Layout::Contiguous { pad: POOL_PAD },
        out: OutDtype::Bf16,
        rows_per_expert,
    }
}

/// The L1 kernel's one configuration: 128 x 256 tiles, whose two waves per warpgroup are one
/// gate block and its up block (src/weights.rs), the deepest ring that fits, one CTA per SM.
pub fn l1_config(sms: usize) -> GemmConfig {
    GemmConfig {
        block_m: 128,
        block_n: 256,
        stages: max_stages(128, 256, 128),
        group_size: 128,
        masked: false,
        out: OutDtype::Bf16,
        tma_store: false,
        group_m: 8,
        cluster_m: 1,
        a_regs: false,
        pipelined: false,
        ctas: sms,
    }
}

/// The L1 kernel's translation unit.
pub fn split_l1_spec(config: &GemmConfig) -> KernelSpec {
    let name = format!("layer_split_l1_s{}", config.stages);
    let source = format!(
        "#include <megamoe_layer/impls/split_l1.cuh>\n\
         extern \"C\" __global__ void __launch_bounds__({threads}, 1)\n\
         {name}(const __grid_constant__ megamoe::layer::SplitL1Params p) {{\n\
         \x20   megamoe::gemm::grouped_gemm_fp8<128, 256, {stages}, 128, false, 1, false, false,\n\
         \x20                                   megamoe::gemm::TileScheduler<128, 256, false, 1>,\n\
         \x20                                   megamoe::layer::SwigluQuant>(p.gemm, p.epilogue);\n\
         }}\n",
        threads = megamoe_gemm::kernel::THREADS,
        stages = config.stages,
    );
    KernelSpec {
        name: name.clone(),
        entry: name,
        source,
        headers: vec![megamoe_gemm::kernel::HEADERS, HEADERS],
        options: vec![],
    }
}

/// Registry hook: every kernel configuration this crate launches.
pub fn kernel_specs() -> Vec<KernelSpec> {
    vec![split_l1_spec(&l1_config(132))]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_included_header_is_embedded() {
        for (name, body) in HEADERS {
            for line in body.lines() {
                if let Some(inc) = line.trim().strip_prefix("#include <megamoe_layer/") {
                    let inc = format!("megamoe_layer/{}", inc.trim_end_matches('>'));
                    assert!(
                        HEADERS.iter().any(|(n, _)| *n == inc),
                        "{name} includes {inc}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_l1_tile_holds_a_gate_block_and_its_up_block() {
        let c = l1_config(132);
        assert_eq!((c.block_m, c.block_n), (128, 256));
        assert_eq!(POOL_PAD % c.block_m, 0);
        assert!(
            megamoe_gemm::heuristics::smem_bytes(128, 256, c.stages, 128) + 1024
                <= megamoe_gemm::heuristics::MAX_SMEM_BYTES
        );
    }
}
