//! The layer API: either form behind one type, chosen by [`LayerSpec::kind`] (fused by
//! default).

use std::ops::Range;

use half::bf16;
use megamoe_core::weights::RankWeightsFp8;
use megamoe_cuda::{AllGather, DeviceBuffer};

use crate::call::RankInput;
use crate::error::Result;
use crate::fused::{FusedLayer, FusedOptions};
use crate::spec::{Kind, LayerSpec};
use crate::split::SplitLayer;

/// The MoE layer of either kind on a world of real or virtual ranks.
pub enum MoeLayer {
    Split(Box<SplitLayer>),
    Fused(Box<FusedLayer>),
}

impl MoeLayer {
    /// Builds the layer of `spec.kind` (see [`SplitLayer::new`] and [`FusedLayer::new`]).
    pub fn new(
        spec: LayerSpec,
        weights: impl Fn(usize) -> megamoe_core::Result<RankWeightsFp8>,
    ) -> Result<MoeLayer> {
        Ok(match spec.kind {
            Kind::Split => MoeLayer::Split(Box::new(SplitLayer::new(spec, weights)?)),
            Kind::Fused => MoeLayer::Fused(Box::new(FusedLayer::new(spec, weights)?)),
        })
    }

    /// Rank `rank` of a world of `spec.ranks` processes (one rank each, as under torchrun), on
    /// GPU `device`, of `spec.kind` ([`SplitLayer::for_rank`], [`FusedLayer::for_rank`] with
    /// the default options). Every process builds its rank with the same `spec`, and the
    /// symmetric buffers' handles go through `exchange`, which every process calls in the same
    /// order. `weights(rank)` is asked for this rank only; calls take and return this rank's
    /// tensors alone.
    pub fn for_rank(
        spec: LayerSpec,
        weights: impl Fn(usize) -> megamoe_core::Result<RankWeightsFp8>,
        rank: usize,
        device: usize,
        exchange: Box<dyn AllGather>,
    ) -> Result<MoeLayer> {
        Ok(match spec.kind {
            Kind::Split => MoeLayer::Split(Box::new(SplitLayer::for_rank(
                spec, weights, rank, device, exchange,
            )?)),
            Kind::Fused => {
                let options = FusedOptions::default();
                let layer = FusedLayer::for_rank(spec, weights, options, rank, device, exchange)?;
                MoeLayer::Fused(Box::new(layer))
            }
        })
    }

    pub fn spec(&self) -> &LayerSpec {
        match self {
            MoeLayer::Split(l) => &l.spec,
            MoeLayer::Fused(l) => &l.spec,
        }
    }

    /// The ranks this process holds, in the order of the calls' per-rank inputs and outputs:
    /// every rank (`0..spec.ranks`), or this process's one ([`Self::for_rank`]).
    pub fn local_ranks(&self) -> Range<usize> {
        match self {
            MoeLayer::Split(l) => l.local_ranks(),
            MoeLayer::Fused(l) => l.local_ranks(),
        }
    }

    /// The forward pass: one bf16 `[T, H]` output per local rank ([`Self::local_ranks`]);
    /// every input is checked before anything is written.
    pub fn forward(
        &mut self,
        inputs: &[RankInput],
        num_tokens_bound: Option<usize>,
    ) -> Result<Vec<Vec<bf16>>> {
        match self {
            MoeLayer::Split(l) => l.forward(inputs, num_tokens_bound),
            MoeLayer::Fused(l) => l.forward(inputs, num_tokens_bound),
        }
    }

    /// [`Self::forward`] up to the outputs, which stay on the device ([`Self::output`]);
    /// returns every local rank's T.
    pub(crate) fn run(
        &mut self,
        inputs: &[RankInput],
        num_tokens_bound: Option<usize>,
    ) -> Result<Vec<usize>> {
        Ok(match self {
            MoeLayer::Split(l) => l.run(inputs, num_tokens_bound)?.tokens,
            MoeLayer::Fused(l) => l.run(inputs, num_tokens_bound)?.tokens,
        })
    }

    /// Where local rank `rank`'s (its global number) output of the last call is: bf16 `[T, H]`
    /// from a byte offset of a buffer of its GPU.
    pub(crate) fn output(&self, rank: usize) -> (&DeviceBuffer, usize) {
        match self {
            MoeLayer::Split(l) => l.output(rank),
            MoeLayer::Fused(l) => l.output(rank),
        }
    }

    /// The GPU handle of rank `rank` (its device and stream), a local rank by its global number.
    pub fn gpu(&self, rank: usize) -> &megamoe_cuda::Gpu {
        match self {
            MoeLayer::Split(l) => l.gpu(rank),
            MoeLayer::Fused(l) => l.gpu(rank),
        }
    }

    /// Cumulative rows received per local expert (rank, then local expert).
    pub fn expert_counts(&self) -> &[Vec<u64>] {
        match self {
            MoeLayer::Split(l) => l.expert_counts(),
            MoeLayer::Fused(l) => l.expert_counts(),
        }
    }

    #[cfg(feature = "harness")]
    /// The wait records every rank's kernels left (the fault checks).
    pub(crate) fn expired_waits(&self) -> Result<Vec<Option<megamoe_cuda::Error>>> {
        match self {
            MoeLayer::Split(l) => l.expired_waits(),
            MoeLayer::Fused(l) => l.expired_waits(),
        }
    }

    #[cfg(feature = "harness")]
    /// Every rank's staged input bytes (the "nothing written before validation" check).
    pub(crate) fn input_bytes(&self) -> Result<Vec<u8>> {
        match self {
            MoeLayer::Split(l) => l.input_bytes(),
            MoeLayer::Fused(l) => l.input_bytes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::tests::Unreachable;

    #[test]
    fn one_rank_per_process_checks_the_rank_before_any_exchange_for_either_kind() {
        let shape = megamoe_core::Preset::by_name("tiny").unwrap().shape;
        for kind in [Kind::Split, Kind::Fused] {
            let spec = LayerSpec {
                kind,
                ..LayerSpec::new(shape, 2, 64)
            };
            let no_weights = |_| unreachable!("no weights are read for a rejected rank");
            let err = MoeLayer::for_rank(spec, no_weights, 5, 0, Box::new(Unreachable))
                .err()
                .expect("rank 5 of 2 is rejected")
                .to_string();
            assert!(
                err.contains("`rank`: 5 is not below the world size 2"),
                "{kind:?}: {err}"
            );
        }
    }
}
