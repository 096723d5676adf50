//! A discrete-event simulator of R ranks × S SMs replaying the planned streams with their real
//! dependencies: token pull → L1 → slot full → L2 → slot empty (and scatter) → final barrier →
//! combine.
//!
//! Each SM takes the next task of its rank's stream, in order. The first L1 task of block j
//! makes its SM issue the pulls of blocks up to j + pull_ahead, each after its slot's awaited
//! block finished L2; a pull is a transfer per source rank through the source's NVLink egress
//! and the puller's ingress. An L2 tile scatters its rows to their source ranks the same way.
//!
//! The simulator does not trust the plan: it tracks which block really holds each slot and
//! reports a pull into a slot whose block is still live, a wait on work not yet handed out
//! (which with fewer free SMs never completes), and a deadlock.

pub mod time;

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use serde::Serialize;

pub use time::{TaskCosts, TimeModel};

use crate::error::Error;
use crate::plan::{CallPlan, Kernel, Loads, Stream, TaskKind};
use crate::rng;

/// How to run a simulation.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SimConfig {
    /// SMs per rank taking tasks.
    pub sms: usize,
    /// Seed of a ±50 % per-task duration jitter, to shake out orderings; `None` runs the model.
    pub jitter_seed: Option<u64>,
}

/// What one rank did.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RankReport {
    pub blocks: usize,
    pub tasks: usize,
    pub ring_slots: usize,
    /// Most slots live at once (pull issued, L2 not finished).
    pub peak_live_slots: usize,
    /// When its last task and scatter finished, s.
    pub work_done_s: f64,
}

/// The outcome of a simulation.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SimReport {
    /// From launch to the end of the slowest rank's combine, s.
    pub time_s: f64,
    pub ranks: Vec<RankReport>,
}

impl SimReport {
    pub fn peak_live_slots(&self) -> usize {
        self.ranks
            .iter()
            .map(|r| r.peak_live_slots)
            .max()
            .unwrap_or(0)
    }
}

/// A fault found by running a plan.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SimFault {
    #[error("rank {rank}: the pull of block {new_block} overwrites slot {slot} while block {live_block} is live (t = {time_s:e} s)")]
    SlotOverwritten {
        rank: usize,
        slot: usize,
        live_block: usize,
        new_block: usize,
        time_s: f64,
    },
    #[error("rank {rank}: the pull of block {block} waits for block {waits_for}, whose L2 tasks are not all handed out yet")]
    WaitOnLaterWork {
        rank: usize,
        block: usize,
        waits_for: usize,
    },
    #[error("rank {rank} deadlocked at t = {time_s:e} s with {tasks_left} tasks left: {waiting}")]
    Deadlock {
        rank: usize,
        time_s: f64,
        tasks_left: usize,
        waiting: String,
    },
}

/// Runs every rank's stream for these loads. `streams[r]` is rank r's stream; `costs` prices
/// its tasks.
pub fn simulate(
    streams: &[Stream],
    loads: &Loads,
    costs: &TaskCosts,
    config: &SimConfig,
) -> std::result::Result<SimReport, SimFault> {
    let mut sim = Sim::new(streams, loads, costs, config);
    sim.run()?;
    Ok(sim.report())
}

/// Predicted times of one call on both kernels.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Prediction {
    pub plan: CallPlan,
    pub split: SimReport,
    pub fused: SimReport,
}

/// Why a prediction failed: the loads do not fit the plan, or a plan is faulty.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum PredictError {
    #[error(transparent)]
    Plan(#[from] Error),
    #[error(transparent)]
    Sim(#[from] SimFault),
}

/// Plans and simulates one call on the split and the fused kernel, with all SMs of `model`.
pub fn predict(
    plan: &CallPlan,
    loads: &Loads,
    model: &TimeModel,
) -> std::result::Result<Prediction, PredictError> {
    let costs = TaskCosts {
        shape: plan.shape,
        tile: plan.tile,
        gran: plan.gran,
        model: *model,
    };
    let config = SimConfig {
        sms: model.sms,
        jitter_seed: None,
    };
    let split = plan.streams(Kernel::Split, loads)?;
    let fused = plan.streams(Kernel::Fused, loads)?;
    Ok(Prediction {
        plan: *plan,
        split: simulate(&split, loads, &costs, &config)?,
        fused: simulate(&fused, loads, &costs, &config)?,
    })
}

#[derive(Clone, Copy, Debug)]
enum EventKind {
    SmFree { sm: usize },
    TaskDone { sm: usize, task: usize },
    PullDone { block: usize },
}

#[derive(Clone, Copy, Debug)]
struct Event {
    t: f64,
    seq: u64,
    rank: usize,
    kind: EventKind,
}

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Event {
    /// Reversed, so the max-heap pops the earliest event (ties: the first scheduled).
    fn cmp(&self, other: &Self) -> Ordering {
        other.t.total_cmp(&self.t).then(other.seq.cmp(&self.seq))
    }
}

/// One rank's state.
struct Rank<'a> {
    stream: &'a Stream,
    /// Rows of each block by source rank.
    sources: Vec<Vec<(usize, usize)>>,
    /// Blocks in each block's unit.
    unit_blocks: Vec<usize>,
    next_task: usize,
    l1_handed: Vec<bool>,
    l2_unhanded: Vec<usize>,
    next_pull: usize,
    arrived: Vec<bool>,
    l1_left: Vec<usize>,
    l2_left: Vec<usize>,
    slot_holder: Vec<Option<usize>>,
    live: usize,
    peak_live: usize,
    l1_total_left: usize,
    l1_all_done: bool,
    tasks_left: usize,
    work_done: f64,
    /// The task each SM runs once its pulls are issued.
    pending: Vec<Option<usize>>,
    /// Blocks below this index each SM must have pulled before its task: the SM that takes
    /// the first L1 task of block j owes the pulls up to j + pull_ahead.
    owed_pulls: Vec<usize>,
    wait_arrival: Vec<Vec<(usize, usize)>>,
    wait_full: Vec<Vec<(usize, usize)>>,
    wait_empty: Vec<Vec<usize>>,
    wait_boundary: Vec<(usize, usize)>,
}

struct Sim<'a> {
    ranks: Vec<Rank<'a>>,
    loads: &'a Loads,
    costs: &'a TaskCosts,
    config: &'a SimConfig,
    ingress_free: Vec<f64>,
    egress_free: Vec<f64>,
    events: BinaryHeap<Event>,
    seq: u64,
    now: f64,
}

/// Rows of a block by source rank: an expert's rows are ordered by source rank.
fn block_sources(loads: &Loads, rank: usize, stream: &Stream) -> Vec<Vec<(usize, usize)>> {
    let local = loads.local_experts();
    stream
        .blocks
        .iter()
        .map(|b| {
            let expert = rank * local + b.expert;
            let (lo, hi) = (b.first_row, b.first_row + b.rows);
            let mut start = 0;
            let mut out = Vec::new();
            for src in 0..loads.ranks {
                let end = start + loads.rows(src, expert);
                let rows = hi.min(end).saturating_sub(lo.max(start));
                if rows > 0 {
                    out.push((src, rows));
                }
                start = end;
            }
            out
        })
        .collect()
}

/// A deterministic factor in [0.5, 1.5) from (seed, rank, task): splitmix64.
fn jitter(seed: u64, rank: usize, task: usize) -> f64 {
    0.5 + rng::unit(rng::splitmix64(seed ^ ((rank as u64) << 40) ^ task as u64))
}

impl<'a> Sim<'a> {
    fn new(
        streams: &'a [Stream],
        loads: &'a Loads,
        costs: &'a TaskCosts,
        config: &'a SimConfig,
    ) -> Self {
        let ranks = streams
            .iter()
            .enumerate()
            .map(|(r, s)| {
                let n = s.blocks.len();
                let units = s.blocks.last().map_or(0, |b| b.unit + 1);
                let mut per_unit = vec![0; units];
                for b in &s.blocks {
                    per_unit[b.unit] += 1;
                }
                let unit_blocks = s.blocks.iter().map(|b| per_unit[b.unit]).collect();
                Rank {
                    stream: s,
                    sources: block_sources(loads, r, s),
                    unit_blocks,
                    next_task: 0,
                    l1_handed: vec![false; n],
                    l2_unhanded: vec![s.params.n_blocks_l2; n],
                    next_pull: 0,
                    arrived: vec![false; n],
                    l1_left: vec![s.params.n_blocks_l1; n],
                    l2_left: vec![s.params.n_blocks_l2; n],
                    slot_holder: vec![None; s.params.ring_slots.max(1)],
                    live: 0,
                    peak_live: 0,
                    l1_total_left: n * s.params.n_blocks_l1,
                    l1_all_done: n == 0,
                    tasks_left: s.tasks.len(),
                    work_done: 0.0,
                    pending: vec![None; config.sms],
                    owed_pulls: vec![0; config.sms],
                    wait_arrival: vec![Vec::new(); n],
                    wait_full: vec![Vec::new(); n],
                    wait_empty: vec![Vec::new(); n],
                    wait_boundary: Vec::new(),
                }
            })
            .collect();
        Sim {
            ranks,
            loads,
            costs,
            config,
            ingress_free: vec![0.0; streams.len()],
            egress_free: vec![0.0; streams.len()],
            events: BinaryHeap::new(),
            seq: 0,
            now: 0.0,
        }
    }

    fn push(&mut self, t: f64, rank: usize, kind: EventKind) {
        self.seq += 1;
        self.events.push(Event {
            t,
            seq: self.seq,
            rank,
            kind,
        });
    }

    /// One transfer over NVLink from `src` to `dst`; returns its end. The source's egress and
    /// the destination's ingress each serve their transfers in order at the link rate, and
    /// independently: NVLink is packet-switched, so a transfer waiting at one end does not hold
    /// the other end idle.
    fn transfer(&mut self, src: usize, dst: usize, bytes: f64, ready: f64) -> f64 {
        let seconds = bytes / self.costs.model.nvlink_bytes;
        self.egress_free[src] = ready.max(self.egress_free[src]) + seconds;
        self.ingress_free[dst] = ready.max(self.ingress_free[dst]) + seconds;
        self.egress_free[src].max(self.ingress_free[dst])
    }

    fn task_seconds(&self, rank: usize, task: usize) -> f64 {
        let r = &self.ranks[rank];
        let t = r.stream.tasks[task];
        let b = t.block as usize;
        let rows = r.stream.blocks[b].rows;
        let base = match t.kind {
            TaskKind::L1 => self.costs.l1_seconds(rows, r.unit_blocks[b]),
            TaskKind::L2 => {
                let local = r.sources[b]
                    .iter()
                    .filter(|s| s.0 == rank)
                    .map(|s| s.1)
                    .sum();
                self.costs.l2_seconds(rows, local, r.unit_blocks[b])
            }
        };
        match self.config.jitter_seed {
            Some(seed) => base * jitter(seed, rank, task),
            None => base,
        }
    }

    fn run(&mut self) -> std::result::Result<(), SimFault> {
        let start = self.costs.model.barrier_s; // the count exchange
        for rank in 0..self.ranks.len() {
            for sm in 0..self.config.sms {
                self.push(start, rank, EventKind::SmFree { sm });
            }
        }
        while let Some(ev) = self.events.pop() {
            self.now = ev.t;
            match ev.kind {
                EventKind::SmFree { sm } => self.next_task(ev.rank, sm)?,
                EventKind::TaskDone { sm, task } => self.task_done(ev.rank, sm, task)?,
                EventKind::PullDone { block } => {
                    let r = &mut self.ranks[ev.rank];
                    r.arrived[block] = true;
                    let waiters = std::mem::take(&mut r.wait_arrival[block]);
                    for (sm, task) in waiters {
                        self.schedule_done(ev.rank, sm, task, self.now);
                    }
                }
            }
        }
        for (rank, r) in self.ranks.iter().enumerate() {
            if r.tasks_left > 0 {
                return Err(SimFault::Deadlock {
                    rank,
                    time_s: self.now,
                    tasks_left: r.tasks_left,
                    waiting: self.describe_waits(rank),
                });
            }
        }
        Ok(())
    }

    fn describe_waits(&self, rank: usize) -> String {
        let r = &self.ranks[rank];
        let mut parts = Vec::new();
        let empty: Vec<String> = (0..r.wait_empty.len())
            .filter(|&b| !r.wait_empty[b].is_empty())
            .map(|b| format!("{} SMs wait for block {b} to empty", r.wait_empty[b].len()))
            .collect();
        parts.extend(empty);
        let arrival: usize = r.wait_arrival.iter().map(Vec::len).sum();
        if arrival > 0 {
            parts.push(format!(
                "{arrival} L1 tasks wait for pulls (next pull: block {})",
                r.next_pull
            ));
        }
        let full: usize = r.wait_full.iter().map(Vec::len).sum();
        if full > 0 {
            parts.push(format!("{full} L2 tasks wait for full slots"));
        }
        parts.push(format!(
            "next task {} of {}",
            r.next_task,
            r.stream.tasks.len()
        ));
        parts.join("; ")
    }

    fn schedule_done(&mut self, rank: usize, sm: usize, task: usize, start: f64) {
        let end = start + self.task_seconds(rank, task);
        self.push(end, rank, EventKind::TaskDone { sm, task });
    }

    /// SM `sm` of `rank` is free: hand it the next task of the stream.
    fn next_task(&mut self, rank: usize, sm: usize) -> std::result::Result<(), SimFault> {
        let r = &mut self.ranks[rank];
        if r.next_task == r.stream.tasks.len() {
            return Ok(());
        }
        let task = r.next_task;
        r.next_task += 1;
        let t = r.stream.tasks[task];
        let b = t.block as usize;
        r.owed_pulls[sm] = 0;
        match t.kind {
            TaskKind::L1 if !r.l1_handed[b] => {
                r.l1_handed[b] = true;
                let limit = b
                    .saturating_add(r.stream.params.pull_ahead)
                    .saturating_add(1);
                r.owed_pulls[sm] = limit.min(r.stream.blocks.len());
            }
            TaskKind::L1 => {}
            TaskKind::L2 => r.l2_unhanded[b] -= 1,
        }
        r.pending[sm] = Some(task);
        self.resume(rank, sm)
    }

    /// Issues the pulls this SM owes, then starts its pending task; or parks it on a slot.
    fn resume(&mut self, rank: usize, sm: usize) -> std::result::Result<(), SimFault> {
        while self.ranks[rank].next_pull < self.ranks[rank].owed_pulls[sm] {
            let r = &mut self.ranks[rank];
            let b = r.next_pull;
            let block = r.stream.blocks[b];
            if let Some(w) = block.waits_for {
                if r.l2_left[w] > 0 {
                    if r.l2_unhanded[w] > 0 {
                        return Err(SimFault::WaitOnLaterWork {
                            rank,
                            block: b,
                            waits_for: w,
                        });
                    }
                    r.wait_empty[w].push(sm);
                    return Ok(());
                }
            }
            if let Some(live) = r.slot_holder[block.slot] {
                return Err(SimFault::SlotOverwritten {
                    rank,
                    slot: block.slot,
                    live_block: live,
                    new_block: b,
                    time_s: self.now,
                });
            }
            r.slot_holder[block.slot] = Some(b);
            r.live += 1;
            r.peak_live = r.peak_live.max(r.live);
            r.next_pull += 1;
            self.pull(rank, b);
        }
        let task = self.ranks[rank].pending[sm]
            .take()
            .expect("a resumed SM has a task");
        self.start_task(rank, sm, task);
        Ok(())
    }

    /// Issues the pull of block `b` of `rank` now.
    fn pull(&mut self, rank: usize, b: usize) {
        let per_row = self.costs.pull_bytes_per_row();
        let mut end = self.now;
        for i in 0..self.ranks[rank].sources[b].len() {
            let (src, rows) = self.ranks[rank].sources[b][i];
            let chunk_end = if src == rank {
                self.now + self.costs.local_pull_seconds(rows)
            } else {
                self.transfer(src, rank, rows as f64 * per_row, self.now)
            };
            end = end.max(chunk_end);
        }
        self.push(end, rank, EventKind::PullDone { block: b });
    }

    fn start_task(&mut self, rank: usize, sm: usize, task: usize) {
        let now = self.now;
        let r = &mut self.ranks[rank];
        let t = r.stream.tasks[task];
        let b = t.block as usize;
        match t.kind {
            TaskKind::L1 if !r.arrived[b] => r.wait_arrival[b].push((sm, task)),
            TaskKind::L2 if r.stream.params.kernel_boundary && !r.l1_all_done => {
                r.wait_boundary.push((sm, task))
            }
            TaskKind::L2 if r.l1_left[b] > 0 => r.wait_full[b].push((sm, task)),
            _ => self.schedule_done(rank, sm, task, now),
        }
    }

    fn task_done(
        &mut self,
        rank: usize,
        sm: usize,
        task: usize,
    ) -> std::result::Result<(), SimFault> {
        let now = self.now;
        let t = self.ranks[rank].stream.tasks[task];
        let b = t.block as usize;
        match t.kind {
            TaskKind::L1 => {
                let r = &mut self.ranks[rank];
                r.l1_left[b] -= 1;
                r.l1_total_left -= 1;
                if r.l1_left[b] == 0 {
                    for (sm2, task2) in std::mem::take(&mut r.wait_full[b]) {
                        self.schedule_done(rank, sm2, task2, now);
                    }
                }
                let r = &mut self.ranks[rank];
                if r.l1_total_left == 0 {
                    r.l1_all_done = true;
                    let start = now + self.costs.model.kernel_boundary_s;
                    for (sm2, task2) in std::mem::take(&mut r.wait_boundary) {
                        self.schedule_done(rank, sm2, task2, start);
                    }
                }
            }
            TaskKind::L2 => {
                let bytes_per_row = self.costs.scatter_bytes_per_row();
                let mut scatter_end = now;
                for i in 0..self.ranks[rank].sources[b].len() {
                    let (dst, rows) = self.ranks[rank].sources[b][i];
                    if dst != rank {
                        scatter_end = scatter_end.max(self.transfer(
                            rank,
                            dst,
                            rows as f64 * bytes_per_row,
                            now,
                        ));
                    }
                }
                let r = &mut self.ranks[rank];
                r.work_done = r.work_done.max(scatter_end);
                r.l2_left[b] -= 1;
                if r.l2_left[b] == 0 {
                    let slot = r.stream.blocks[b].slot;
                    if r.slot_holder[slot] == Some(b) {
                        r.slot_holder[slot] = None;
                    }
                    r.live -= 1;
                    for sm2 in std::mem::take(&mut r.wait_empty[b]) {
                        self.resume(rank, sm2)?;
                    }
                }
            }
        }
        let r = &mut self.ranks[rank];
        r.tasks_left -= 1;
        r.work_done = r.work_done.max(now);
        self.next_task(rank, sm)
    }

    fn report(&self) -> SimReport {
        let start = self.costs.model.barrier_s;
        let work_end = self.ranks.iter().map(|r| r.work_done).fold(start, f64::max);
        let barrier = work_end + self.costs.model.barrier_s;
        let combine = (0..self.ranks.len())
            .map(|r| {
                self.costs
                    .combine_seconds(self.loads.tokens[r], self.loads.valid_slots(r))
            })
            .fold(0.0, f64::max);
        SimReport {
            time_s: barrier + combine,
            ranks: self
                .ranks
                .iter()
                .map(|r| RankReport {
                    blocks: r.stream.blocks.len(),
                    tasks: r.stream.tasks.len(),
                    ring_slots: r.stream.params.ring_slots,
                    peak_live_slots: r.peak_live,
                    work_done_s: r.work_done,
                })
                .collect(),
        }
    }
}
