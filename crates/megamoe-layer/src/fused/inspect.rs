//! What the selftest reaches into a fused layer with: a ring that never wraps, per-rank bounds,
//! the expired waits, the staged inputs and the plan the kernel built.

use megamoe_core::plan::rules::{Order, RingSizing, SLOT_ROWS};
use megamoe_core::plan::{Kernel, StreamParams, SymmetricLayout, Task, TaskKind};
use megamoe_core::weights::RankWeightsFp8;
use megamoe_cuda::World;

use super::{region, FusedLayer, FusedOptions, FusedStaged, ALL_WAITS};
use crate::call::{check_call, RankInput};
use crate::error::Result;
use crate::inputs::append_staged;
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
        let off = |name| region(&self.layout, name) as usize;
        let mut out = Vec::new();
        for (r, rank) in self.local_ranks().zip(&self.ranks) {
            let buf = self.buffers.local(r);
            let places = [
                (buf, off("x")),
                (buf, off("x_scales")),
                (buf, off("topk_idx")),
                (buf, off("topk_weights")),
                (&rank.x_bf16, 0),
            ];
            append_staged(&self.spec, places, &mut out)?;
        }
        Ok(out)
    }

    /// Rank `rank`'s plan of the last finished call: m-blocks, stream segments, tasks, status.
    pub(crate) fn plan_header(&self, rank: usize) -> Result<[u32; 4]> {
        let mut h = [0u32; 4];
        self.buffers
            .local(rank)
            .download_into(region(&self.layout, "plan") as usize, &mut h)?;
        Ok(h)
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
        let [n_blocks, n_segments, _, _] = self.plan_header(rank)?;
        let buf = self.buffers.local(rank);
        let mut blocks = vec![0u32; 4 * n_blocks as usize];
        buf.download_into(region(&self.layout, "blocks") as usize, &mut blocks)?;
        let mut segments = vec![0u32; 4 * n_segments as usize];
        buf.download_into(region(&self.layout, "segments") as usize, &mut segments)?;
        let r = &self.local(rank).params.r;
        let (n1, n2) = (r.n1 as u32, r.n2 as u32);
        let mut tasks = Vec::new();
        for seg in segments.chunks_exact(4) {
            let (kind, n_tiles) = match seg[0] {
                0 => (TaskKind::L1, n1),
                _ => (TaskKind::L2, n2),
            };
            for n in 0..n_tiles {
                tasks.extend((seg[1]..seg[1] + seg[2]).map(|block| Task { kind, block, n }));
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
        let blocks = blocks.chunks_exact(4).map(|b| [b[0], b[1], b[2]]).collect();
        Ok((params, blocks, tasks))
    }
}
