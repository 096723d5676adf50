//! The schedule and memory planner: symmetric-buffer layouts, the rules of the lag-ordered
//! schedule, tile heuristics and the task stream with its tile table (SPEC §4).
//!
//! The device code replays what this module defines: a call's [`CallPlan`] is decided from
//! values every rank shares (shape, R, T_max, G, the validated bound), and its [`Stream`] from
//! the exchanged counts, so every rank derives the same plan. [`Stream::verify`] proves a stream
//! safe; the simulator in [`crate::sim`] runs it.

pub mod buffer;
pub mod heuristics;
pub mod layout;
pub mod rules;
pub mod stream;

use serde::Serialize;

pub use buffer::{BufferLayout, BufferSpec, HandleLayout};
pub use heuristics::{tile_config, TileConfig};
pub use layout::{Kernel, Region, SymmetricLayout};
pub use rules::{CallOrder, Order, RingSizing};
pub use stream::{Block, Loads, PlanFault, Stream, StreamCheck, StreamParams, Task, TaskKind};

use crate::error::{Error, Result};
use crate::preset::Shape;

/// Everything a call decides before the counts are known.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct CallPlan {
    pub shape: Shape,
    pub ranks: usize,
    pub gran: usize,
    /// The validated `num_tokens_bound` (the capacity when none was given).
    pub bound: usize,
    pub ring: RingSizing,
    pub tile: TileConfig,
    pub order: CallOrder,
}

impl CallPlan {
    /// The plan of a call at `bound` tokens per rank on buffers sized for `t_max`.
    pub fn new(
        shape: &Shape,
        ranks: usize,
        t_max: usize,
        gran: usize,
        bound: usize,
    ) -> Result<Self> {
        shape.validate(ranks)?;
        rules::check_gran(shape, gran)?;
        rules::check_tokens(t_max)?;
        let ring = RingSizing::new(shape, ranks, t_max);
        if bound > ring.t_cap {
            return Err(Error::Capacity {
                arg: "num_tokens_bound",
                got: bound,
                capacity: ring.t_cap,
            });
        }
        let tile = tile_config(shape, ranks, bound, gran);
        Ok(CallPlan {
            shape: *shape,
            ranks,
            gran,
            bound,
            ring,
            tile,
            order: rules::call_order(shape, ranks, &ring, bound, tile.block_m),
        })
    }

    /// Stream parameters of `kernel` for this call.
    pub fn stream_params(&self, kernel: Kernel) -> StreamParams {
        let (m, n1, n2) = (
            self.tile.block_m,
            self.tile.n_blocks_l1(&self.shape),
            self.tile.n_blocks_l2(&self.shape),
        );
        match kernel {
            Kernel::Split => StreamParams::split(m, n1, n2, self.ring.pool_rows / m),
            Kernel::Fused => {
                StreamParams::fused(self.order.order, m, n1, n2, self.order.ring_slots)
            }
        }
    }

    /// The stream of every rank for these loads.
    pub fn streams(&self, kernel: Kernel, loads: &Loads) -> Result<Vec<Stream>> {
        if loads.ranks != self.ranks || loads.experts != self.shape.experts {
            return Err(Error::Value {
                arg: "loads",
                value: format!("{} ranks x {} experts", loads.ranks, loads.experts),
                reason: format!(
                    "the plan is for {} ranks x {} experts",
                    self.ranks, self.shape.experts
                ),
            });
        }
        let params = self.stream_params(kernel);
        Ok((0..self.ranks)
            .map(|r| Stream::build(params, &loads.expert_rows(r)))
            .collect())
    }
}
