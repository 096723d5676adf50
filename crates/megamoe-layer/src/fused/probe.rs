//! The probe instantiation of the fused kernel: what it is told beyond the call (a timeline,
//! a fault), and the faults the selftest injects with it.

#[cfg(feature = "harness")]
use megamoe_core::weights::RankWeightsFp8;
#[cfg(feature = "harness")]
use megamoe_cuda::wait::deadline_ns;
#[cfg(feature = "harness")]
use megamoe_cuda::World;

#[cfg(feature = "harness")]
use super::{FusedLayer, FusedOptions};
#[cfg(feature = "harness")]
use crate::error::Result;
#[cfg(feature = "harness")]
use crate::kernel::{
    FUSED_CORRUPT_COUNT, FUSED_SLOW_PEER, FUSED_STOP_AFTER_ROUTING, FUSED_STOP_MID_COMBINE,
    FUSED_STOP_MID_TASKS,
};
#[cfg(feature = "harness")]
use crate::spec::LayerSpec;

/// What the probe instantiation is told beyond the call (device: `FusedProbeParams`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Probe {
    pub(super) fault_rank: u32,
    pub(super) fault: u32,
    pub(super) sleep_ns: u64,
}

#[cfg(feature = "harness")]
/// A fault the selftest injects on one rank (device: `FusedFault`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// The rank publishes its routing, then stops.
    StopAfterRouting,
    /// The rank stops after half of its tasks.
    StopMidTasks,
    /// The rank runs every task (its L2 rows are written), then stops before signalling them.
    StopMidCombine,
    /// The rank publishes T = t_cap + 1, a count no call has.
    CorruptCount,
    /// The rank sleeps this long before publishing its routing, then goes on.
    SlowPeer(std::time::Duration),
}

#[cfg(feature = "harness")]
impl FusedLayer {
    /// The layer whose rank `rank` takes `fault` on every call (the selftest's fault checks).
    pub(crate) fn with_fault(
        spec: LayerSpec,
        weights: impl Fn(usize) -> megamoe_core::Result<RankWeightsFp8>,
        deadline: std::time::Duration,
        rank: usize,
        fault: Fault,
    ) -> Result<FusedLayer> {
        spec.validate()?;
        let options = FusedOptions {
            deadline,
            ..FusedOptions::default()
        };
        let world = World::with_deadline(spec.ranks, deadline)?;
        let mut layer =
            FusedLayer::build(spec, weights, options, spec.fused_layout()?, true, world)?;
        let (fault, sleep_ns) = match fault {
            Fault::StopAfterRouting => (FUSED_STOP_AFTER_ROUTING, 0),
            Fault::StopMidTasks => (FUSED_STOP_MID_TASKS, 0),
            Fault::StopMidCombine => (FUSED_STOP_MID_COMBINE, 0),
            Fault::CorruptCount => (FUSED_CORRUPT_COUNT, 0),
            Fault::SlowPeer(d) => (FUSED_SLOW_PEER, deadline_ns(d)),
        };
        layer.probe = Some(Probe {
            fault_rank: rank as u32,
            fault,
            sleep_ns,
        });
        Ok(layer)
    }
}
