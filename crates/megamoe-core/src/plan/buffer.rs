//! The split kernel's symmetric buffer: what megamoe-ep's dispatch and combine allocate and
//! address (device/megamoe_ep/params.cuh), and the handle block of one rank. Pure arithmetic,
//! so the size query needs no GPU; megamoe-ep re-exports it.

use super::layout::{push_error, push_signals, Region, Regions};
use crate::error::{Error, Result};
use crate::preset::Shape;

/// Limits megamoe-ep's device code is compiled for (`kMaxRanks`, `kMaxTopk`, `kMaxExperts` in
/// params.cuh). The signal, status and count regions are sized by them, not by the spec, so
/// the kernels index them with compile-time strides.
pub const MAX_RANKS: usize = 8;
pub const MAX_TOPK: usize = 8;
pub const MAX_EXPERTS: usize = 1024;

/// What a buffer is sized for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferSpec {
    pub ranks: usize,
    pub experts: usize,
    pub topk: usize,
    pub hidden: usize,
    /// T_max: most tokens any rank passes to one call.
    pub max_tokens: usize,
    /// Largest `pad_multiple` a call may use.
    pub max_pad_multiple: usize,
}

impl BufferSpec {
    pub fn validate(&self) -> Result<()> {
        let shape = |arg, reason: String| Err(Error::Shape { arg, reason });
        if self.ranks == 0 || self.ranks > MAX_RANKS {
            return shape(
                "ranks",
                format!("{} is outside 1..={MAX_RANKS}", self.ranks),
            );
        }
        if self.experts == 0 || self.experts > MAX_EXPERTS || self.experts % self.ranks != 0 {
            return shape(
                "experts",
                format!(
                    "{} must be in 1..={MAX_EXPERTS} and divisible by {} ranks",
                    self.experts, self.ranks
                ),
            );
        }
        if self.topk == 0 || self.topk > MAX_TOPK || self.topk > self.experts {
            return shape(
                "topk",
                format!("{} is outside 1..={MAX_TOPK} (and ≤ experts)", self.topk),
            );
        }
        if self.hidden == 0 || self.hidden % 128 != 0 {
            return shape(
                "hidden",
                format!("{} is not a positive multiple of 128", self.hidden),
            );
        }
        if self.max_pad_multiple == 0 {
            return shape("max_pad_multiple", "must be at least 1".into());
        }
        Ok(())
    }

    /// A buffer for `ranks` ranks of a model shape.
    pub fn for_shape(
        ranks: usize,
        shape: &Shape,
        max_tokens: usize,
        max_pad_multiple: usize,
    ) -> Self {
        BufferSpec {
            ranks,
            experts: shape.experts,
            topk: shape.topk,
            hidden: shape.hidden,
            max_tokens,
            max_pad_multiple,
        }
    }

    /// The shape the permute plan and reference take. I plays no part in dispatch and combine;
    /// 128 satisfies the shape's rule.
    pub fn shape(&self) -> Shape {
        Shape {
            hidden: self.hidden,
            inter: 128,
            experts: self.experts,
            topk: self.topk,
        }
    }

    pub fn local_experts(&self) -> usize {
        self.experts / self.ranks
    }

    /// Most rows one rank can receive: every token of every rank on min(K, E_l) local experts
    /// (a token names an expert at most once), plus the worst padding, rounded up to whole
    /// `max_pad_multiple` blocks (a padded call's rows always are; the grouped GEMM views the
    /// pool in such blocks).
    pub fn max_rows(&self) -> usize {
        let rows = self.ranks * self.max_tokens * self.topk.min(self.local_experts())
            + self.local_experts() * (self.max_pad_multiple - 1);
        rows.next_multiple_of(self.max_pad_multiple)
    }
}

/// Byte offsets of the symmetric buffer's regions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferLayout {
    pub epochs: usize,
    pub signals: usize,
    pub status: usize,
    pub counts: usize,
    pub meta: usize,
    pub in_rows: usize,
    pub in_scales: usize,
    pub out_rows: usize,
    pub out_scales: usize,
    pub out_probs: usize,
    pub comb_rows: usize,
    pub comb_prob_grads: usize,
    pub error: usize,
    /// Bytes per rank.
    pub size: usize,
}

impl BufferLayout {
    pub fn new(spec: &BufferSpec) -> Self {
        Self::build(spec).0
    }

    /// The regions in order, named and described.
    pub fn regions(spec: &BufferSpec) -> Vec<Region> {
        Self::build(spec).1
    }

    fn build(spec: &BufferSpec) -> (Self, Vec<Region>) {
        let (t, k, h, rows) = (spec.max_tokens, spec.topk, spec.hidden, spec.max_rows());
        let mut c = Regions::default();
        // Rows are sized as bf16 whatever the call's row format, so one buffer serves both.
        let (epochs, signals) = push_signals(&mut c);
        let layout = BufferLayout {
            epochs,
            signals,
            status: c.push(
                "status",
                format!("u64 [{MAX_RANKS}]: each source's first rejected slot, tagged by epoch"),
                MAX_RANKS * 8,
            ),
            counts: c.push(
                "counts",
                format!(
                    "i32 [{MAX_RANKS}, {}]: rows per expert and T, from each source",
                    MAX_EXPERTS + 1
                ),
                MAX_RANKS * (MAX_EXPERTS + 1) * 4,
            ),
            meta: c.push(
                "meta",
                format!("i32 [{t}, 3, {k}]: (expert, position, prob) of each slot, read by peers"),
                t * 3 * k * 4,
            ),
            in_rows: c.push(
                "in_rows",
                format!("bf16 or e4m3 [{t}, {h}]: input rows, pulled by peers"),
                t * h * 2,
            ),
            in_scales: c.push(
                "in_scales",
                format!("f32 [{t}, {}]", h / 128),
                t * (h / 128) * 4,
            ),
            out_rows: c.push(
                "out_rows",
                format!("bf16 or e4m3 [{rows}, {h}]: dispatched rows, per expert padded"),
                rows * h * 2,
            ),
            out_scales: c.push(
                "out_scales",
                format!("f32 [{rows}, {}]", h / 128),
                rows * (h / 128) * 4,
            ),
            out_probs: c.push(
                "out_probs",
                format!("f32 [{rows}]: each row's router weight"),
                rows * 4,
            ),
            comb_rows: c.push(
                "comb_rows",
                format!("bf16 [{rows}, {h}]: combine input, read by the tokens' ranks"),
                rows * h * 2,
            ),
            comb_prob_grads: c.push(
                "comb_prob_grads",
                format!("f32 [{rows}]: each row's weight gradient (dispatch backward)"),
                rows * 4,
            ),
            error: push_error(&mut c),
            size: 0,
        };
        let (regions, size) = c.finish();
        (BufferLayout { size, ..layout }, regions)
    }
}

/// Byte offsets inside one rank's handle block (local memory, not symmetric).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandleLayout {
    pub recv_slot: usize,
    pub send_row: usize,
    pub idx: usize,
    pub padded: usize,
    pub counts: usize,
    pub seg_base: usize,
    pub src_tokens: usize,
    pub total_rows: usize,
    pub size: usize,
}

impl HandleLayout {
    pub fn new(spec: &BufferSpec) -> Self {
        let (r, t, k, el) = (spec.ranks, spec.max_tokens, spec.topk, spec.local_experts());
        let mut c = Regions::default();
        let layout = HandleLayout {
            recv_slot: c.push("recv_slot", format!("i32 [{r}, {t}, {k}]"), r * t * k * 4),
            send_row: c.push("send_row", format!("i32 [{t}, {k}]"), t * k * 4),
            idx: c.push("idx", format!("i32 [{t}, {k}]"), t * k * 4),
            padded: c.push("padded", format!("i32 [{el}]"), el * 4),
            counts: c.push("counts", format!("i32 [{el}]"), el * 4),
            seg_base: c.push("seg_base", format!("i32 [{el}]"), el * 4),
            src_tokens: c.push("src_tokens", format!("i32 [{MAX_RANKS}]"), MAX_RANKS * 4),
            total_rows: c.push("total_rows", "i32".into(), 4),
            size: 0,
        };
        HandleLayout {
            size: c.finish().1,
            ..layout
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::layout::REGION_ALIGN;

    fn flash_pair() -> BufferSpec {
        BufferSpec {
            ranks: 2,
            experts: 256,
            topk: 6,
            hidden: 4096,
            max_tokens: 4096,
            max_pad_multiple: 128,
        }
    }

    #[test]
    fn max_rows_covers_every_token_on_every_reachable_local_expert_plus_padding() {
        let s = flash_pair();
        assert_eq!(s.max_rows(), 2 * 4096 * 6 + 128 * 127);
        let narrow = BufferSpec {
            ranks: 8,
            experts: 16,
            topk: 4,
            ..s
        };
        // Only two local experts: a token lands on a rank at most twice; whole 128-row blocks.
        assert_eq!(
            narrow.max_rows(),
            (8 * 4096 * 2 + 2 * 127_usize).next_multiple_of(128)
        );
    }

    #[test]
    fn regions_are_aligned_disjoint_and_in_order() {
        let s = flash_pair();
        let l = BufferLayout::new(&s);
        let offs = [
            l.epochs,
            l.signals,
            l.status,
            l.counts,
            l.meta,
            l.in_rows,
            l.in_scales,
            l.out_rows,
            l.out_scales,
            l.out_probs,
            l.comb_rows,
            l.comb_prob_grads,
            l.error,
            l.size,
        ];
        assert!(offs.windows(2).all(|w| w[0] < w[1]));
        assert!(offs.iter().all(|&o| o as u64 % REGION_ALIGN == 0));
        // The two row pools dominate: 2 × 65 408 rows × 8 KiB.
        assert!(l.size > 2 * 65408 * 8192 && l.size < 2 * 65408 * 8192 + (64 << 20));
        // The named regions are the offsets, in the same order.
        let named: Vec<usize> = BufferLayout::regions(&s)
            .iter()
            .map(|r| r.offset as usize)
            .collect();
        assert_eq!(named, offs[..offs.len() - 1]);
    }

    #[test]
    fn specs_beyond_the_compiled_limits_are_rejected_naming_the_argument() {
        let s = flash_pair();
        for (bad, arg) in [
            (BufferSpec { ranks: 16, ..s }, "ranks"),
            (BufferSpec { experts: 255, ..s }, "experts"),
            (BufferSpec { topk: 9, ..s }, "topk"),
            (BufferSpec { hidden: 4000, ..s }, "hidden"),
            (
                BufferSpec {
                    max_pad_multiple: 0,
                    ..s
                },
                "max_pad_multiple",
            ),
        ] {
            match bad.validate() {
                Err(Error::Shape { arg: a, .. }) => assert_eq!(a, arg),
                other => panic!("{arg}: {other:?}"),
            }
        }
        s.validate().unwrap();
    }
}
