//! The task stream and tile table of one rank, and the checks that prove a stream safe.
//!
//! Blocks are the m-blocks of the rank's pool in L1 order: local expert ascending, then row.
//! Within an expert, rows are ordered by (source rank, token), so a block's rows come from a
//! run of source ranks. Tasks are (kind, block, n-block); SMs take them strictly in stream
//! order. The pull of block b (its token rows over NVLink into its slot) is issued when the
//! first L1 task of block b − [`PULL_AHEAD_BLOCKS`] is handed out, after the slot's previous
//! block has finished L2.

use serde::Serialize;

use super::rules::{Order, GROUP_UNITS, PULL_AHEAD_BLOCKS, UNIT_BLOCKS};
use crate::batch::WorldInputs;
use crate::error::{Error, Result};

/// Routed rows per (source rank, expert): what the count exchange tells every rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Loads {
    pub ranks: usize,
    pub experts: usize,
    /// Tokens on each rank for this call.
    pub tokens: Vec<usize>,
    /// `counts[src · experts + e]`: valid slots of rank `src`'s tokens that name expert `e`.
    pub counts: Vec<usize>,
}

impl Loads {
    /// Checks lengths and that no rank sends an expert more rows than it has tokens.
    pub fn new(experts: usize, tokens: Vec<usize>, counts: Vec<usize>) -> Result<Self> {
        let ranks = tokens.len();
        if ranks == 0 || experts == 0 || experts % ranks != 0 {
            return Err(Error::Value {
                arg: "loads",
                value: format!("{experts} experts over {ranks} ranks"),
                reason: "needs at least one rank and experts that split evenly".into(),
            });
        }
        if counts.len() != ranks * experts {
            return Err(Error::Length {
                arg: "counts",
                got: counts.len(),
                expected: ranks * experts,
            });
        }
        for (i, &c) in counts.iter().enumerate() {
            let src = i / experts;
            if c > tokens[src] {
                return Err(Error::Value {
                    arg: "counts",
                    value: c.to_string(),
                    reason: format!(
                        "rank {src} sends expert {} more rows than its {} tokens",
                        i % experts,
                        tokens[src]
                    ),
                });
            }
        }
        Ok(Loads {
            ranks,
            experts,
            tokens,
            counts,
        })
    }

    /// The loads of a generated world (counts of its valid slots).
    pub fn from_world(world: &WorldInputs) -> Result<Self> {
        let experts = world.shape.experts;
        let mut counts = vec![0; world.num_ranks() * experts];
        for (src, rank) in world.ranks.iter().enumerate() {
            for &e in rank.topk_idx.iter().filter(|&&e| e >= 0) {
                counts[src * experts + e as usize] += 1;
            }
        }
        Loads::new(
            experts,
            world.ranks.iter().map(|r| r.tokens).collect(),
            counts,
        )
    }

    pub fn local_experts(&self) -> usize {
        self.experts / self.ranks
    }

    /// Rows rank `src` sends to global expert `expert`.
    pub fn rows(&self, src: usize, expert: usize) -> usize {
        self.counts[src * self.experts + expert]
    }

    /// Rows of each local expert of `rank`, summed over sources.
    pub fn expert_rows(&self, rank: usize) -> Vec<usize> {
        let local = self.local_experts();
        (0..local)
            .map(|j| {
                (0..self.ranks)
                    .map(|src| self.rows(src, rank * local + j))
                    .sum()
            })
            .collect()
    }

    /// Valid slots of rank `src`'s tokens (rows it gets back in its combine area).
    pub fn valid_slots(&self, src: usize) -> usize {
        self.counts[src * self.experts..(src + 1) * self.experts]
            .iter()
            .sum()
    }
}

/// What a stream is built from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct StreamParams {
    pub order: Order,
    pub block_m: usize,
    pub n_blocks_l1: usize,
    pub n_blocks_l2: usize,
    /// Ring capacity in blocks; block b uses slot b mod ring_slots.
    pub ring_slots: usize,
    /// Blocks the pull runs ahead of the L1 frontier ([`PULL_AHEAD_BLOCKS`]; unbounded for the
    /// split kernel, whose dispatch is its own launch). The fused kernel pulls every block at
    /// once at decode sizes ([`rules::pull_ahead`](super::rules::pull_ahead)) only where no
    /// block reuses a slot: then no pull waits for a slot, and the stream checked here at
    /// [`PULL_AHEAD_BLOCKS`] has the same waits.
    pub pull_ahead: usize,
    /// The split kernel: no L2 task starts before every L1 task of the rank is done.
    pub kernel_boundary: bool,
}

impl StreamParams {
    /// The fused kernel's stream for `order`.
    pub fn fused(
        order: Order,
        block_m: usize,
        n_l1: usize,
        n_l2: usize,
        ring_slots: usize,
    ) -> Self {
        StreamParams {
            order,
            block_m,
            n_blocks_l1: n_l1,
            n_blocks_l2: n_l2,
            ring_slots,
            // In either order: a single wave that pulled every block at once measured slower
            // (docs/PERF.md, fused v3), the burst of rows competing with the L1 tiles; decode
            // sizes are the exception (rules::pull_ahead).
            pull_ahead: PULL_AHEAD_BLOCKS,
            kernel_boundary: false,
        }
    }

    /// The split kernel's stream: a single wave over the full pool with a kernel boundary.
    pub fn split(block_m: usize, n_l1: usize, n_l2: usize, pool_slots: usize) -> Self {
        StreamParams {
            kernel_boundary: true,
            // Its dispatch is a launch of its own: every row is pulled before L1 starts.
            pull_ahead: usize::MAX,
            ..Self::fused(Order::SingleWave, block_m, n_l1, n_l2, pool_slots)
        }
    }
}

/// One m-block: a tile-table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Block {
    /// Local expert.
    pub expert: usize,
    /// First row within the expert's segment.
    pub first_row: usize,
    pub rows: usize,
    pub unit: usize,
    pub slot: usize,
    /// The block whose L2 must finish before this block's rows may be pulled into the slot.
    pub waits_for: Option<usize>,
}

/// A task's GEMM; its value is the kernel's (megamoe-layer's `TaskKind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum TaskKind {
    L1 = 0,
    L2 = 1,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Task {
    pub kind: TaskKind,
    pub block: u32,
    pub n: u32,
}

/// The task stream and tile table of one rank for one call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Stream {
    pub params: StreamParams,
    pub blocks: Vec<Block>,
    pub tasks: Vec<Task>,
}

impl Stream {
    /// Builds the stream for the rows of each local expert. Slots and waits follow the order:
    /// lagged blocks wait for the slot's previous block; a single wave waits for nothing (it
    /// must fit the ring, which [`Stream::verify`] checks).
    pub fn build(params: StreamParams, expert_rows: &[usize]) -> Stream {
        let mut blocks = Vec::new();
        let mut unit_spans = Vec::new(); // (first block, end block) per unit
        for (expert, &rows) in expert_rows.iter().enumerate() {
            let n_blocks = rows.div_ceil(params.block_m);
            for unit_first in (0..n_blocks).step_by(UNIT_BLOCKS) {
                let unit = unit_spans.len();
                let start = blocks.len();
                for m in unit_first..(unit_first + UNIT_BLOCKS).min(n_blocks) {
                    let b = blocks.len();
                    let first_row = m * params.block_m;
                    blocks.push(Block {
                        expert,
                        first_row,
                        rows: params.block_m.min(rows - first_row),
                        unit,
                        // A ring of 0 slots puts every block in slot 0, which `verify` rejects.
                        slot: b % params.ring_slots.max(1),
                        waits_for: match params.order {
                            Order::Lagged { .. } => b.checked_sub(params.ring_slots),
                            Order::SingleWave => None,
                        },
                    });
                }
                unit_spans.push((start, blocks.len()));
            }
        }
        let mut tasks =
            Vec::with_capacity(blocks.len() * (params.n_blocks_l1 + params.n_blocks_l2));
        // Within a unit, n-block outer and m-block inner: the weight tile of one n-block is read
        // once and reused by the unit's blocks while it sits in L2.
        let emit = |tasks: &mut Vec<Task>, kind: TaskKind, unit: usize| {
            let (start, end) = unit_spans[unit];
            let n_blocks = match kind {
                TaskKind::L1 => params.n_blocks_l1,
                TaskKind::L2 => params.n_blocks_l2,
            };
            for n in 0..n_blocks {
                for b in start..end {
                    tasks.push(Task {
                        kind,
                        block: b as u32,
                        n: n as u32,
                    });
                }
            }
        };
        let units = unit_spans.len();
        match params.order {
            Order::SingleWave => {
                (0..units).for_each(|u| emit(&mut tasks, TaskKind::L1, u));
                (0..units).for_each(|u| emit(&mut tasks, TaskKind::L2, u));
            }
            Order::Lagged { lag_units } => {
                let mut l2_next = 0;
                for group_start in (0..units).step_by(GROUP_UNITS) {
                    let group_end = (group_start + GROUP_UNITS).min(units);
                    (group_start..group_end).for_each(|u| emit(&mut tasks, TaskKind::L1, u));
                    // L2 of every unit that is now `lag` units behind the L1 frontier.
                    while l2_next + lag_units < group_end {
                        emit(&mut tasks, TaskKind::L2, l2_next);
                        l2_next += 1;
                    }
                }
                (l2_next..units).for_each(|u| emit(&mut tasks, TaskKind::L2, u));
            }
        }
        Stream {
            params,
            blocks,
            tasks,
        }
    }

    /// Positions in the stream of each block's first L1 and last L2 task.
    fn spans(&self) -> (Vec<usize>, Vec<usize>) {
        let mut first_l1 = vec![usize::MAX; self.blocks.len()];
        let mut last_l2 = vec![0; self.blocks.len()];
        for (pos, t) in self.tasks.iter().enumerate() {
            let b = t.block as usize;
            match t.kind {
                TaskKind::L1 => first_l1[b] = first_l1[b].min(pos),
                TaskKind::L2 => last_l2[b] = pos,
            }
        }
        (first_l1, last_l2)
    }

    /// Proves the stream safe for any number of SMs taking tasks in order, or names the first
    /// fault:
    /// - every block has each of its L1 and L2 tasks once, every L2 after all its L1;
    /// - every slot is below the ring capacity;
    /// - a block that reuses a slot waits for exactly the slot's previous block;
    /// - that wait is issued (at the first L1 task of block b − pull_ahead) only after the
    ///   awaited block's last L2 task was handed out, so it waits on earlier work only: by
    ///   induction over stream positions, every wait is eventually satisfied, with one SM or
    ///   many.
    ///
    /// Returns the peak of live slots in stream order (a block is live from its pull to its
    /// last L2 task), which never exceeds the ring.
    pub fn verify(&self) -> Result<StreamCheck, PlanFault> {
        let n = self.blocks.len();
        let p = &self.params;
        let mut seen_l1 = vec![0usize; n];
        let mut seen_l2 = vec![0usize; n];
        for (pos, t) in self.tasks.iter().enumerate() {
            let b = t.block as usize;
            match t.kind {
                TaskKind::L1 => {
                    if seen_l2[b] > 0 {
                        return Err(PlanFault::L2BeforeL1 {
                            block: b,
                            position: pos,
                        });
                    }
                    seen_l1[b] += 1;
                }
                TaskKind::L2 => {
                    if seen_l1[b] != p.n_blocks_l1 {
                        return Err(PlanFault::L2BeforeL1 {
                            block: b,
                            position: pos,
                        });
                    }
                    seen_l2[b] += 1;
                }
            }
        }
        if let Some(b) =
            (0..n).find(|&b| seen_l1[b] != p.n_blocks_l1 || seen_l2[b] != p.n_blocks_l2)
        {
            return Err(PlanFault::MissingTasks { block: b });
        }
        let (first_l1, last_l2) = self.spans();
        // The position at which the pull of block b is issued.
        let issue_pos = |b: usize| first_l1[b.saturating_sub(p.pull_ahead)];
        let mut previous: Vec<Option<usize>> = vec![None; p.ring_slots];
        for (b, block) in self.blocks.iter().enumerate() {
            if block.slot >= p.ring_slots {
                return Err(PlanFault::SlotOutOfRing {
                    block: b,
                    slot: block.slot,
                    ring_slots: p.ring_slots,
                });
            }
            let prev = previous[block.slot].replace(b);
            if block.waits_for != prev {
                return Err(match prev {
                    Some(prev) if block.waits_for.is_none() => PlanFault::UnguardedReuse {
                        block: b,
                        slot: block.slot,
                        live_block: prev,
                    },
                    _ => PlanFault::WrongWait {
                        block: b,
                        waits_for: block.waits_for,
                        previous: prev,
                    },
                });
            }
            if let Some(w) = block.waits_for {
                if last_l2[w] >= issue_pos(b) {
                    return Err(PlanFault::WaitOnLaterTask {
                        block: b,
                        waits_for: w,
                    });
                }
            }
        }
        // Live slots in stream order: +1 at the pull's issue, −1 after the last L2 task.
        let mut delta = vec![0i64; self.tasks.len() + 1];
        for b in 0..n {
            delta[issue_pos(b)] += 1;
            delta[last_l2[b] + 1] -= 1;
        }
        let mut live = 0i64;
        let mut peak = 0i64;
        for d in delta {
            live += d;
            peak = peak.max(live);
        }
        Ok(StreamCheck {
            blocks: n,
            tasks: self.tasks.len(),
            peak_live_slots: peak as usize,
        })
    }
}

/// What [`Stream::verify`] proved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct StreamCheck {
    pub blocks: usize,
    pub tasks: usize,
    /// Peak of slots live at once in stream order.
    pub peak_live_slots: usize,
}

/// A fault of a plan, found without running it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanFault {
    #[error(
        "block {block}: an L2 task at stream position {position} precedes one of its L1 tasks"
    )]
    L2BeforeL1 { block: usize, position: usize },
    #[error("block {block} does not have each of its L1 and L2 tasks exactly once")]
    MissingTasks { block: usize },
    #[error("block {block} uses slot {slot} of a ring of {ring_slots}")]
    SlotOutOfRing {
        block: usize,
        slot: usize,
        ring_slots: usize,
    },
    #[error("block {block} reuses slot {slot} while block {live_block} may still be live, without waiting")]
    UnguardedReuse {
        block: usize,
        slot: usize,
        live_block: usize,
    },
    #[error("block {block} waits for {waits_for:?} but the slot's previous block is {previous:?}")]
    WrongWait {
        block: usize,
        waits_for: Option<usize>,
        previous: Option<usize>,
    },
    #[error("block {block} waits for block {waits_for}, whose last L2 task comes later in the stream: with too few SMs free this wait is never satisfied")]
    WaitOnLaterTask { block: usize, waits_for: usize },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::rules::ring_slots;

    fn lagged(lag: usize, ring: usize) -> StreamParams {
        StreamParams::fused(Order::Lagged { lag_units: lag }, 128, 2, 3, ring)
    }

    /// 12 experts with 40 full units between them: every unit holds 8 blocks.
    fn full_units() -> Vec<usize> {
        vec![
            1024 * 3,
            1024 * 4,
            1024 * 3,
            1024 * 2,
            1024 * 5,
            1024 * 3,
            1024 * 4,
            1024 * 2,
            1024 * 3,
            1024 * 4,
            1024 * 3,
            1024 * 4,
        ]
    }

    #[test]
    fn the_rule_ring_is_safe_and_its_bound_is_reached() {
        for lag in [0, 1, 3, 8, 11] {
            let s = Stream::build(lagged(lag, ring_slots(lag)), &full_units());
            let check = s.verify().unwrap();
            assert_eq!(check.peak_live_slots, ring_slots(lag), "lag {lag}");
        }
    }

    #[test]
    fn a_ring_one_slot_too_small_is_caught() {
        for lag in [0, 3, 8] {
            let s = Stream::build(lagged(lag, ring_slots(lag) - 1), &full_units());
            assert!(
                matches!(s.verify(), Err(PlanFault::WaitOnLaterTask { .. })),
                "lag {lag}"
            );
        }
    }

    #[test]
    fn a_lag_larger_than_the_ring_allows_is_caught() {
        let s = Stream::build(lagged(9, ring_slots(8)), &full_units());
        assert!(matches!(s.verify(), Err(PlanFault::WaitOnLaterTask { .. })));
    }

    #[test]
    fn a_single_wave_that_overflows_its_ring_is_caught() {
        let p = StreamParams::fused(Order::SingleWave, 128, 1, 1, 10);
        let s = Stream::build(p, &[128 * 6, 128 * 5]);
        assert!(matches!(
            s.verify(),
            Err(PlanFault::UnguardedReuse {
                block: 10,
                slot: 0,
                live_block: 0
            })
        ));
        let s = Stream::build(p, &[128 * 6, 128 * 4]);
        assert_eq!(s.verify().unwrap().peak_live_slots, 10);
    }

    #[test]
    fn blocks_cover_every_row_once_with_partial_last_blocks() {
        let s = Stream::build(lagged(8, ring_slots(8)), &[300, 0, 129]);
        let rows: Vec<(usize, usize, usize)> = s
            .blocks
            .iter()
            .map(|b| (b.expert, b.first_row, b.rows))
            .collect();
        assert_eq!(
            rows,
            vec![
                (0, 0, 128),
                (0, 128, 128),
                (0, 256, 44),
                (2, 0, 128),
                (2, 128, 1)
            ]
        );
    }
}
