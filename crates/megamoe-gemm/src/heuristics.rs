//! Block sizes, pipeline depth and grid of the grouped GEMM, chosen in pure Rust.
//!
//! Four tile shapes exist, made of m64n128k32 (or m64n192k32) wgmma waves of two consumer
//! warpgroups: 128 x 256 (warpgroups split the rows, two waves each) for prefill-sized groups,
//! because every K block then moves 48 KiB through shared memory for 8.4 MFLOP instead of 32 KiB
//! for 4.2; 128 x 192 (one m64n192 wave per warpgroup: one wgmma drain and promotion per K block
//! instead of two, at the cost of a partial last n-block when 192 does not divide N); 128 x 128
//! when N is not a multiple of 256; and 64 x 256 (warpgroups split the columns) when experts hold
//! few rows, where a 128-row block would mostly multiply padding. Stages fill the
//! shared memory; the grid is one CTA per SM. The 128 x 256 tile also exists on clusters of two
//! CTAs that multicast the weight tile (`cluster_m`), a benchmark knob not chosen here. Every
//! tile shape also exists with the running sum kept in the accumulator
//! ([`Accumulation::Rescaled`], the caller's opt-in, passed through [`GemmProblem`]).
//!
//! The tile shapes, the shared-memory plan and the rules for BLOCK_M and BLOCK_N live in
//! `megamoe_core::plan::heuristics`, which the planner reads too.

pub use megamoe_core::numerics::Accumulation;
use megamoe_core::plan::heuristics::{block_m, block_n};
pub use megamoe_core::plan::heuristics::{
    max_stages, smem_bytes, MAX_EXPERTS, MAX_K_BLOCKS, MAX_SMEM_BYTES, MAX_STAGES, TILE_SHAPES,
};

use crate::error::GemmError;

/// Whether a BLOCK_N tiles N: 128 and 256 must divide it; a 192-column tile may leave a partial
/// last n-block (N is a multiple of 128, so at most 128 of its columns are past N).
pub fn block_n_tiles(n: usize, block_n: usize) -> bool {
    block_n == 192 || n % block_n == 0
}

/// How the rows of the activations are grouped by expert.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Rows grouped by expert, each segment padded to a multiple of `pad`.
    Contiguous { pad: usize },
    /// `[E, max_m, K]` with a per-expert count of valid rows (decode).
    Masked { max_m: usize },
}

/// Element type of the output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OutDtype {
    Bf16,
    F32,
}

impl OutDtype {
    pub fn bytes(self) -> usize {
        match self {
            OutDtype::Bf16 => 2,
            OutDtype::F32 => 4,
        }
    }
}

/// What a launch computes, as far as the choice of kernel depends on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmProblem {
    pub experts: usize,
    pub n: usize,
    pub k: usize,
    /// Activation scale group along K: 128, or 64 for the L2 operand.
    pub group_size: usize,
    pub layout: Layout,
    pub out: OutDtype,
    /// Expected rows per expert (tokens·top-k / experts); steers the block shape only.
    pub rows_per_expert: usize,
    /// How the K loop sums over K (the default promotes each scale group).
    pub accumulation: Accumulation,
}

/// One instantiation of the kernel and how it is launched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmConfig {
    pub block_m: usize,
    pub block_n: usize,
    pub stages: usize,
    pub group_size: usize,
    pub masked: bool,
    pub out: OutDtype,
    /// bf16 tiles leave through shared memory and TMA stores that overlap the next tile
    /// (contiguous layout only: it writes whole tiles); otherwise straight from registers.
    pub tma_store: bool,
    /// m-blocks of one expert walked together per n-block.
    pub group_m: usize,
    /// CTAs per cluster: 2 pairs CTAs on m-blocks 2i, 2i + 1 of one expert and n-block, each
    /// loading half the weight tile and multicasting it to both (128 x 256 tiles only).
    pub cluster_m: usize,
    /// The K loop's accumulation ([`GemmProblem::accumulation`]).
    pub accumulation: Accumulation,
    pub ctas: usize,
}

impl GemmConfig {
    /// Dynamic shared memory of the launch, including the 1 KiB alignment slack.
    pub fn smem_bytes(&self) -> usize {
        smem_bytes(self.block_m, self.block_n, self.stages, self.group_size) + 1024
    }

    /// The kernel symbol of this instantiation.
    pub fn kernel_name(&self) -> String {
        format!(
            "grouped_gemm_fp8_m{}_n{}_s{}_g{}_{}_{}{}{}{}",
            self.block_m,
            self.block_n,
            self.stages,
            self.group_size,
            if self.masked { "masked" } else { "contiguous" },
            match self.out {
                OutDtype::Bf16 => "bf16",
                OutDtype::F32 => "f32",
            },
            if self.tma_store { "_tma" } else { "" },
            if self.cluster_m > 1 {
                format!("_c{}", self.cluster_m)
            } else {
                String::new()
            },
            match self.accumulation {
                Accumulation::PerBlock => "",
                Accumulation::Rescaled => "_rescaled",
            }
        )
    }
}

/// Whether the TMA-store epilogue applies (see `GemmConfig::tma_store`).
pub fn tma_store_applies(masked: bool, out: OutDtype) -> bool {
    !masked && out == OutDtype::Bf16
}

/// Checks the shape rules this kernel has (clear errors naming the limit).
pub fn validate(p: &GemmProblem) -> Result<(), GemmError> {
    let bad = |arg: &'static str, reason: String| Err(GemmError::Shape { arg, reason });
    if p.experts == 0 || p.experts > MAX_EXPERTS {
        return bad(
            "experts",
            format!("{} is not in 1..={MAX_EXPERTS}", p.experts),
        );
    }
    if p.n == 0 || p.n % 128 != 0 {
        return bad("n", format!("{} is not a positive multiple of 128", p.n));
    }
    if p.k == 0 || p.k % 128 != 0 || p.k > 128 * MAX_K_BLOCKS {
        return bad(
            "k",
            format!(
                "{} is not a positive multiple of 128 up to {}",
                p.k,
                128 * MAX_K_BLOCKS
            ),
        );
    }
    if p.group_size != 64 && p.group_size != 128 {
        return bad(
            "group_size",
            format!("{} is neither 64 nor 128", p.group_size),
        );
    }
    match p.layout {
        Layout::Contiguous { pad } if pad != 64 && pad != 128 => {
            bad("pad", format!("{pad} is neither 64 nor 128"))
        }
        Layout::Masked { max_m } if max_m == 0 || max_m % 4 != 0 => bad(
            "max_m",
            format!("{max_m} is not a positive multiple of 4 (16-byte scale rows)"),
        ),
        _ => Ok(()),
    }
}

/// Picks the kernel configuration for `p` on a GPU with `sms` multiprocessors.
pub fn choose(p: &GemmProblem, sms: usize) -> Result<GemmConfig, GemmError> {
    validate(p)?;
    // Segments padded to 64 rows only fit 64-row blocks.
    let pad_64 = matches!(p.layout, Layout::Contiguous { pad } if pad % 128 != 0);
    let wanted = if pad_64 {
        64
    } else {
        block_m(p.rows_per_expert)
    };
    let (block_m, block_n) = match block_n(wanted, p.n) {
        Some(block_n) => (wanted, block_n),
        None if pad_64 => {
            return Err(GemmError::Shape {
                arg: "n",
                reason: format!("{} must be a multiple of 256 with 64-row segments", p.n),
            })
        }
        None => (
            128,
            block_n(128, p.n).expect("validated: n is a multiple of 128"),
        ),
    };
    let config = GemmConfig {
        block_m,
        block_n,
        stages: max_stages(block_m, block_n, p.group_size),
        group_size: p.group_size,
        masked: matches!(p.layout, Layout::Masked { .. }),
        out: p.out,
        tma_store: tma_store_applies(matches!(p.layout, Layout::Masked { .. }), p.out),
        group_m: 8,
        cluster_m: 1,
        accumulation: p.accumulation,
        ctas: sms,
    };
    if std::env::var_os("MEGAMOE_GEMM_LOG").is_some() {
        eprintln!("megamoe-gemm: {p:?} -> {config:?}");
    }
    Ok(config)
}

/// `config` with another BLOCK_N (a benchmark knob for tuning these rules), or None if the
/// tile shape does not exist or does not tile `p.n` (see `block_n_tiles`).
pub fn with_block_n(config: GemmConfig, p: &GemmProblem, block_n: usize) -> Option<GemmConfig> {
    let shape = (config.block_m, block_n);
    if !TILE_SHAPES.contains(&shape) || !block_n_tiles(p.n, block_n) {
        return None;
    }
    Some(GemmConfig {
        block_n,
        stages: max_stages(config.block_m, block_n, config.group_size),
        ..config
    })
}

/// `config` on clusters of `cluster_m` CTAs sharing the weight tile, or None where that does
/// not exist (only 128 x 256 tiles, N a multiple of 2 · 256).
pub fn with_cluster(config: GemmConfig, p: &GemmProblem, cluster_m: usize) -> Option<GemmConfig> {
    let exists = cluster_m == 1
        || (cluster_m == 2
            && (config.block_m, config.block_n) == (128, 256)
            && p.n % (cluster_m * config.block_n) == 0);
    exists.then_some(GemmConfig {
        cluster_m,
        ctas: config.ctas - config.ctas % cluster_m,
        ..config
    })
}

/// Every configuration `choose` can return, in either accumulation (and the clustered variant
/// of the 128 x 256 tile, in either accumulation), for compile-everything checks.
pub fn all_configs(sms: usize) -> Vec<GemmConfig> {
    use Accumulation::{PerBlock, Rescaled};
    let mut out = Vec::new();
    for (block_m, block_n, cluster_m, accumulation) in TILE_SHAPES
        .iter()
        .map(|&(m, n)| (m, n, 1, PerBlock))
        .chain([(128, 256, 2, PerBlock), (128, 256, 2, Rescaled)])
        .chain(TILE_SHAPES.iter().map(|&(m, n)| (m, n, 1, Rescaled)))
    {
        for group_size in [128, 64] {
            for masked in [false, true] {
                for dtype in [OutDtype::Bf16, OutDtype::F32] {
                    for tma_store in [true, false] {
                        if tma_store && !tma_store_applies(masked, dtype) {
                            continue;
                        }
                        out.push(GemmConfig {
                            block_m,
                            block_n,
                            stages: max_stages(block_m, block_n, group_size),
                            group_size,
                            masked,
                            out: dtype,
                            tma_store,
                            group_m: 8,
                            cluster_m,
                            accumulation,
                            ctas: sms - sms % cluster_m,
                        });
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(rows: usize, layout: Layout, group_size: usize) -> GemmProblem {
        GemmProblem {
            experts: 128,
            n: 4096,
            k: 4096,
            group_size,
            layout,
            out: OutDtype::Bf16,
            rows_per_expert: rows,
            accumulation: Accumulation::PerBlock,
        }
    }

    #[test]
    fn prefill_uses_square_tiles_and_decode_wide_ones() {
        let c = choose(&problem(512, Layout::Contiguous { pad: 128 }, 128), 132).unwrap();
        assert_eq!((c.block_m, c.block_n, c.stages, c.ctas), (128, 256, 4, 132));
        let mut narrow = problem(512, Layout::Contiguous { pad: 128 }, 64);
        narrow.n = 384;
        let c = choose(&narrow, 132).unwrap();
        assert_eq!((c.block_m, c.block_n, c.stages), (128, 128, 6));
        let c = choose(&problem(32, Layout::Masked { max_m: 32 }, 128), 132).unwrap();
        assert_eq!((c.block_m, c.block_n, c.stages), (64, 256, 5));
        assert!(c.masked && !c.tma_store);
        let c = choose(&problem(512, Layout::Contiguous { pad: 128 }, 128), 132).unwrap();
        assert!(c.tma_store);
    }

    #[test]
    fn segments_padded_to_64_force_64_row_blocks() {
        let c = choose(&problem(1024, Layout::Contiguous { pad: 64 }, 128), 132).unwrap();
        assert_eq!(c.block_m, 64);
    }

    #[test]
    fn clusters_exist_only_for_the_128_by_256_tile() {
        let p = problem(512, Layout::Contiguous { pad: 128 }, 128);
        let c = choose(&p, 133).unwrap();
        assert_eq!(c.cluster_m, 1);
        let c2 = with_cluster(c, &p, 2).unwrap();
        assert_eq!((c2.cluster_m, c2.ctas), (2, 132));
        assert!(c2.kernel_name().ends_with("_c2"));
        let small = choose(&problem(32, Layout::Contiguous { pad: 64 }, 128), 132).unwrap();
        assert!(with_cluster(small, &p, 2).is_none());
        let mut odd = p;
        odd.n = 768;
        assert!(with_cluster(choose(&odd, 132).unwrap(), &odd, 2).is_none());
        assert!(with_cluster(c, &p, 4).is_none());
    }

    #[test]
    fn the_192_column_tile_may_leave_a_partial_last_n_block() {
        assert!(block_n_tiles(4096, 192) && block_n_tiles(128, 192));
        assert!(block_n_tiles(4096, 256) && !block_n_tiles(384, 256));
        let p = problem(512, Layout::Contiguous { pad: 128 }, 128);
        let c = with_block_n(choose(&p, 132).unwrap(), &p, 192).unwrap();
        assert_eq!((c.block_m, c.block_n, c.stages), (128, 192, 5));
        assert!(c.kernel_name().contains("_m128_n192_s5_"));
        let small = choose(&problem(32, Layout::Masked { max_m: 32 }, 128), 132).unwrap();
        assert!(with_block_n(small, &p, 192).is_none(), "no 64 x 192 tile");
        assert_eq!(
            all_configs(132).iter().filter(|c| c.block_n == 192).count(),
            20
        );
    }

    #[test]
    fn every_config_fits_shared_memory_with_at_least_four_stages() {
        for c in all_configs(132) {
            assert!(c.smem_bytes() <= MAX_SMEM_BYTES, "{c:?}");
            assert!(c.stages >= 4, "{c:?}");
            assert!(
                smem_bytes(c.block_m, c.block_n, c.stages + 1, c.group_size) + 1024
                    > MAX_SMEM_BYTES
                    || c.stages == MAX_STAGES
            );
        }
    }

    #[test]
    fn bad_shapes_name_the_argument() {
        let mut p = problem(32, Layout::Contiguous { pad: 128 }, 128);
        p.k = 100;
        assert!(matches!(
            choose(&p, 132),
            Err(GemmError::Shape { arg: "k", .. })
        ));
        p.k = 128 * (MAX_K_BLOCKS + 1);
        assert!(matches!(
            choose(&p, 132),
            Err(GemmError::Shape { arg: "k", .. })
        ));
        p.k = 4096;
        p.group_size = 32;
        assert!(matches!(
            choose(&p, 132),
            Err(GemmError::Shape {
                arg: "group_size",
                ..
            })
        ));
        p.group_size = 64;
        p.layout = Layout::Masked { max_m: 30 };
        assert!(matches!(
            choose(&p, 132),
            Err(GemmError::Shape { arg: "max_m", .. })
        ));
        p.layout = Layout::Contiguous { pad: 64 };
        p.n = 384;
        assert!(matches!(
            choose(&p, 132),
            Err(GemmError::Shape { arg: "n", .. })
        ));
    }

    #[test]
    fn the_planner_picks_the_gemms_tiles() {
        use megamoe_core::plan::heuristics::{rows_per_expert, tile_config};
        for preset in megamoe_core::preset::PRESETS {
            let s = preset.shape;
            for bound in [1, 256, 512, 8192] {
                let plan = tile_config(&s, 8, bound, 64);
                let gemms = [
                    (2 * s.inter, s.hidden, 128, plan.block_n_l1, plan.stages_l1),
                    (s.hidden, s.inter, 64, plan.block_n_l2, plan.stages_l2),
                ];
                for (n, k, group_size, block_n, stages) in gemms {
                    let p = GemmProblem {
                        experts: s.local_experts(8),
                        n,
                        k,
                        group_size,
                        layout: Layout::Masked { max_m: 4096 },
                        out: OutDtype::Bf16,
                        rows_per_expert: rows_per_expert(&s, 8, bound),
                        accumulation: Accumulation::PerBlock,
                    };
                    let c = choose(&p, 132).unwrap();
                    let want = (plan.block_m, block_n, stages);
                    assert_eq!(
                        (c.block_m, c.block_n, c.stages),
                        want,
                        "{} at {bound}",
                        preset.name
                    );
                }
            }
        }
    }

    #[test]
    fn the_rescaled_accumulation_exists_for_every_tile_choose_picks_and_nothing_else_changes() {
        let configs = all_configs(132);
        let rescaled: Vec<_> = configs
            .iter()
            .filter(|c| c.accumulation == Accumulation::Rescaled)
            .collect();
        // Every promoted configuration, once more rescaled.
        assert_eq!(rescaled.len(), 50);
        assert_eq!(configs.len(), 100);
        for c in rescaled {
            assert!(
                c.kernel_name().ends_with("_rescaled"),
                "{}",
                c.kernel_name()
            );
            let promoted = GemmConfig {
                accumulation: Accumulation::PerBlock,
                ..*c
            };
            assert!(configs.contains(&promoted), "{c:?}");
            assert_eq!(
                c.kernel_name(),
                format!("{}_rescaled", promoted.kernel_name())
            );
        }
        for rows in [1, 32, 64, 512, 4096] {
            for layout in [
                Layout::Contiguous { pad: 128 },
                Layout::Masked { max_m: 64 },
            ] {
                for group_size in [64, 128] {
                    let p = problem(rows, layout, group_size);
                    let promoted = choose(&p, 132).unwrap();
                    assert_eq!(promoted.accumulation, Accumulation::PerBlock);
                    let p = GemmProblem {
                        accumulation: Accumulation::Rescaled,
                        ..p
                    };
                    let c = choose(&p, 132).unwrap();
                    assert_eq!(
                        c,
                        GemmConfig {
                            accumulation: Accumulation::Rescaled,
                            ..promoted
                        }
                    );
                    assert!(configs.contains(&c), "{c:?}");
                }
            }
        }
    }

    #[test]
    fn kernel_names_differ_per_config() {
        let names: std::collections::HashSet<_> =
            all_configs(132).iter().map(|c| c.kernel_name()).collect();
        assert_eq!(names.len(), all_configs(132).len());
    }
}
