//! The layer API: either form behind one type, chosen by [`LayerSpec::kind`] (fused by
//! default).

use half::bf16;
use megamoe_core::weights::RankWeightsFp8;
use megamoe_cuda::DeviceBuffer;

use crate::error::Result;
use crate::fused::FusedLayer;
use crate::spec::{Kind, LayerSpec};
use crate::split::{RankInput, SplitLayer};

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

    pub fn spec(&self) -> &LayerSpec {
        match self {
            MoeLayer::Split(l) => &l.spec,
            MoeLayer::Fused(l) => &l.spec,
        }
    }

    /// The forward pass: one bf16 `[T, H]` output per rank; every input is checked before
    /// anything is written.
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
    /// returns every rank's T.
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

    /// Where rank `rank`'s output of the last call is: bf16 `[T, H]` from a byte offset of a
    /// buffer of its GPU.
    pub(crate) fn output(&self, rank: usize) -> (&DeviceBuffer, usize) {
        match self {
            MoeLayer::Split(l) => l.output(rank),
            MoeLayer::Fused(l) => l.output(rank),
        }
    }

    /// The GPU handle of rank `rank` (its device and stream).
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

    /// The wait records every rank's kernels left (the fault checks).
    pub(crate) fn expired_waits(&self) -> Result<Vec<Option<megamoe_cuda::Error>>> {
        match self {
            MoeLayer::Split(l) => l.expired_waits(),
            MoeLayer::Fused(l) => l.expired_waits(),
        }
    }

    /// Every rank's staged input bytes (the "nothing written before validation" check).
    pub(crate) fn input_bytes(&self) -> Result<Vec<u8>> {
        match self {
            MoeLayer::Split(l) => l.input_bytes(),
            MoeLayer::Fused(l) => l.input_bytes(),
        }
    }
}
