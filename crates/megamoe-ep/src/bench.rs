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
use crate::selftest::Routing;
use crate::world::{EpConfig, EpWorld, Handle, Rows, SyncMode};

/// What is benchmarked: the layer's shape, the world and the routing.
#[derive(Clone, Copy, Debug)]
pub struct BenchSetup {
    pub shape: Shape,
    pub ranks: usize,
    /// Tokens per rank.
    pub tokens: usize,
    pub dtype: RowDtype,
    pub pad_multiple: usize,
    pub routing: Routing,
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

/// Times of one arm at one SM count.
#[derive(Clone, Debug)]
pub struct ArmTimes {
    pub name: &'static str,
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
#[derive(Clone, Copy, Debug)]
pub struct Ratio {
    pub name: &'static str,
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
        } = setup;
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
        let arm = |name, nvlink_bytes, hbm_bytes| ArmTimes {
            name,
            nvlink_bytes,
            hbm_bytes,
            rounds: vec![],
        };
        let mut arms = vec![
            arm("dispatch_with_permute", t.dispatch_nvlink, t.dispatch_hbm),
            arm("combine_with_unpermute", t.combine_nvlink, t.combine_hbm),
            arm(
                "combine backward (bf16 dispatch)",
                bf16.dispatch_nvlink,
                bf16.dispatch_hbm,
            ),
            arm(
                "dispatch backward (combine + prob grads)",
                t.combine_nvlink,
                t.combine_hbm,
            ),
            arm(
                "dispatch alone (no permute)",
                t.dispatch_nvlink,
                t.unpermuted_hbm,
            ),
        ];
        let baseline = self.baseline.as_ref().ok();
        if let Some(b) = baseline {
            // Each slot's row crosses NVLink separately; HBM: the two permutes read and write
            // every slot row once each, the exchange writes them once more.
            let slot_rows: usize = self.idx.iter().flatten().filter(|&&e| e >= 0).count() / ranks;
            let hbm = (5 * slot_rows * dtype.row_bytes(shape.hidden)) as f64;
            arms.push(arm(
                "NCCL a2a-v + 2 permutes (Megatron path)",
                b.nvlink_bytes(),
                hbm,
            ));
            arms.push(arm("NCCL a2a-v alone", b.nvlink_bytes(), 0.0));
        }
        let n = arms.len();
        for round in 0..3 {
            for i in 0..n {
                let a = if round % 2 == 0 { i } else { n - 1 - i };
                let us = time_arm(
                    &self.world,
                    baseline,
                    a,
                    &self.tokens,
                    pad_multiple,
                    &mut handle,
                    iters,
                )?;
                arms[a].rounds.push(us);
            }
        }
        let ratio = |name, a: usize, b: usize| {
            let mut q: Vec<f64> = arms[a]
                .rounds
                .iter()
                .zip(&arms[b].rounds)
                .map(|(x, y)| x / y)
                .collect();
            q.sort_by(f64::total_cmp);
            Ratio {
                name,
                median: q[q.len() / 2],
                min: q[0],
                max: q[q.len() - 1],
            }
        };
        let mut ratios = vec![ratio("fused permute / dispatch alone", 0, 4)];
        if arms.len() > 5 {
            ratios.push(ratio("NCCL path / dispatch_with_permute", 5, 0));
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
    /// HBM of the dispatch without permute.
    unpermuted_hbm: f64,
}

/// Dispatch pulls each remote token once per rank it goes to and writes every row (padding
/// included); combine pulls every remote copy of its tokens' rows.
fn traffic(plan: &PermuteHandle, idx: &[Vec<i32>], hidden: usize, row_bytes: usize) -> Traffic {
    let (r, k) = (plan.num_ranks(), plan.topk);
    let el = plan.experts / r;
    let (mut dn, mut dh, mut cn, mut ch, mut ah) = (0f64, 0f64, 0f64, 0f64, 0f64);
    for d in 0..r {
        let (mut nvl, mut hbm, mut alone) =
            (0usize, plan.plans[d].output_rows() * row_bytes, 0usize);
        let (mut cnvl, mut chbm) = (0usize, plan.tokens[d] * hidden * 2);
        for (s, s_idx) in idx.iter().enumerate() {
            for slots in s_idx.chunks_exact(k).take(plan.tokens[s]) {
                let here = slots.iter().any(|&e| e >= 0 && e as usize / el == d);
                if here && s != d {
                    nvl += row_bytes;
                    alone += row_bytes;
                } else if here {
                    hbm += row_bytes;
                    alone += 2 * row_bytes;
                }
            }
        }
        for t in 0..plan.tokens[d] {
            for &e in &idx[d][t * k..(t + 1) * k] {
                if e < 0 {
                    continue;
                }
                if e as usize / el == d {
                    chbm += hidden * 2;
                } else {
                    cnvl += hidden * 2;
                }
            }
        }
        dn = dn.max(nvl as f64);
        dh = dh.max(hbm as f64);
        cn = cn.max(cnvl as f64);
        ch = ch.max(chbm as f64);
        ah = ah.max(alone as f64);
    }
    Traffic {
        dispatch_nvlink: dn,
        dispatch_hbm: dh,
        combine_nvlink: cn,
        combine_hbm: ch,
        unpermuted_hbm: ah,
    }
}

/// Median over `iters` calls of the slowest rank's event time, µs.
fn time_arm(
    world: &EpWorld,
    baseline: Option<&NcclBaseline>,
    arm: usize,
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
            0 => world
                .dispatch_with_permute(tokens, pad, bound, h)
                .map(|_| ()),
            1 => world.combine_with_unpermute(h, false, bound),
            2 => world.combine_backward(h, bound),
            3 => world.dispatch_backward(h, bound),
            4 => world.dispatch_without_permute(tokens, pad, h),
            5 => baseline.expect("baseline arm").dispatch(world, true),
            _ => baseline.expect("baseline arm").dispatch(world, false),
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
