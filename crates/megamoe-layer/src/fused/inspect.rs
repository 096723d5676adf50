//! What the selftest reaches into a fused layer with: a ring that never wraps, per-rank bounds,
//! the expired waits, the staged inputs and the plan the kernel built.

use megamoe_core::plan::rules::{Order, RingSizing, SLOT_ROWS};
use megamoe_core::plan::{Kernel, StreamParams, SymmetricLayout, Task, TaskKind};
use megamoe_core::weights::RankWeightsFp8;
use megamoe_cuda::World;

use super::{FusedLayer, FusedOptions, FusedStaged, ALL_WAITS};
use crate::call::{check_call, RankInput};
use crate::error::Result;
use crate::inputs::append_staged;
use crate::kernel::{BlockInfo, PlanHeader, Segment};
use crate::spec::LayerSpec;

impl FusedLayer {
    /// The layer with its ring clamped to the full pool, so it never wraps: the selftest's
    /// reference for the ring.
    pub(crate) fn full_pool(
        spec: LayerSpec,
        weights: impl Fn(usize) -> megamoe_core::Result<RankWeightsFp8>,
    ) -> Result<FusedLayer> {
        spec.validate()?;
        let ring = RingSizing::full_pool(&spec.shape, spec.ranks, spec.max_tokens);
        let layout =
            SymmetricLayout::with_ring(Kernel::Fused, &spec.shape, spec.ranks, spec.group, ring)?;
        let options = FusedOptions::default();
        let world = World::with_deadline(spec.ranks, options.deadline)?;
        FusedLayer::build(spec, weights, options, layout, false, world)
    }

    /// [`Self::stage`] with one bound per rank and no host check of the bounds: the device
    /// check is what a multi-process world relies on (the selftest's fault checks).
    pub(crate) fn stage_with_bounds(
        &mut self,
        inputs: &[RankInput],
        bounds: &[usize],
    ) -> Result<FusedStaged> {
        let tokens = check_call(&self.spec, self.local_ranks(), inputs, None)?;
        self.upload(inputs, tokens, bounds.to_vec())
    }

    /// Every local rank's expired wait, if any (after a failed [`Self::finish`]).
    pub(crate) fn expired_waits(&self) -> Result<Vec<Option<megamoe_cuda::Error>>> {
        let mut out = Vec::new();
        for rank in self.world.ranks() {
            out.push(match rank.check_waits(&ALL_WAITS) {
                Ok(()) => None,
                Err(e @ megamoe_cuda::Error::WaitTimeout { .. }) => Some(e),
                Err(e) => return Err(e.into()),
            });
        }
        Ok(out)
    }

    /// Every local rank's staged inputs as bytes: the input rows and scales, the routing, the bf16
    /// staging (the selftest's "nothing written before validation" check).
    pub(crate) fn input_bytes(&self) -> Result<Vec<u8>> {
        let off = &self.offsets;
        let mut out = Vec::new();
        for (r, rank) in self.local_ranks().zip(&self.ranks) {
            let buf = self.buffers.local(r);
            let places = [
                (buf, off.x as usize),
                (buf, off.x_scales as usize),
                (buf, off.topk_idx as usize),
                (buf, off.topk_weights as usize),
                (&rank.x_bf16, 0),
            ];
            append_staged(&self.spec, places, &mut out)?;
        }
        Ok(out)
    }

    /// Rank `rank`'s plan of the last finished call: m-blocks, stream segments, tasks, status.
    pub(crate) fn plan_header(&self, rank: usize) -> Result<PlanHeader> {
        let mut h = [PlanHeader::default()];
        self.buffers
            .local(rank)
            .download_into(self.offsets.plan as usize, &mut h)?;
        Ok(h[0])
    }

    /// Rank `rank`'s plan of the last finished call as its kernel built it, in megamoe-core's
    /// terms: the stream params of `staged`'s order and ring, each m-block's (local expert, first
    /// row, rows), and the task stream the segments expand to. What `Stream::build` gives for
    /// the same rows (the selftest compares them).
    pub(crate) fn device_stream(
        &self,
        rank: usize,
        staged: &FusedStaged,
    ) -> Result<(StreamParams, Vec<[u32; 3]>, Vec<Task>)> {
        let h = self.plan_header(rank)?;
        let buf = self.buffers.local(rank);
        let mut blocks = vec![BlockInfo::default(); h.n_blocks as usize];
        buf.download_into(self.offsets.blocks as usize, &mut blocks)?;
        let mut segments = vec![Segment::default(); h.n_segments as usize];
        buf.download_into(self.offsets.segments as usize, &mut segments)?;
        let r = &self.local(rank).params.r;
        let (n1, n2) = (r.n1 as u32, r.n2 as u32);
        let mut tasks = Vec::new();
        for seg in segments {
            let (kind, n_tiles) = if seg.kind == TaskKind::L1 as u32 {
                (TaskKind::L1, n1)
            } else {
                (TaskKind::L2, n2)
            };
            let blocks = seg.first_block..seg.first_block + seg.n_blocks;
            for n in 0..n_tiles {
                tasks.extend(blocks.clone().map(|block| Task { kind, block, n }));
            }
        }
        let order = match staged.lag_units() {
            Some(lag_units) => Order::Lagged { lag_units },
            None => Order::SingleWave,
        };
        let params = StreamParams::fused(
            order,
            SLOT_ROWS,
            n1 as usize,
            n2 as usize,
            staged.ring_slots,
        );
        let blocks = blocks
            .iter()
            .map(|b| [b.expert, b.first_row, b.rows])
            .collect();
        Ok((params, blocks, tasks))
    }
}
