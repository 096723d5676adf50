//! What the selftest and the benchmark reach into a split layer with: injected faults, the
//! expired waits, the staged inputs, and the GEMMs alone (the benchmark's GEMM-only arm).

use megamoe_core::weights::RankWeightsFp8;
use megamoe_cuda::DeviceBuffer;
use megamoe_ep::{InjectedFault, IoRegion};
use megamoe_gemm::heuristics::choose;
use megamoe_gemm::{GemmPointers, GroupedGemm};

use super::{SplitLayer, Staged};
use crate::error::Result;
use crate::inputs::append_staged;
use crate::kernel::l1_problem;
use crate::spec::LayerSpec;

impl SplitLayer {
    /// The layer whose dispatch and combine inject `fault`, every wait bounded by `deadline`
    /// (the selftest's fault checks).
    pub(crate) fn with_fault(
        spec: LayerSpec,
        weights: impl Fn(usize) -> megamoe_core::Result<RankWeightsFp8>,
        deadline: std::time::Duration,
        fault: InjectedFault,
    ) -> Result<SplitLayer> {
        SplitLayer::build(spec, weights, Some((deadline, fault)), None)
    }

    /// Every rank's expired wait, if any (after a failed [`Self::finish`]).
    pub(crate) fn expired_waits(&self) -> Result<Vec<Option<megamoe_cuda::Error>>> {
        Ok(self.ep.expired_waits()?)
    }

    /// Every local rank's staged inputs as bytes: the input rows and scales, the routing, the
    /// bf16 staging (the selftest's "nothing written before validation" check).
    pub(crate) fn input_bytes(&self) -> Result<Vec<u8>> {
        let l = self.ep.layout;
        let mut out = Vec::new();
        for (r, rank) in self.local() {
            let (buf, io) = (self.ep.buffer(r), self.ep.io(r));
            let places = [
                (buf, l.in_rows),
                (buf, l.in_scales),
                (io, self.ep.io_offset(IoRegion::TopkIdx)),
                (io, self.ep.io_offset(IoRegion::Probs)),
                (&rank.x_bf16, 0),
            ];
            append_staged(&self.spec, places, &mut out)?;
        }
        Ok(out)
    }

    /// Our two grouped GEMMs alone over the pool of the last call of `staged`: a plain L1 (bf16
    /// output into a scratch buffer) and the layer's L2 (the benchmark's GEMM-only arm).
    pub(crate) fn gemms_only(&self, staged: &Staged) -> Result<GemmsOnly> {
        let (h, i) = (self.spec.shape.hidden, self.spec.shape.inter);
        let el = self.spec.shape.local_experts(self.spec.ranks);
        let rows = self.spec.pool_rows();
        let problem = l1_problem(
            h,
            i,
            el,
            self.rows_per_expert(staged),
            self.spec.accumulation,
        );
        let config = choose(&problem, self.l1_config.ctas)?;
        let mut l1 = Vec::new();
        let mut scratch = Vec::new();
        for (r, rank) in self.local() {
            let out = rank.gpu.alloc(rows * 2 * i * 2)?;
            let ptrs = self.ep.ptrs(r);
            l1.push(GroupedGemm::new(
                &rank.gpu,
                problem,
                config,
                rows,
                GemmPointers {
                    a: ptrs.out_rows,
                    scale_a: ptrs.out_scales,
                    b: rank.w1.ptr(),
                    scale_b: rank.s1.ptr(),
                    expert_rows: self.ep.handle_ptrs(&self.handle, r).padded,
                    out: out.ptr(),
                },
            )?);
            scratch.push(out);
        }
        Ok(GemmsOnly {
            l1,
            l2: self.l2_index(staged)?,
            _scratch: scratch,
        })
    }
}

/// The benchmark's GEMM-only arm (see [`SplitLayer::gemms_only`]).
pub(crate) struct GemmsOnly {
    l1: Vec<GroupedGemm>,
    l2: usize,
    _scratch: Vec<DeviceBuffer>,
}

impl GemmsOnly {
    pub(crate) fn launch(&self, layer: &SplitLayer) -> Result<()> {
        for (rank, l1) in layer.ranks.iter().zip(&self.l1) {
            l1.launch(&rank.gpu)?;
            rank.l2[self.l2].launch(&rank.gpu)?;
        }
        Ok(())
    }
}
