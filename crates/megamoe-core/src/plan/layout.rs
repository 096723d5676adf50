//! Symmetric-buffer layouts of the split and fused kernels (SPEC §4).
//!
//! Every rank allocates the same layout; peers address each other's regions by these offsets.
//! Sizes are functions of (R, E, K, H, I, T_max, G) and of [`SLOT_ROWS`]; the offsets are what
//! the kernels receive in their parameter struct.

use serde::Serialize;

use super::rules::{self, RingSizing, SLOT_ROWS};
use crate::error::Result;
use crate::preset::Shape;

/// Alignment of every region: above TMA's 16 B and a whole number of 128 B lines, so no two
/// regions share a cache line and flags never share a line with data.
pub const REGION_ALIGN: u64 = 256;
/// Bytes of one pool row's record: source token (u32), source rank (u16), slot k (u16),
/// router weight (f32), padding to 16.
pub const ROW_INFO_BYTES: u64 = 16;
/// Bytes of one tile-table entry: expert, first row, rows, slot (u32 each).
pub const TILE_ENTRY_BYTES: u64 = 16;
/// Flag words per pool slot: arrived, L1-full, L2-empty (u32), in two launch-parity banks so a
/// launch never needs to clear the previous launch's flags behind a barrier.
pub const SLOT_FLAG_BYTES: u64 = 3 * 4 * 2;
/// Bytes of the error record a timed-out wait leaves (rank, wait id, value seen, deadline).
pub const ERROR_RECORD_BYTES: u64 = 64;
/// The smallest block_m, which bounds how many tile-table entries a call can need.
const MIN_BLOCK_M: usize = 64;

/// Which kernel a buffer serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kernel {
    /// Two launches; the L1 output pool holds every row of the call.
    Split,
    /// One persistent launch; the L1 input and output pools are a ring.
    Fused,
}

/// One region of the symmetric buffer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Region {
    pub name: &'static str,
    /// What it holds, with its element type and extents.
    pub what: String,
    pub offset: u64,
    pub bytes: u64,
    pub align: u64,
}

/// The symmetric buffer of one rank.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SymmetricLayout {
    pub kernel: Kernel,
    pub shape: Shape,
    pub ranks: usize,
    /// Scale granularity of the intermediate activation (64 or 128).
    pub gran: usize,
    pub ring: RingSizing,
    /// Rows of the L1 input and output pools: the full pool (split) or the ring (fused).
    pub pool_rows: usize,
    pub regions: Vec<Region>,
    pub total_bytes: u64,
}

impl SymmetricLayout {
    /// The layout for `t_max` tokens per rank. Checks the shape, the rank count and `gran`.
    pub fn new(
        kernel: Kernel,
        shape: &Shape,
        ranks: usize,
        t_max: usize,
        gran: usize,
    ) -> Result<Self> {
        shape.validate(ranks)?;
        rules::check_gran(shape, gran)?;
        let ring = RingSizing::new(shape, ranks, t_max);
        let pool_rows = match kernel {
            Kernel::Split => ring.pool_rows,
            Kernel::Fused => ring.ring_rows,
        };
        let (h, i, k, r) = (
            shape.hidden as u64,
            shape.inter as u64,
            shape.topk as u64,
            ranks as u64,
        );
        let (t, rows, local) = (
            ring.t_cap as u64,
            pool_rows as u64,
            shape.local_experts(ranks) as u64,
        );
        let slots = rows / SLOT_ROWS as u64;
        let table_entries = (ring.pool_rows / MIN_BLOCK_M) as u64;
        let parts: [(&'static str, String, u64); 14] = [
            (
                "x",
                format!("e4m3 [{t}, {h}]: input tokens, pulled by peers"),
                t * h,
            ),
            (
                "x_scales",
                format!("f32 [{t}, {}]", h / 128),
                t * (h / 128) * 4,
            ),
            ("topk_idx", format!("i32 [{t}, {k}]"), t * k * 4),
            ("topk_weights", format!("f32 [{t}, {k}]"), t * k * 4),
            (
                "counts",
                format!(
                    "u32 [{r}, {}]: rows per local expert and (T, bound), from each source",
                    local + 2
                ),
                r * (local + 2) * 4,
            ),
            (
                "slot_flags",
                format!(
                    "u32 [2, {slots}, 3]: arrived, L1-full, L2-empty per slot, two parity banks"
                ),
                slots * SLOT_FLAG_BYTES,
            ),
            (
                "l1_pool",
                format!("e4m3 [{rows}, {h}]: pulled rows"),
                rows * h,
            ),
            (
                "l1_pool_scales",
                format!("f32 [{rows}, {}]", h / 128),
                rows * (h / 128) * 4,
            ),
            (
                "l2_pool",
                format!("e4m3 [{rows}, {i}]: L1 output after SwiGLU"),
                rows * i,
            ),
            (
                "l2_pool_scales",
                format!("f32 [{rows}, {}]: per {gran} columns", i / gran as u64),
                rows * (i / gran as u64) * 4,
            ),
            (
                "row_info",
                format!("[{rows}] x 16 B: source token, rank, slot, weight"),
                rows * ROW_INFO_BYTES,
            ),
            (
                "tile_table",
                format!("[{table_entries}] x 16 B: m-blocks of the call"),
                table_entries * TILE_ENTRY_BYTES,
            ),
            (
                "combine",
                format!("bf16 [{t}, {k}, {h}]: L2 rows scattered back by the experts' ranks"),
                t * k * h * 2,
            ),
            (
                "workspace",
                format!("u64 [2, {r}] done signals, grid barrier, error record"),
                2 * r * 8 + 64 + ERROR_RECORD_BYTES,
            ),
        ];
        let mut regions = Vec::with_capacity(parts.len());
        let mut offset = 0u64;
        for (name, what, bytes) in parts {
            offset = offset.next_multiple_of(REGION_ALIGN);
            regions.push(Region {
                name,
                what,
                offset,
                bytes,
                align: REGION_ALIGN,
            });
            offset += bytes;
        }
        Ok(SymmetricLayout {
            kernel,
            shape: *shape,
            ranks,
            gran,
            ring,
            pool_rows,
            regions,
            total_bytes: offset.next_multiple_of(REGION_ALIGN),
        })
    }

    /// The region called `name`.
    pub fn region(&self, name: &str) -> Option<&Region> {
        self.regions.iter().find(|r| r.name == name)
    }
}

/// Bytes → MiB.
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preset::Preset;

    fn sizes(preset: &str, t_max: usize) -> (u64, u64) {
        let shape = Preset::by_name(preset).unwrap().shape;
        let g = rules::default_gran(&shape);
        let split = SymmetricLayout::new(Kernel::Split, &shape, 8, t_max, g).unwrap();
        let fused = SymmetricLayout::new(Kernel::Fused, &shape, 8, t_max, g).unwrap();
        (split.total_bytes, fused.total_bytes)
    }

    #[test]
    fn fused_is_at_least_four_times_smaller_at_8192_on_flash_and_pro() {
        for preset in ["flash", "pro"] {
            let (split, fused) = sizes(preset, 8192);
            assert!(split >= 4 * fused, "{preset}: {split} vs {fused}");
        }
    }

    #[test]
    fn regions_are_aligned_disjoint_and_in_order() {
        let shape = Preset::by_name("pro").unwrap().shape;
        for kernel in [Kernel::Split, Kernel::Fused] {
            let l = SymmetricLayout::new(kernel, &shape, 8, 3000, 64).unwrap();
            let mut end = 0;
            for r in &l.regions {
                assert_eq!(r.offset % r.align, 0, "{}", r.name);
                assert!(r.offset >= end, "{} overlaps", r.name);
                end = r.offset + r.bytes;
            }
            assert!(l.total_bytes >= end);
        }
    }

    #[test]
    fn below_the_lag_threshold_both_kernels_hold_the_full_pool() {
        let (split, fused) = sizes("flash", 512);
        assert_eq!(split, fused);
    }

    #[test]
    fn bad_gran_and_ranks_are_rejected() {
        let shape = Preset::by_name("flash").unwrap().shape;
        assert!(SymmetricLayout::new(Kernel::Fused, &shape, 8, 1024, 96).is_err());
        assert!(SymmetricLayout::new(Kernel::Fused, &shape, 3, 1024, 128).is_err());
    }
}
