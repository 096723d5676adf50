//! Symmetric-buffer layouts of the split and fused kernels (SPEC §4).
//!
//! Every rank allocates the same layout; peers address each other's regions by these offsets,
//! which are what the kernels receive in their parameter struct. The split kernel's buffer is
//! megamoe-ep's ([`super::buffer`]), the one the split layer allocates. The fused kernel has its
//! own regions; it signals the way megamoe-ep does (device/megamoe_ep/comm/sync.cuh), so both
//! buffers start with the same signal regions and end with the same error record.

use serde::Serialize;

use super::buffer::{BufferLayout, BufferSpec, MAX_RANKS};
use super::rules::{self, RingSizing, SLOT_ROWS};
use crate::error::Result;
use crate::preset::Shape;

/// Alignment of every region: above TMA's 16 B and a whole number of 128 B lines, so no two
/// regions share a cache line and flags never share a line with data.
pub const REGION_ALIGN: u64 = 256;
/// Bytes of one ring row's record besides its data: routing weight (f32) and the address of its
/// L2 output row (u64).
pub const ROW_INFO_BYTES: u64 = 12;
/// Bytes of the record a call rejected on the device leaves: code, rank, what, peer (u32),
/// value seen, value expected (u64). Expired waits are recorded outside the buffer, in
/// megamoe-cuda's `WaitRecord`.
pub const ERROR_RECORD_BYTES: u64 = 32;
/// Signal kinds, each one u64 counter per source rank: dispatch ready and done, combine ready
/// and done.
pub const SIGNAL_KINDS: usize = 4;
/// Kernel families that count their calls (dispatch, combine), one u64 epoch each.
const EPOCH_FAMILIES: usize = 2;

/// Which kernel a buffer serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kernel {
    /// Two launches; the L1 output pool holds every row of the call.
    Split,
    /// One persistent launch; the L1 input and output pools are a ring.
    Fused,
}

impl Kernel {
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Split => "split",
            Kernel::Fused => "fused",
        }
    }
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

/// Regions laid out one after another, each on a [`REGION_ALIGN`] boundary.
#[derive(Default)]
pub(crate) struct Regions(Vec<Region>);

impl Regions {
    /// Appends a region; returns its offset.
    pub(crate) fn push(&mut self, name: &'static str, what: String, bytes: usize) -> usize {
        let offset = self.end().next_multiple_of(REGION_ALIGN);
        self.0.push(Region {
            name,
            what,
            offset,
            bytes: bytes as u64,
            align: REGION_ALIGN,
        });
        offset as usize
    }

    fn end(&self) -> u64 {
        self.0.last().map_or(0, |r| r.offset + r.bytes)
    }

    /// The regions and the buffer's bytes (the last region's end, aligned).
    pub(crate) fn finish(self) -> (Vec<Region>, usize) {
        let size = self.end().next_multiple_of(REGION_ALIGN) as usize;
        (self.0, size)
    }
}

/// The first regions of a buffer: the epochs and signals megamoe-ep's `Signals` addresses.
/// Returns their offsets.
pub(crate) fn push_signals(c: &mut Regions) -> (usize, usize) {
    let epochs = c.push(
        "epochs",
        format!("u64 [{EPOCH_FAMILIES}]: calls so far of each kernel family"),
        EPOCH_FAMILIES * 8,
    );
    let signals = c.push(
        "signals",
        format!("u64 [{SIGNAL_KINDS}, {MAX_RANKS}]: counters per kind and source rank"),
        SIGNAL_KINDS * MAX_RANKS * 8,
    );
    (epochs, signals)
}

/// The last region of a buffer: the error record. Returns its offset.
pub(crate) fn push_error(c: &mut Regions) -> usize {
    c.push(
        "error",
        "error record: the first error of a call".into(),
        ERROR_RECORD_BYTES as usize,
    )
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
    /// Rows of the pools: the dispatched pool (split) or the ring (fused).
    pub pool_rows: usize,
    pub regions: Vec<Region>,
    pub total_bytes: u64,
    /// The fused kernel's regions by name (`Some` for [`Kernel::Fused`]).
    #[serde(skip)]
    pub fused: Option<FusedOffsets>,
}

impl SymmetricLayout {
    /// The layout for `t_max` tokens per rank (aligned up to 128). Checks the shape, the rank
    /// count, `gran` and `t_max`.
    pub fn new(
        kernel: Kernel,
        shape: &Shape,
        ranks: usize,
        t_max: usize,
        gran: usize,
    ) -> Result<Self> {
        // Checked in this order (shape, G, T_max) before the ring's arithmetic.
        shape.validate(ranks)?;
        rules::check_gran(shape, gran)?;
        rules::check_tokens(t_max)?;
        Self::with_ring(
            kernel,
            shape,
            ranks,
            gran,
            RingSizing::new(shape, ranks, t_max),
        )
    }

    /// The layout with the ring `ring` (e.g. [`RingSizing::full_pool`], the fused kernel whose
    /// ring never wraps: the selftest's reference for the wrapping one).
    pub fn with_ring(
        kernel: Kernel,
        shape: &Shape,
        ranks: usize,
        gran: usize,
        ring: RingSizing,
    ) -> Result<Self> {
        shape.validate(ranks)?;
        rules::check_gran(shape, gran)?;
        // The split layer pads each expert's segment to whole slots.
        let spec = BufferSpec::for_shape(ranks, shape, ring.t_cap, SLOT_ROWS);
        spec.validate()?;
        let (pool_rows, (regions, total), fused) = match kernel {
            Kernel::Split => (
                spec.max_rows(),
                (BufferLayout::regions(&spec), BufferLayout::new(&spec).size),
                None,
            ),
            Kernel::Fused => {
                let (offsets, regions) = fused_regions(shape, ranks, &ring, gran);
                (ring.ring_rows, regions, Some(offsets))
            }
        };
        Ok(SymmetricLayout {
            kernel,
            shape: *shape,
            ranks,
            gran,
            ring,
            pool_rows,
            regions,
            total_bytes: total as u64,
            fused,
        })
    }

    /// The region called `name`.
    pub fn region(&self, name: &str) -> Option<&Region> {
        self.regions.iter().find(|r| r.name == name)
    }
}

/// Bytes of one m-block's entry in the plan (expert, first row, rows, pad: u32 each), of one
/// stream segment (kind, first block, blocks, first task) and of one block's counters (rows
/// pulled, L1 and L2 warpgroup-tasks done, L1 started).
pub const PLAN_ENTRY_BYTES: usize = 16;
/// Bytes of the plan's header: blocks, segments, tasks, status, the next unclaimed task (u32
/// each).
pub const PLAN_HEADER_BYTES: usize = 20;
/// Bytes of a local expert's L2 counters: warpgroup-tasks done and owed (u32 each).
pub const EXPERT_L2_BYTES: usize = 8;

/// Most m-blocks of 128 rows one call of a fused buffer can have.
pub fn fused_max_blocks(shape: &Shape, ranks: usize, t_cap: usize) -> usize {
    rules::worst_case_blocks(shape, ranks, t_cap, SLOT_ROWS).max(1)
}

/// Most stream segments (one kind of task over one unit) a call can have: two per unit, and an
/// expert's blocks make at most blocks / 8 + 1 units.
pub fn fused_max_segments(shape: &Shape, ranks: usize, t_cap: usize) -> usize {
    let local = shape.local_experts(ranks);
    2 * (local + fused_max_blocks(shape, ranks, t_cap) / rules::UNIT_BLOCKS + 1)
}

/// Byte offsets of the fused kernel's regions, the same in every rank's buffer (what the
/// kernel's `FusedRegions` receives; megamoe-layer's src/kernel.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FusedOffsets {
    pub epochs: u64,
    pub signals: u64,
    pub x: u64,
    pub x_scales: u64,
    pub topk_idx: u64,
    pub topk_weights: u64,
    pub counts: u64,
    pub send_list: u64,
    pub l1_pool: u64,
    pub l1_pool_scales: u64,
    pub l2_pool: u64,
    pub l2_pool_scales: u64,
    pub ring_weights: u64,
    pub row_dest: u64,
    pub plan: u64,
    pub src_base: u64,
    pub blocks: u64,
    pub segments: u64,
    pub block_flags: u64,
    pub expert_l2: u64,
    pub expert_done: u64,
    pub grid_barrier: u64,
    pub combine: u64,
    pub error: u64,
}

/// The fused kernel's buffer (megamoe-layer's device/megamoe_layer/impls/fused.cuh): the call's
/// inputs and published routing (peers read them), the ring, the call's plan and block
/// counters (private to the rank), the combine rows (peers write them), between the shared
/// signal regions and the error record.
fn fused_regions(
    shape: &Shape,
    ranks: usize,
    ring: &RingSizing,
    gran: usize,
) -> (FusedOffsets, (Vec<Region>, usize)) {
    let (h, i, k, e) = (shape.hidden, shape.inter, shape.topk, shape.experts);
    let (t, rows, local) = (ring.t_cap, ring.ring_rows, shape.local_experts(ranks));
    let blocks = fused_max_blocks(shape, ranks, t);
    let segments = fused_max_segments(shape, ranks, t);
    let mut c = Regions::default();
    let (epochs, signals) = push_signals(&mut c);
    let push = |c: &mut Regions, name, what, bytes| c.push(name, what, bytes) as u64;
    let offsets = FusedOffsets {
        epochs: epochs as u64,
        signals: signals as u64,
        x: push(
            &mut c,
            "x",
            format!("e4m3 [{t}, {h}]: input tokens, pulled by peers"),
            t * h,
        ),
        x_scales: push(
            &mut c,
            "x_scales",
            format!("f32 [{t}, {}]", h / 128),
            t * (h / 128) * 4,
        ),
        topk_idx: push(&mut c, "topk_idx", format!("i32 [{t}, {k}]"), t * k * 4),
        topk_weights: push(&mut c, "topk_weights", format!("f32 [{t}, {k}]"), t * k * 4),
        counts: push(
            &mut c,
            "counts",
            format!("u32 [{e} + 2]: this call's rows per expert, then T and the bound"),
            (e + 2) * 4,
        ),
        send_list: push(
            &mut c,
            "send_list",
            format!("u32 [{e}, {t}]: the slots t·K + k routed to each expert"),
            e * t * 4,
        ),
        l1_pool: push(
            &mut c,
            "l1_pool",
            format!("e4m3 [{rows}, {h}]: the ring's pulled rows"),
            rows * h,
        ),
        l1_pool_scales: push(
            &mut c,
            "l1_pool_scales",
            format!("f32 [{}, {rows}]: group-major", h / 128),
            rows * (h / 128) * 4,
        ),
        l2_pool: push(
            &mut c,
            "l2_pool",
            format!("e4m3 [{rows}, {i}]: L1 output after SwiGLU"),
            rows * i,
        ),
        l2_pool_scales: push(
            &mut c,
            "l2_pool_scales",
            format!(
                "f32 [{}, {rows}]: per {gran} columns, group-major",
                i / gran
            ),
            rows * (i / gran) * 4,
        ),
        ring_weights: push(
            &mut c,
            "ring_weights",
            format!("f32 [{rows}]: each ring row's routing weight"),
            rows * 4,
        ),
        row_dest: push(
            &mut c,
            "row_dest",
            format!("u64 [{rows}]: where each ring row's L2 output goes (its row of the source rank's combine region)"),
            rows * 8,
        ),
        plan: push(
            &mut c,
            "plan",
            "u32 [5]: blocks, segments, tasks, status, next unclaimed task".into(),
            PLAN_HEADER_BYTES,
        ),
        src_base: push(
            &mut c,
            "src_base",
            format!("u32 [{local}, {ranks}]: where each source's rows start in an expert"),
            local * ranks * 4,
        ),
        blocks: push(
            &mut c,
            "blocks",
            format!("[{blocks}] x 16 B: the call's m-blocks"),
            blocks * PLAN_ENTRY_BYTES,
        ),
        segments: push(
            &mut c,
            "segments",
            format!("[{segments}] x 16 B: the call's task stream"),
            segments * PLAN_ENTRY_BYTES,
        ),
        block_flags: push(
            &mut c,
            "block_flags",
            format!("[{blocks}] x 16 B: rows pulled, L1 and L2 tasks done"),
            blocks * PLAN_ENTRY_BYTES,
        ),
        expert_l2: push(
            &mut c,
            "expert_l2",
            format!("u32 [{local}, 2]: per local expert, L2 warpgroup-tasks done and owed"),
            local * EXPERT_L2_BYTES,
        ),
        expert_done: push(
            &mut c,
            "expert_done",
            format!("u64 [{e}]: the call in which each expert's rank wrote its last L2 rows (written by that rank)"),
            e * 8,
        ),
        grid_barrier: push(
            &mut c,
            "grid_barrier",
            "u64: the persistent launch's grid barrier".into(),
            8,
        ),
        combine: push(
            &mut c,
            "combine",
            format!("bf16 [{t}, {k}, {h}]: L2 rows scattered back by the experts' ranks"),
            t * k * h * 2,
        ),
        error: push_error(&mut c) as u64,
    };
    (offsets, c.finish())
}

/// Bytes → MiB.
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preset::Preset;

    fn layouts(preset: &str, t_max: usize) -> (SymmetricLayout, SymmetricLayout) {
        let shape = Preset::by_name(preset).unwrap().shape;
        let g = crate::quant::default_group(&shape);
        let split = SymmetricLayout::new(Kernel::Split, &shape, 8, t_max, g).unwrap();
        let fused = SymmetricLayout::new(Kernel::Fused, &shape, 8, t_max, g).unwrap();
        (split, fused)
    }

    #[test]
    fn fused_is_at_least_four_times_smaller_at_8192_on_flash_and_pro() {
        for preset in ["flash", "pro"] {
            let (split, fused) = layouts(preset, 8192);
            let (split, fused) = (split.total_bytes, fused.total_bytes);
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
    fn the_fused_offsets_are_the_fused_regions_in_order() {
        let (split, fused) = layouts("pro", 3000);
        assert_eq!(split.fused, None);
        let o = fused.fused.unwrap();
        let typed = [
            o.epochs,
            o.signals,
            o.x,
            o.x_scales,
            o.topk_idx,
            o.topk_weights,
            o.counts,
            o.send_list,
            o.l1_pool,
            o.l1_pool_scales,
            o.l2_pool,
            o.l2_pool_scales,
            o.ring_weights,
            o.row_dest,
            o.plan,
            o.src_base,
            o.blocks,
            o.segments,
            o.block_flags,
            o.expert_l2,
            o.expert_done,
            o.grid_barrier,
            o.combine,
            o.error,
        ];
        let listed: Vec<u64> = fused.regions.iter().map(|r| r.offset).collect();
        assert_eq!(typed.to_vec(), listed);
        assert_eq!(fused.region("send_list").unwrap().offset, o.send_list);
    }

    #[test]
    fn below_the_lag_threshold_the_fused_pool_is_the_full_pool() {
        let (split, fused) = layouts("flash", 512);
        assert_eq!(split.pool_rows, fused.pool_rows);
    }

    #[test]
    fn both_kernels_share_the_signal_regions_and_the_error_record() {
        let (split, fused) = layouts("pro", 2048);
        for name in ["epochs", "signals"] {
            assert_eq!(split.region(name), fused.region(name), "{name}");
        }
        for l in [&split, &fused] {
            let last = l.regions.last().unwrap();
            assert_eq!((last.name, last.bytes), ("error", ERROR_RECORD_BYTES));
        }
    }

    #[test]
    fn the_split_layout_is_megamoe_eps_buffer() {
        let shape = Preset::by_name("flash").unwrap().shape;
        let l = SymmetricLayout::new(Kernel::Split, &shape, 8, 3000, 128).unwrap();
        let spec = BufferSpec::for_shape(8, &shape, 3072, SLOT_ROWS);
        assert_eq!(l.total_bytes, BufferLayout::new(&spec).size as u64);
        assert_eq!(l.regions, BufferLayout::regions(&spec));
        assert_eq!(l.pool_rows, spec.max_rows());
    }

    #[test]
    fn bad_gran_and_ranks_are_rejected() {
        let shape = Preset::by_name("flash").unwrap().shape;
        assert!(SymmetricLayout::new(Kernel::Fused, &shape, 8, 1024, 96).is_err());
        assert!(SymmetricLayout::new(Kernel::Fused, &shape, 3, 1024, 128).is_err());
    }
}
