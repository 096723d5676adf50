//! Sizes and offsets of the symmetric buffer (the same layout on every rank) and of a handle.
//! Pure arithmetic: the size query users see before allocating.

use megamoe_core::{Error, Result};

/// Limits the device code is compiled for (device/megamoe_ep/params.cuh).
pub const MAX_RANKS: usize = 8;
pub const MAX_TOPK: usize = 8;
pub const MAX_EXPERTS: usize = 1024;
const ALIGN: usize = 256;

/// Row format of dispatched activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowDtype {
    /// bf16 `[T, H]`.
    Bf16,
    /// e4m3 `[T, H]` with f32 scales `[T, H/128]`.
    Fp8,
}

impl RowDtype {
    pub fn row_bytes(self, hidden: usize) -> usize {
        match self {
            RowDtype::Bf16 => hidden * 2,
            RowDtype::Fp8 => hidden,
        }
    }
    pub fn scales_per_row(self, hidden: usize) -> usize {
        match self {
            RowDtype::Bf16 => 0,
            RowDtype::Fp8 => hidden / 128,
        }
    }
}

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
        shape: &megamoe_core::preset::Shape,
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

    /// The shape megamoe-core's permute plan and reference take. I plays no part in dispatch
    /// and combine; 128 satisfies the shape's rule.
    pub fn shape(&self) -> megamoe_core::preset::Shape {
        megamoe_core::preset::Shape {
            hidden: self.hidden,
            inter: 128,
            experts: self.experts,
            topk: self.topk,
        }
    }

    pub fn local_experts(&self) -> usize {
        self.experts / self.ranks
    }

    /// Most rows one rank can receive: every token of every rank on min(K, E_l) local experts,
    /// plus the worst padding, rounded up to whole `max_pad_multiple` blocks (a padded call's
    /// rows always are; the grouped GEMM views the pool in such blocks).
    pub fn max_rows(&self) -> usize {
        let rows = self.ranks * self.max_tokens * self.topk.min(self.local_experts())
            + self.local_experts() * (self.max_pad_multiple - 1);
        rows.next_multiple_of(self.max_pad_multiple)
    }
}

fn region(cursor: &mut usize, bytes: usize) -> usize {
    let at = *cursor;
    *cursor += bytes.div_ceil(ALIGN) * ALIGN;
    at
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
        let (t, k, h, rows) = (spec.max_tokens, spec.topk, spec.hidden, spec.max_rows());
        let mut c = 0;
        BufferLayout {
            epochs: region(&mut c, 2 * 8),
            signals: region(&mut c, 4 * MAX_RANKS * 8),
            status: region(&mut c, MAX_RANKS * 8),
            counts: region(&mut c, MAX_RANKS * (MAX_EXPERTS + 1) * 4),
            meta: region(&mut c, t * 3 * k * 4),
            in_rows: region(&mut c, t * h * 2),
            in_scales: region(&mut c, t * (h / 128) * 4),
            out_rows: region(&mut c, rows * h * 2),
            out_scales: region(&mut c, rows * (h / 128) * 4),
            out_probs: region(&mut c, rows * 4),
            comb_rows: region(&mut c, rows * h * 2),
            comb_prob_grads: region(&mut c, rows * 4),
            error: region(&mut c, 32),
            size: c,
        }
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
        let (t, k, el) = (spec.max_tokens, spec.topk, spec.local_experts());
        let mut c = 0;
        HandleLayout {
            recv_slot: region(&mut c, spec.ranks * t * k * 4),
            send_row: region(&mut c, t * k * 4),
            idx: region(&mut c, t * k * 4),
            padded: region(&mut c, el * 4),
            counts: region(&mut c, el * 4),
            seg_base: region(&mut c, el * 4),
            src_tokens: region(&mut c, MAX_RANKS * 4),
            total_rows: region(&mut c, 4),
            size: c,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let l = BufferLayout::new(&flash_pair());
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
        assert!(offs.iter().all(|o| o % ALIGN == 0));
        // The two row pools dominate: 2 × 65 408 rows × 8 KiB.
        assert!(l.size > 2 * 65408 * 8192 && l.size < 2 * 65408 * 8192 + (64 << 20));
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
