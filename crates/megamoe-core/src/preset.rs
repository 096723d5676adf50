//! Model shapes (SPEC §1) and the rules every shape must satisfy.

use serde::Serialize;

use crate::error::{Error, Result};

/// The routed-expert shape of one MoE layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Shape {
    /// Hidden size H (L1 maps H → 2I, L2 maps I → H).
    pub hidden: usize,
    /// Intermediate size I of one expert.
    pub inter: usize,
    /// Experts in total, E.
    pub experts: usize,
    /// Expert slots per token, K.
    pub topk: usize,
}

/// A named shape users and benchmarks refer to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Preset {
    pub name: &'static str,
    pub shape: Shape,
}

/// Every preset of SPEC §1, in the order they are listed there.
pub const PRESETS: [Preset; 5] = [
    Preset::new("flash", 4096, 2048, 256, 6),
    Preset::new("pro", 7168, 3072, 384, 6),
    Preset::new("dsv3", 7168, 2048, 256, 8),
    Preset::new("glm", 4096, 2048, 288, 8),
    Preset::new("tiny", 256, 128, 16, 4),
];

impl Preset {
    const fn new(
        name: &'static str,
        hidden: usize,
        inter: usize,
        experts: usize,
        topk: usize,
    ) -> Self {
        Preset {
            name,
            shape: Shape {
                hidden,
                inter,
                experts,
                topk,
            },
        }
    }

    /// Looks a preset up by name; the error lists the known names.
    pub fn by_name(name: &str) -> Result<Preset> {
        PRESETS
            .iter()
            .copied()
            .find(|p| p.name == name)
            .ok_or_else(|| Error::UnknownPreset {
                name: name.to_string(),
                known: PRESETS
                    .iter()
                    .map(|p| p.name)
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }
}

impl Shape {
    /// Checks the SPEC §2 shape rules and that the experts split evenly over `ranks`.
    pub fn validate(&self, ranks: usize) -> Result<()> {
        for (name, value) in [("hidden", self.hidden), ("inter", self.inter)] {
            if value == 0 || value % 128 != 0 {
                return Err(Error::Shape {
                    arg: name,
                    reason: format!("{value} is not a positive multiple of 128"),
                });
            }
        }
        if self.topk == 0 || self.topk > self.experts {
            return Err(Error::Shape {
                arg: "topk",
                reason: format!(
                    "{} must be in 1..={} (the number of experts)",
                    self.topk, self.experts
                ),
            });
        }
        if ranks == 0 || self.experts % ranks != 0 {
            return Err(Error::Shape {
                arg: "ranks",
                reason: format!(
                    "{} experts do not split evenly over {ranks} ranks",
                    self.experts
                ),
            });
        }
        Ok(())
    }

    /// Experts per rank, E_l = E / R.
    pub fn local_experts(&self, ranks: usize) -> usize {
        self.experts / ranks
    }

    /// Floating-point operations of the routed-expert forward per valid (token, slot): 6·H·I.
    pub fn flops_per_slot(&self) -> f64 {
        6.0 * self.hidden as f64 * self.inter as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_satisfies_the_shape_rules_up_to_eight_ranks() {
        for p in PRESETS {
            for r in [1, 2, 4, 8] {
                p.shape.validate(r).unwrap();
            }
        }
    }

    #[test]
    fn unknown_preset_names_the_known_ones() {
        let err = Preset::by_name("huge").unwrap_err().to_string();
        assert!(
            err.contains("huge") && err.contains("flash") && err.contains("tiny"),
            "{err}"
        );
    }

    #[test]
    fn uneven_expert_split_is_rejected_naming_ranks() {
        let tiny = Preset::by_name("tiny").unwrap().shape;
        let err = tiny.validate(3).unwrap_err();
        assert!(matches!(err, Error::Shape { arg: "ranks", .. }), "{err}");
    }
}
