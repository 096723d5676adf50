//! The dispatch/combine benchmark with fused permute, SPEC §8 method: CUDA events around every
//! call, warm-up, median of ≥ 20 calls per observation, arms interleaved A B / B A / A B in one
//! process; per call the slowest rank counts.

use std::error::Error;

use megamoe_core::floor::floor_seconds;
use megamoe_core::permute::{plan_permute, PermuteHandle, SyncMode as PlanMode};
use megamoe_core::preset::Shape;
use megamoe_core::routing::generate_world;

use crate::baseline::NcclBaseline;
use crate::error::EpError;
use crate::layout::{BufferSpec, RowDtype};
use crate::params::CombineOrder;
use crate::selftest::Routing;
use crate::world::{EpConfig, EpWorld, Handle, Rows, SyncMode};

/// What is benchmarked: the layer's shape, the world and the routing.
#[derive(Clone, Debug)]
pub struct BenchSetup {
    pub shape: Shape,
    pub ranks: usize,
    /// Tokens per rank.
    pub tokens: usize,
    pub dtype: RowDtype,
    pub pad_multiple: usize,
    pub routing: Routing,
    /// The combine orders measured (each a combine arm and a dispatch-backward arm).
    pub combine_orders: Vec<CombineOrder>,
}

/// The world with its inputs uploaded, the NCCL baseline, and the bytes every arm moves.
pub struct DispatchBench {
    pub setup: BenchSetup,
    /// The NCCL baseline, or why it could not be set up. Declared before the world, so that it
    /// is dropped first.
    pub baseline: Result<NcclBaseline, EpError>,
    pub world: EpWorld,
    /// Whether the baseline's output equals dispatch_with_permute's, checked once when the
    /// baseline runs.
    pub baseline_identical: Option<bool>,
    tokens: Vec<usize>,
    idx: Vec<Vec<i32>>,
    /// Bytes moved with the dispatch's rows (scales included), and with bf16 rows (combine
    /// backward's dispatch).
    rows: Traffic,
    bf16_rows: Traffic,
}

/// What one arm calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Call {
    Dispatch,
    Combine(CombineOrder),
    CombineBackward,
    DispatchBackward(CombineOrder),
    DispatchAlone,
    Nccl { permute: bool },
}

/// Times of one arm at one SM count.
#[derive(Clone, Debug)]
pub struct ArmTimes {
    pub name: String,
    call: Call,
    pub nvlink_bytes: f64,
    pub hbm_bytes: f64,
    /// Per-round medians, µs.
    pub rounds: Vec<f64>,
}

impl ArmTimes {
    /// The per-round medians, sorted.
    pub fn sorted_rounds(&self) -> Vec<f64> {
        let mut r = self.rounds.clone();
        r.sort_by(f64::total_cmp);
        r
    }

    /// Median of the per-round medians, µs.
    pub fn median_us(&self) -> f64 {
        let r = self.sorted_rounds();
        r[r.len() / 2]
    }

    /// The floor (SPEC §8) of the arm's bytes, µs.
    pub fn floor_us(&self) -> f64 {
        floor_seconds(0.0, self.hbm_bytes, self.nvlink_bytes) * 1e6
    }
}

/// One arm's time over another's, per round.
#[derive(Clone, Debug)]
pub struct Ratio {
    pub name: String,
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

/// The arms of one SM count, in the order they are listed, and the ratios between them.
pub struct Measurement {
    pub arms: Vec<ArmTimes>,
    pub ratios: Vec<Ratio>,
}

impl DispatchBench {
    /// Builds the world, generates and uploads the inputs, and sets up the NCCL baseline.
    pub fn new(setup: BenchSetup) -> Result<DispatchBench, Box<dyn Error>> {
        let BenchSetup {
            shape,
            ranks,
            tokens: tokens_per_rank,
            dtype,
            pad_multiple,
            routing,
            ..
        } = setup.clone();
        let spec = BufferSpec::for_shape(ranks, &shape, tokens_per_rank, pad_multiple);
        let world = EpWorld::new(EpConfig::new(spec, dtype))?;
        let generated = generate_world(spec.shape(), ranks, tokens_per_rank, &routing.spec(1))?;
        let tokens: Vec<usize> = generated.ranks.iter().map(|r| r.tokens).collect();
        let idx: Vec<Vec<i32>> = generated.ranks.into_iter().map(|r| r.topk_idx).collect();
        let plan = plan_permute(spec.shape(), &idx, pad_multiple, PlanMode::Blocking)?;
        let rb = dtype.row_bytes(shape.hidden) + dtype.scales_per_row(shape.hidden) * 4;
        let probs = vec![0.5f32; tokens_per_rank * shape.topk];
        for r in 0..ranks {
            let rows = vec![0x3cu8; tokens[r] * dtype.row_bytes(shape.hidden)];
            let rows_bf16 = vec![half::bf16::from_f32(0.5); tokens[r] * shape.hidden];
            let scales = vec![1f32; tokens[r] * dtype.scales_per_row(shape.hidden)];
            let x = match dtype {
                RowDtype::Bf16 => Rows::Bf16(&rows_bf16),
                RowDtype::Fp8 => Rows::Fp8 {
                    data: &rows,
                    scales: &scales,
                },
            };
            world.upload_inputs(r, tokens[r], x, &idx[r], &probs[..tokens[r] * shape.topk])?;
        }
        let rows = traffic(&plan, &idx, shape.hidden, rb);
        let bf16_rows = traffic(&plan, &idx, shape.hidden, shape.hidden * 2);

        // The baseline moves the same rows; checked once against our dispatch output (BF16
        // rows only carry no scales, so the two outputs must be identical there).
        let baseline = NcclBaseline::new(&world, &plan, &idx, dtype.row_bytes(shape.hidden));
        let mut baseline_identical = None;
        if let Ok(b) = &baseline {
            let mut handle = world.new_handle()?;
            world.dispatch_with_permute(&tokens, pad_multiple, SyncMode::Blocking, &mut handle)?;
            b.dispatch(&world, true)?;
            world.sync()?;
            let mut same = true;
            for r in 0..ranks {
                let mut ours =
                    vec![0u8; plan.plans[r].output_rows() * dtype.row_bytes(shape.hidden)];
                world
                    .buffer(r)
                    .download_into(world.layout.out_rows, &mut ours)?;
                same &= b.output(r)? == ours;
            }
            baseline_identical = Some(same);
        }
        Ok(DispatchBench {
            setup,
            baseline,
            world,
            baseline_identical,
            tokens,
            idx,
            rows,
            bf16_rows,
        })
    }

    /// Every arm on `sms` SMs per rank: three interleaved rounds of `iters` timed calls each.
    pub fn measure(&mut self, sms: usize, iters: usize) -> Result<Measurement, Box<dyn Error>> {
        let BenchSetup {
            ranks,
            dtype,
            pad_multiple,
            shape,
            ..
        } = self.setup;
        let (t, bf16) = (self.rows, self.bf16_rows);
        self.world.config.num_sms = sms;
        let mut handle = self.world.new_handle()?;
        self.world.dispatch_with_permute(
            &self.tokens,
            pad_multiple,
            SyncMode::Blocking,
            &mut handle,
        )?;
        let arm = |name: String, call, nvlink_bytes, hbm_bytes| ArmTimes {
            name,
            call,
            nvlink_bytes,
            hbm_bytes,
            rounds: vec![],
        };
        let mut arms = vec![arm(
            "dispatch_with_permute".into(),
            Call::Dispatch,
            t.dispatch_nvlink,
            t.dispatch_hbm,
        )];
        for &order in &self.setup.combine_orders {
            let (nvlink, hbm) = match order {
                CombineOrder::PerRank => (t.per_rank_nvlink, t.per_rank_hbm),
                _ => (t.combine_nvlink, t.combine_hbm),
            };
            arms.push(arm(
                format!("combine_with_unpermute {}", order.name()),
                Call::Combine(order),
                nvlink,
                hbm,
            ));
            arms.push(arm(
                format!("dispatch backward (combine {} + prob grads)", order.name()),
                Call::DispatchBackward(order),
                nvlink,
                hbm,
            ));
        }
        arms.push(arm(
            "combine backward (bf16 dispatch)".into(),
            Call::CombineBackward,
            bf16.dispatch_nvlink,
            bf16.dispatch_hbm,
        ));
        arms.push(arm(
            "dispatch alone (no permute)".into(),
            Call::DispatchAlone,
            t.dispatch_nvlink,
            t.unpermuted_hbm,
        ));
        let baseline = self.baseline.as_ref().ok();
        if let Some(b) = baseline {
            // Each slot's row crosses NVLink separately; HBM: the two permutes read and write
            // every slot row once each, the exchange writes them once more.
            let slot_rows: usize = self.idx.iter().flatten().filter(|&&e| e >= 0).count() / ranks;
            let hbm = (5 * slot_rows * dtype.row_bytes(shape.hidden)) as f64;
            arms.push(arm(
                "NCCL a2a-v + 2 permutes (Megatron path)".into(),
                Call::Nccl { permute: true },
                b.nvlink_bytes(),
                hbm,
            ));
            arms.push(arm(
                "NCCL a2a-v alone".into(),
                Call::Nccl { permute: false },
                b.nvlink_bytes(),
                0.0,
            ));
        }
        let n = arms.len();
        for round in 0..3 {
            for i in 0..n {
                let a = if round % 2 == 0 { i } else { n - 1 - i };
                let us = time_arm(
                    &self.world,
                    baseline,
                    arms[a].call,
                    &self.tokens,
                    pad_multiple,
                    &mut handle,
                    iters,
                )?;
                arms[a].rounds.push(us);
            }
        }
        let find = |call| arms.iter().position(|a| a.call == call);
        let ratio = |name: &str, a: usize, b: usize| {
            let mut q: Vec<f64> = arms[a]
                .rounds
                .iter()
                .zip(&arms[b].rounds)
                .map(|(x, y)| x / y)
                .collect();
            q.sort_by(f64::total_cmp);
            Ratio {
                name: name.into(),
                median: q[q.len() / 2],
                min: q[0],
                max: q[q.len() - 1],
            }
        };
        let dispatch = 0;
        let alone = find(Call::DispatchAlone).expect("always measured");
        let mut ratios = vec![ratio("fused permute / dispatch alone", dispatch, alone)];
        let exact = find(Call::Combine(CombineOrder::ExpertId));
        let per_rank = find(Call::Combine(CombineOrder::PerRank));
        if let (Some(exact), Some(per_rank)) = (exact, per_rank) {
            ratios.push(ratio("combine per_rank / exact", per_rank, exact));
        }
        if let Some(nccl) = find(Call::Nccl { permute: true }) {
            ratios.push(ratio("NCCL path / dispatch_with_permute", nccl, dispatch));
        }
        Ok(Measurement { arms, ratios })
    }
}

/// Per-GPU bytes of the slowest rank.
#[derive(Clone, Copy, Debug)]
struct Traffic {
    dispatch_nvlink: f64,
    dispatch_hbm: f64,
    combine_nvlink: f64,
    combine_hbm: f64,
    /// The per_rank combine: one row per (token, remote rank holding a copy) crosses NVLink; the
    /// owners read their copies and write one sum per (token, rank) with several copies.
    per_rank_nvlink: f64,
    per_rank_hbm: f64,
    /// HBM of the dispatch without permute.
    unpermuted_hbm: f64,
}

/// Dispatch pulls each remote token once per rank it goes to and writes every row (padding
/// included); the exact combine pulls every remote copy of its tokens' rows, the per_rank one
/// one row per remote rank holding copies (the owner reads its copies and writes their sum).
fn traffic(plan: &PermuteHandle, idx: &[Vec<i32>], hidden: usize, row_bytes: usize) -> Traffic {
    let (r, k) = (plan.num_ranks(), plan.topk);
    let el = plan.experts / r;
    let y_row = hidden * 2;
    // Copies of each token on each rank.
    let copies_on = |slots: &[i32], d: usize| {
        slots
            .iter()
            .filter(|&&e| e >= 0 && e as usize / el == d)
            .count()
    };
    let mut most = Traffic {
        dispatch_nvlink: 0.0,
        dispatch_hbm: 0.0,
        combine_nvlink: 0.0,
        combine_hbm: 0.0,
        per_rank_nvlink: 0.0,
        per_rank_hbm: 0.0,
        unpermuted_hbm: 0.0,
    };
    for d in 0..r {
        let (mut nvl, mut hbm, mut alone) =
            (0usize, plan.plans[d].output_rows() * row_bytes, 0usize);
        let (mut cnvl, mut chbm) = (0usize, plan.tokens[d] * y_row);
        let (mut pnvl, mut phbm) = (0usize, plan.tokens[d] * y_row);
        for (s, s_idx) in idx.iter().enumerate() {
            for slots in s_idx.chunks_exact(k).take(plan.tokens[s]) {
                let here = copies_on(slots, d);
                if here > 0 && s != d {
                    nvl += row_bytes;
                    alone += row_bytes;
                } else if here > 0 {
                    hbm += row_bytes;
                    alone += 2 * row_bytes;
                }
                if here > 1 {
                    phbm += (here + 1) * y_row;
                }
            }
        }
        for slots in idx[d].chunks_exact(k).take(plan.tokens[d]) {
            for owner in 0..r {
                let c = copies_on(slots, owner);
                if owner == d {
                    chbm += c * y_row;
                    phbm += c.min(1) * y_row;
                } else {
                    cnvl += c * y_row;
                    pnvl += c.min(1) * y_row;
                }
            }
        }
        let max = |m: &mut f64, v: usize| *m = m.max(v as f64);
        max(&mut most.dispatch_nvlink, nvl);
        max(&mut most.dispatch_hbm, hbm);
        max(&mut most.combine_nvlink, cnvl);
        max(&mut most.combine_hbm, chbm);
        max(&mut most.per_rank_nvlink, pnvl);
        max(&mut most.per_rank_hbm, phbm);
        max(&mut most.unpermuted_hbm, alone);
    }
    most
}

/// Median over `iters` calls of the slowest rank's event time, µs.
fn time_arm(
    world: &EpWorld,
    baseline: Option<&NcclBaseline>,
    arm: Call,
    tokens: &[usize],
    pad: usize,
    handle: &mut Handle,
    iters: usize,
) -> Result<f64, Box<dyn Error>> {
    let ranks = world.ranks();
    let bound = SyncMode::NonBlocking {
        row_bound: world.config.spec.max_rows(),
    };
    let call = |h: &mut Handle| -> Result<(), EpError> {
        match arm {
            Call::Dispatch => world
                .dispatch_with_permute(tokens, pad, bound, h)
                .map(|_| ()),
            Call::Combine(order) => world.combine_with_unpermute(h, order, bound),
            Call::CombineBackward => world.combine_backward(h, bound),
            Call::DispatchBackward(order) => world.dispatch_backward(h, order, bound),
            Call::DispatchAlone => world.dispatch_without_permute(tokens, pad, h),
            Call::Nccl { permute } => baseline.expect("baseline arm").dispatch(world, permute),
        }
    };
    for _ in 0..3 {
        call(handle)?;
    }
    let timers = (0..iters)
        .map(|_| {
            (0..ranks)
                .map(|r| world.rank(r).gpu.timer())
                .collect::<Result<Vec<_>, _>>()
        })
        .collect::<Result<Vec<_>, _>>()?;
    for call_timers in &timers {
        for t in call_timers {
            t.start()?;
        }
        call(handle)?;
        for t in call_timers {
            t.stop()?;
        }
    }
    world.sync()?;
    let mut per_call = timers
        .iter()
        .map(|call_timers| {
            call_timers
                .iter()
                .map(|t| t.elapsed_ms().map(|ms| ms as f64 * 1e3))
                .try_fold(0f64, |m, t| t.map(|t| m.max(t)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    per_call.sort_by(f64::total_cmp);
    Ok(per_call[per_call.len() / 2])
}
