//! How the GEMMs accumulate a product over K (SPEC §3 step 1): the one option both GEMMs of the
//! layer, the grouped GEMM, the command line and the Python API share.

use crate::error::{Error, Result};

/// How the GEMMs sum each output's products over K.
///
/// [`Accumulation::PerBlock`], the default, is SPEC §3 step 1: each 128-wide K block (each
/// scale group) is accumulated by the tensor cores in a fresh f32 register set and then added
/// into a separate f32 running sum times its scales, so the tensor cores' limited-precision
/// accumulation never spans more than one block and the error stays flat in K.
///
/// [`Accumulation::Rescaled`], opt-in, keeps the running sum in the tensor cores' accumulator
/// itself and rescales it in place by the ratio of consecutive blocks' scales (the seed
/// kernel's way). It needs one register set instead of two, which lets each math warpgroup
/// keep one wave's wgmmas queued while it rescales the other; but the tensor cores'
/// accumulation truncates the whole running sum at every wgmma, so the error grows with K. The output is deterministic in both modes, and the fused and split forms of
/// the layer give the same bits as each other in each mode; the two modes' bits differ.
/// Measured on an H200 (docs/PYTHON.md, "Accumulation", has the table): SPEC §3's diff against
/// the CPU reference 9.2e-6 (per-block) and 8.0e-5 (rescaled) on flash, 9.1e-6 and 1.2e-4 on
/// pro, 9.3e-6 and 7.9e-5 on glm; and rescaled no faster than per-block there (the K loop is
/// bound by the tensor cores, and the other warpgroup already hides the promotion: docs/PERF.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Accumulation {
    /// Each K block promoted into a separate f32 sum (SPEC §3 step 1).
    #[default]
    PerBlock,
    /// The running sum kept in the accumulator, rescaled per K block: the seed kernel's
    /// numerics, less accurate.
    Rescaled,
}

impl Accumulation {
    pub const ALL: [Accumulation; 2] = [Accumulation::PerBlock, Accumulation::Rescaled];

    /// The name the command line and the Python API use.
    pub fn name(self) -> &'static str {
        match self {
            Accumulation::PerBlock => "per-block",
            Accumulation::Rescaled => "rescaled",
        }
    }

    /// The mode called `name` ("per-block" or "rescaled").
    pub fn by_name(name: &str) -> Result<Accumulation> {
        Accumulation::ALL
            .into_iter()
            .find(|a| a.name() == name)
            .ok_or_else(|| Error::Value {
                arg: "accumulation",
                value: name.to_string(),
                reason: "must be per-block or rescaled".into(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_the_default_is_per_block() {
        assert_eq!(Accumulation::default(), Accumulation::PerBlock);
        for a in Accumulation::ALL {
            assert_eq!(Accumulation::by_name(a.name()), Ok(a));
        }
        assert_eq!(Accumulation::PerBlock.name(), "per-block");
        assert_eq!(Accumulation::Rescaled.name(), "rescaled");
    }

    #[test]
    fn an_unknown_name_is_an_error_naming_the_argument() {
        for bad in ["", "Rescaled", "per_block", "fast"] {
            let e = Accumulation::by_name(bad).unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::Value {
                        arg: "accumulation",
                        ..
                    }
                ),
                "{e}"
            );
            assert!(e.to_string().contains("per-block or rescaled"), "{e}");
        }
    }
}
