//! Device sources (embedded) and the kernel specification of each configuration.

use megamoe_cuda::jit::Headers;
use megamoe_cuda::KernelSpec;

use crate::heuristics::{all_configs, Accumulation, GemmConfig, OutDtype};

/// This crate's device headers, included as `<megamoe_gemm/...>`; the PTX wrappers are
/// megamoe-cuda's (`<megamoe/ptx/...>`, namespace `megamoe::ptx`).
pub const HEADERS: Headers = megamoe_cuda::header_set!(
    "device",
    [
        "megamoe_gemm/pipeline/roles.cuh",
        "megamoe_gemm/pipeline/barriers.cuh",
        "megamoe_gemm/mma/wgmma.cuh",
        "megamoe_gemm/mma/mainloop_params.cuh",
        "megamoe_gemm/mma/fp8_mainloop.cuh",
        "megamoe_gemm/layout/smem_desc.cuh",
        "megamoe_gemm/layout/smem_layout.cuh",
        "megamoe_gemm/scheduler/tile.cuh",
        "megamoe_gemm/scheduler/tile_scheduler.cuh",
        "megamoe_gemm/pipeline/tma_producer.cuh",
        "megamoe_gemm/epilogue/store.cuh",
        "megamoe_gemm/impls/grouped_gemm_params.cuh",
        "megamoe_gemm/impls/grouped_gemm.cuh",
    ]
);

/// Threads per CTA: two consumer warpgroups and one producer warpgroup.
pub const THREADS: u32 = 384;

/// The generated translation unit instantiating `config`.
pub fn kernel_spec(config: &GemmConfig) -> KernelSpec {
    let epilogue = match (config.tma_store, config.out) {
        (true, _) => "TmaStoreBf16",
        (false, OutDtype::Bf16) => "StoreRows<megamoe::u16>",
        (false, OutDtype::F32) => "StoreRows<float>",
    };
    let name = config.kernel_name();
    let source = format!(
        "#include <megamoe_gemm/impls/grouped_gemm.cuh>\n\
         static_assert(megamoe::gemm::SmemLayout<{bm}, {bn}, {stages}, {g}>::kBytes + 1024 == {smem},\n\
         \x20             \"the host's shared-memory plan\");\n\
         extern \"C\" __global__ void __launch_bounds__({THREADS}, 1)\n\
         {name}(const __grid_constant__ megamoe::gemm::GroupedGemmParams p) {{\n\
         \x20   using Scheduler = megamoe::gemm::TileScheduler<{bm}, {bn}, {masked}, {cluster}>;\n\
         \x20   using Epilogue = megamoe::gemm::{epilogue};\n\
         \x20   megamoe::gemm::grouped_gemm_fp8<{bm}, {bn}, {stages}, {g}, {masked}, {cluster}, {rescaled},\n\
         \x20                                   Scheduler, Epilogue>(p, Epilogue{{p.epilogue}});\n\
         }}\n",
        bm = config.block_m,
        bn = config.block_n,
        stages = config.stages,
        g = config.group_size,
        masked = config.masked,
        cluster = config.cluster_m,
        smem = config.smem_bytes(),
        rescaled = config.accumulation == Accumulation::Rescaled,
    );
    KernelSpec {
        name: name.clone(),
        entry: name,
        source,
        headers: vec![HEADERS],
        options: vec![],
    }
}

/// Registry hook: every configuration the heuristics can pick (on a 132-SM H100/H200; the SM
/// count changes only the grid, not the code).
pub fn kernel_specs() -> Vec<KernelSpec> {
    all_configs(132).iter().map(kernel_spec).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_config_has_its_own_entry_point() {
        let specs = kernel_specs();
        let names: std::collections::HashSet<_> = specs.iter().map(|s| s.entry.clone()).collect();
        assert_eq!(names.len(), specs.len());
        for s in &specs {
            assert!(s
                .source
                .contains(&format!("void __launch_bounds__(384, 1)\n{}(", s.entry)));
        }
    }

    #[test]
    fn every_included_header_is_embedded() {
        for (name, body) in HEADERS {
            for line in body.lines() {
                if let Some(inc) = line.trim().strip_prefix("#include <megamoe_gemm/") {
                    let inc = format!("megamoe_gemm/{}", inc.trim_end_matches('>'));
                    assert!(
                        HEADERS.iter().any(|(n, _)| *n == inc),
                        "{name} includes {inc}"
                    );
                }
            }
        }
    }
}
