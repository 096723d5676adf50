//! What a layer is built for, its limits, and the size query: the bytes a rank allocates,
//! callable before any allocation (pure arithmetic).

use megamoe_core::plan::rules::MAX_TOKENS;
use megamoe_core::plan::{Kernel, SymmetricLayout};
use megamoe_core::preset::Shape;
use megamoe_core::quant::default_group;
use megamoe_core::{Accumulation, Error, Result};
use megamoe_ep::{BufferLayout, BufferSpec, MAX_EXPERTS, MAX_RANKS, MAX_TOPK};
use megamoe_gemm::heuristics::MAX_K_BLOCKS;

/// Rows of each expert's segment of the dispatched pool are padded to this: the L1 and L2
/// GEMMs run 128-row tiles over it (src/kernel.rs).
pub const POOL_PAD: usize = 128;

/// Which form of the layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Dispatch, L1 GEMM with SwiGLU and re-quantization, L2 GEMM, combine: one launch each
    /// (SPEC §4 split, the baseline).
    Split,
    /// One persistent launch per rank: pull, both GEMMs over a ring, scatter and combine
    /// (SPEC §4 fused, the default).
    Fused,
}

impl Kind {
    pub const ALL: [Kind; 2] = [Kind::Split, Kind::Fused];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Split => "split",
            Kind::Fused => "fused",
        }
    }

    /// The kind called `name` ("split" or "fused").
    pub fn by_name(name: &str) -> Result<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| Error::Value {
                arg: "kernel",
                value: name.to_string(),
                reason: "must be split or fused".into(),
            })
    }

    fn kernel(self) -> Kernel {
        match self {
            Kind::Split => Kernel::Split,
            Kind::Fused => Kernel::Fused,
        }
    }
}

/// A layer's shape, world, capacity and options.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerSpec {
    pub shape: Shape,
    /// R: ranks of the expert-parallel world (real or virtual).
    pub ranks: usize,
    /// T_max: most tokens one rank passes to one call.
    pub max_tokens: usize,
    pub kind: Kind,
    /// G: columns per scale of the re-quantized intermediate, 64 or 128.
    pub group: usize,
    /// Optional SwiGLU clamp c (SPEC §3 step 2).
    pub clamp: Option<f32>,
    /// Blocks per rank for dispatch and combine; None takes every SM of the rank's share of its
    /// GPU. Never more than a GPU's SMs over the ranks placed on it (virtual ranks,
    /// src/split.rs).
    pub comm_sms: Option<usize>,
    /// How both GEMMs sum over K: [`Accumulation::PerBlock`] (SPEC §3, the default) or the
    /// faster, less accurate [`Accumulation::Rescaled`]. Either kind gives the same bits as the
    /// other in either mode.
    pub accumulation: Accumulation,
}

/// Bytes one rank allocates for a layer, by what for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerBytes {
    /// Symmetric memory (peers read and write it): inputs, dispatched pool, L2 output rows,
    /// signals.
    pub symmetric: usize,
    /// Local activations: the bf16 input staging, the re-quantized intermediate and its scales.
    pub local: usize,
    /// The rank's expert weights and their scales.
    pub weights: usize,
}

impl LayerSpec {
    /// The fused layer with SPEC §3's default G and accumulation, and no clamp.
    pub fn new(shape: Shape, ranks: usize, max_tokens: usize) -> Self {
        LayerSpec {
            shape,
            ranks,
            max_tokens,
            kind: Kind::Fused,
            group: default_group(&shape),
            clamp: None,
            comm_sms: None,
            accumulation: Accumulation::PerBlock,
        }
    }

    /// Checks the shape rules (SPEC §2) and the kernels' limits, naming the argument.
    pub fn validate(&self) -> Result<()> {
        let shape = |arg, reason: String| Err(Error::Shape { arg, reason });
        self.shape.validate(self.ranks)?;
        if self.ranks > MAX_RANKS {
            return shape(
                "ranks",
                format!("{} exceeds the kernels' {MAX_RANKS}", self.ranks),
            );
        }
        let (h, i) = (self.shape.hidden, self.shape.inter);
        for (arg, k) in [("hidden", h), ("inter", i)] {
            if k > 128 * MAX_K_BLOCKS {
                return shape(
                    arg,
                    format!("{k} exceeds the GEMM's K limit {}", 128 * MAX_K_BLOCKS),
                );
            }
        }
        if self.shape.topk > MAX_TOPK {
            return shape(
                "topk",
                format!("{} exceeds the kernels' {MAX_TOPK}", self.shape.topk),
            );
        }
        // megamoe-ep's count regions hold every expert of the world, not just a rank's.
        if self.shape.experts > MAX_EXPERTS {
            return shape(
                "experts",
                format!("{} exceeds the kernels' {MAX_EXPERTS}", self.shape.experts),
            );
        }
        if self.group != 64 && self.group != 128 {
            return Err(Error::Value {
                arg: "group",
                value: self.group.to_string(),
                reason: "must be 64 or 128".into(),
            });
        }
        if self.max_tokens == 0 || self.max_tokens > MAX_TOKENS {
            return Err(Error::Value {
                arg: "max_tokens",
                value: self.max_tokens.to_string(),
                reason: format!("must be in 1..={MAX_TOKENS}"),
            });
        }
        if let Some(c) = self.clamp {
            if !(c > 0.0 && c.is_finite()) {
                return Err(Error::Value {
                    arg: "clamp",
                    value: c.to_string(),
                    reason: "must be a positive finite number".into(),
                });
            }
        }
        Ok(())
    }

    /// The dispatch/combine buffer this layer uses.
    pub fn ep_spec(&self) -> BufferSpec {
        BufferSpec::for_shape(self.ranks, &self.shape, self.max_tokens, POOL_PAD)
    }

    /// Rows of the dispatched pool (every token of every rank on its local experts, padding
    /// included, in whole 128-row blocks).
    pub fn pool_rows(&self) -> usize {
        self.ep_spec().max_rows()
    }

    /// The symmetric buffer of the fused kind (megamoe-core's planner: `megamoe plan` prints
    /// the same regions).
    pub fn fused_layout(&self) -> Result<SymmetricLayout> {
        SymmetricLayout::new(
            Kernel::Fused,
            &self.shape,
            self.ranks,
            self.max_tokens,
            self.group,
        )
    }

    /// The size query: what one rank allocates for this spec's kind (SPEC §4).
    pub fn bytes(&self) -> LayerBytes {
        self.bytes_of(self.kind)
    }

    /// The size query for either kind.
    pub fn bytes_of(&self, kind: Kind) -> LayerBytes {
        let (h, i, el) = (
            self.shape.hidden,
            self.shape.inter,
            self.shape.local_experts(self.ranks),
        );
        let weights = el * (2 * i * h + h * i) + el * (2 * i * h + h * i) / (128 * 128) * 4;
        let staging = self.max_tokens * h * 2;
        match kind {
            Kind::Split => {
                let rows = self.pool_rows();
                LayerBytes {
                    symmetric: BufferLayout::new(&self.ep_spec()).size,
                    local: staging + rows * i + rows * (i / self.group) * 4,
                    weights,
                }
            }
            Kind::Fused => {
                let layout = SymmetricLayout::new(
                    kind.kernel(),
                    &self.shape,
                    self.ranks,
                    self.max_tokens,
                    self.group,
                )
                .expect("a validated spec has a layout");
                LayerBytes {
                    symmetric: layout.total_bytes as usize,
                    // bf16 input staging and the bf16 output.
                    local: 2 * staging,
                    weights,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use megamoe_core::Preset;

    #[test]
    fn the_size_query_counts_the_pool_and_the_intermediate() {
        let shape = Preset::by_name("flash").unwrap().shape;
        let spec = LayerSpec {
            kind: Kind::Split,
            ..LayerSpec::new(shape, 8, 8192)
        };
        spec.validate().unwrap();
        let rows = 8 * 8192 * 6 + 32 * 127;
        assert_eq!(spec.pool_rows(), (rows as usize).next_multiple_of(128));
        let b = spec.bytes();
        assert_eq!(
            b.local,
            8192 * 4096 * 2 + spec.pool_rows() * 2048 + spec.pool_rows() * 16 * 4
        );
        // 32 experts of 3 · 4096 · 2048 bytes, plus one f32 per 128 x 128 block.
        assert_eq!(b.weights, 32 * 3 * 4096 * 2048 + 32 * 3 * 256 * 2 * 4);
        assert!(b.symmetric > spec.pool_rows() * 4096);
    }

    #[test]
    fn the_fused_kind_is_at_least_four_times_smaller_at_8192_and_below_the_seeds() {
        // The seed's fused buffers at an 8192 bound on 8 ranks: flash 700 MiB, pro 1113 MiB.
        for (preset, seed_mib) in [("flash", 700.0), ("pro", 1113.0)] {
            let shape = Preset::by_name(preset).unwrap().shape;
            let spec = LayerSpec::new(shape, 8, 8192);
            let fused = spec.bytes_of(Kind::Fused).symmetric;
            let split = spec.bytes_of(Kind::Split).symmetric;
            assert!(split >= 4 * fused, "{preset}: {split} vs {fused}");
            let mib = fused as f64 / (1u64 << 20) as f64;
            assert!(mib <= seed_mib, "{preset}: {mib:.0} MiB");
            assert_eq!(fused as u64, spec.fused_layout().unwrap().total_bytes);
        }
    }

    #[test]
    fn bad_specs_name_the_argument() {
        let shape = Preset::by_name("tiny").unwrap().shape;
        let ok = LayerSpec::new(shape, 2, 64);
        ok.validate().unwrap();
        for (bad, arg) in [
            (LayerSpec { group: 32, ..ok }, "group"),
            (
                LayerSpec {
                    max_tokens: 0,
                    ..ok
                },
                "max_tokens",
            ),
            (
                LayerSpec {
                    clamp: Some(-1.0),
                    ..ok
                },
                "clamp",
            ),
            (LayerSpec { ranks: 3, ..ok }, "ranks"),
        ] {
            let err = bad.validate().unwrap_err();
            assert!(err.to_string().contains(arg), "{arg}: {err}");
        }
    }
}
