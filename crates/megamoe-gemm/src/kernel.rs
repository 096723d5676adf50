//! Device sources (embedded) and the generated translation unit of each configuration.

use crate::heuristics::{GemmConfig, OutDtype};

/// Every device header, by the path the `#include` lines use (relative to kernels/).
const SOURCES: &[(&str, &str)] = &[
    ("ptx/types.cuh", include_str!("../kernels/ptx/types.cuh")),
    ("ptx/mbarrier.cuh", include_str!("../kernels/ptx/mbarrier.cuh")),
    ("ptx/tma.cuh", include_str!("../kernels/ptx/tma.cuh")),
    ("ptx/sync.cuh", include_str!("../kernels/ptx/sync.cuh")),
    ("mma/wgmma.cuh", include_str!("../kernels/mma/wgmma.cuh")),
    ("mma/fp8_mainloop.cuh", include_str!("../kernels/mma/fp8_mainloop.cuh")),
    ("layout/smem_desc.cuh", include_str!("../kernels/layout/smem_desc.cuh")),
    ("layout/smem_layout.cuh", include_str!("../kernels/layout/smem_layout.cuh")),
    ("scheduler/tile_scheduler.cuh", include_str!("../kernels/scheduler/tile_scheduler.cuh")),
    ("pipeline/tma_producer.cuh", include_str!("../kernels/pipeline/tma_producer.cuh")),
    ("epilogue/store.cuh", include_str!("../kernels/epilogue/store.cuh")),
    ("impls/grouped_gemm_params.cuh", include_str!("../kernels/impls/grouped_gemm_params.cuh")),
    ("impls/grouped_gemm.cuh", include_str!("../kernels/impls/grouped_gemm.cuh")),
];

/// Threads per CTA: two consumer warpgroups and one producer warpgroup.
pub const THREADS: u32 = 384;

/// The translation unit that instantiates `config`, with every include inlined once
/// (NVRTC then needs no include path).
pub fn translation_unit(config: &GemmConfig) -> String {
    let epilogue = match (config.tma_store, config.out) {
        (true, _) => "TmaStoreBf16",
        (false, OutDtype::Bf16) => "StoreRows<u16>",
        (false, OutDtype::F32) => "StoreRows<float>",
    };
    let entry = format!(
        "#include \"impls/grouped_gemm.cuh\"\n\
         extern \"C\" __global__ void __launch_bounds__({THREADS}, 1)\n\
         {name}(const __grid_constant__ GroupedGemmParams p) {{\n\
         \x20   grouped_gemm_fp8<{bm}, {bn}, {stages}, {g}, {masked}, {epilogue}>(p);\n\
         }}\n",
        name = config.kernel_name(),
        bm = config.block_m,
        bn = config.block_n,
        stages = config.stages,
        g = config.group_size,
        masked = config.masked,
    );
    let mut seen = Vec::new();
    let mut tu = String::new();
    inline_includes(&entry, &mut seen, &mut tu);
    tu
}

fn inline_includes(text: &str, seen: &mut Vec<&'static str>, out: &mut String) {
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed == "#pragma once" {
            continue;
        }
        if let Some(path) = trimmed
            .strip_prefix("#include \"")
            .and_then(|r| r.strip_suffix('"'))
        {
            let (name, body) = SOURCES
                .iter()
                .find(|(name, _)| *name == path)
                .unwrap_or_else(|| panic!("device include `{path}` is not embedded"));
            if !seen.contains(name) {
                seen.push(name);
                inline_includes(body, seen, out);
            }
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::heuristics::all_configs;

    #[test]
    fn translation_units_inline_every_header_once() {
        for config in all_configs(132) {
            let tu = translation_unit(&config);
            assert!(!tu.contains("#include"));
            assert_eq!(tu.matches("struct GroupedGemmParams {").count(), 1);
            assert!(tu.contains(&config.kernel_name()));
        }
    }
}
