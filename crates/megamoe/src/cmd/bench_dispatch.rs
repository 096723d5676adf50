//! `megamoe bench dispatch`: dispatch/combine with fused permute on the H200 pair, SPEC §8 method
//! (CUDA events around every call, warm-up, median of ≥ 20 calls per observation, arms
//! interleaved A B / B A / A B in one process; per call the slowest rank counts).

use megamoe_core::floor::floor_seconds;
use megamoe_core::permute::{plan_permute, PermuteHandle, SyncMode as PlanMode};
use megamoe_core::routing::generate_world;
use megamoe_core::Preset;
use megamoe_ep::baseline::NcclBaseline;
use megamoe_ep::layout::{BufferSpec, RowDtype};
use megamoe_ep::selftest::Routing;
use megamoe_ep::{EpConfig, EpWorld, Handle, SyncMode};

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Model preset (SPEC §1).
    #[arg(long, default_value = "flash")]
    pub preset: String,
    /// Tokens per rank.
    #[arg(long, default_value_t = 4096)]
    pub tokens: usize,
    /// Row format of the dispatch: bf16 or fp8.
    #[arg(long, default_value = "bf16")]
    pub dtype: String,
    /// SMs per rank; several values (comma-separated) sweep.
    #[arg(long, value_delimiter = ',', default_values_t = vec![megamoe_ep::DEFAULT_NUM_SMS])]
    pub sms: Vec<usize>,
    /// Ranks (one per GPU when enough GPUs are present).
    #[arg(long, default_value_t = 2)]
    pub ranks: usize,
    #[arg(long, default_value_t = 128)]
    pub pad_multiple: usize,
    /// uniform, zipf, masked or uneven.
    #[arg(long, default_value = "uniform")]
    pub routing: String,
    /// Timed calls per observation.
    #[arg(long, default_value_t = 20)]
    pub iters: usize,
}

struct Arm {
    name: &'static str,
    nvlink_bytes: f64,
    hbm_bytes: f64,
    /// Per-round medians, µs.
    rounds: Vec<f64>,
}

pub fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let shape = Preset::by_name(&args.preset)?.shape;
    let dtype = match args.dtype.as_str() {
        "bf16" => RowDtype::Bf16,
        "fp8" => RowDtype::Fp8,
        other => return Err(format!("--dtype {other}: expected bf16 or fp8").into()),
    };
    let routing = Routing::ALL
        .into_iter()
        .find(|r| r.name() == args.routing)
        .ok_or_else(|| {
            format!(
                "--routing {}: expected uniform, zipf, masked or uneven",
                args.routing
            )
        })?;
    let spec = BufferSpec::for_shape(args.ranks, &shape, args.tokens, args.pad_multiple);
    let mut world = EpWorld::new(EpConfig::new(spec, dtype))?;
    println!(
        "bench dispatch: preset {} (H {} E {} K {}), {} ranks on {} GPU(s), {} tokens/rank, {:?}, {} routing, pad {}, symmetric buffer {:.0} MiB/rank",
        args.preset, shape.hidden, shape.experts, shape.topk, args.ranks, world.physical_gpus(), args.tokens, dtype,
        routing.name(), args.pad_multiple, world.layout.size as f64 / (1 << 20) as f64
    );

    let generated = generate_world(spec.shape(), args.ranks, args.tokens, &routing.spec(1))?;
    let tokens: Vec<usize> = generated.ranks.iter().map(|r| r.tokens).collect();
    let idx: Vec<Vec<i32>> = generated.ranks.into_iter().map(|r| r.topk_idx).collect();
    let plan = plan_permute(spec.shape(), &idx, args.pad_multiple, PlanMode::Blocking)?;
    let rb = dtype.row_bytes(shape.hidden) + dtype.scales_per_row(shape.hidden) * 4;
    let probs = vec![0.5f32; args.tokens * shape.topk];
    for r in 0..args.ranks {
        let rows = vec![0x3cu8; tokens[r] * dtype.row_bytes(shape.hidden)];
        let rows_bf16 = vec![half::bf16::from_f32(0.5); tokens[r] * shape.hidden];
        let scales = vec![1f32; tokens[r] * dtype.scales_per_row(shape.hidden)];
        let x = match dtype {
            RowDtype::Bf16 => megamoe_ep::Rows::Bf16(&rows_bf16),
            RowDtype::Fp8 => megamoe_ep::Rows::Fp8 {
                data: &rows,
                scales: &scales,
            },
        };
        world.upload_inputs(r, tokens[r], x, &idx[r], &probs[..tokens[r] * shape.topk])?;
    }
    let (d_nvl, d_hbm, c_nvl, c_hbm, a_hbm) = traffic(&plan, &idx, shape.hidden, rb);
    let (cb_nvl, cb_hbm, _, _, _) = traffic(&plan, &idx, shape.hidden, shape.hidden * 2);

    // The baseline moves the same rows; checked once against our dispatch output (BF16 rows only
    // carry no scales, so the two outputs must be identical there).
    let baseline = match NcclBaseline::new(&world, &plan, &idx, dtype.row_bytes(shape.hidden)) {
        Ok(b) => Some(b),
        Err(e) => {
            println!("NCCL baseline not run: {e}");
            None
        }
    };
    if let Some(b) = &baseline {
        let mut handle = world.new_handle()?;
        world.dispatch_with_permute(&tokens, args.pad_multiple, SyncMode::Blocking, &mut handle)?;
        b.dispatch(&world, true)?;
        world.sync()?;
        let mut same = true;
        for r in 0..args.ranks {
            let mut ours = vec![0u8; plan.plans[r].output_rows() * dtype.row_bytes(shape.hidden)];
            world
                .buffer(r)
                .download_into(world.layout.out_rows, &mut ours)?;
            same &= b.output(r)? == ours;
        }
        println!("NCCL baseline output identical to dispatch_with_permute: {same}");
    }
    println!("| SMs | arm | µs median | per-round min–max | NVLink MB/GPU | GB/s per GPU | floor µs | × floor |");
    println!("|---|---|---|---|---|---|---|---|");
    for &sms in &args.sms {
        world.config.num_sms = sms;
        let mut handle = world.new_handle()?;
        world.dispatch_with_permute(&tokens, args.pad_multiple, SyncMode::Blocking, &mut handle)?;
        let mut arms = vec![
            Arm {
                name: "dispatch_with_permute",
                nvlink_bytes: d_nvl,
                hbm_bytes: d_hbm,
                rounds: vec![],
            },
            Arm {
                name: "combine_with_unpermute",
                nvlink_bytes: c_nvl,
                hbm_bytes: c_hbm,
                rounds: vec![],
            },
            Arm {
                name: "combine backward (bf16 dispatch)",
                nvlink_bytes: cb_nvl,
                hbm_bytes: cb_hbm,
                rounds: vec![],
            },
            Arm {
                name: "dispatch backward (combine + prob grads)",
                nvlink_bytes: c_nvl,
                hbm_bytes: c_hbm,
                rounds: vec![],
            },
            Arm {
                name: "dispatch alone (no permute)",
                nvlink_bytes: d_nvl,
                hbm_bytes: a_hbm,
                rounds: vec![],
            },
        ];
        if let Some(b) = &baseline {
            // Each slot's row crosses NVLink separately; HBM: the two permutes read and write
            // every slot row once each, the exchange writes them once more.
            let slot_rows: usize = idx.iter().flatten().filter(|&&e| e >= 0).count() / args.ranks;
            let hbm = (5 * slot_rows * dtype.row_bytes(shape.hidden)) as f64;
            arms.push(Arm {
                name: "NCCL a2a-v + 2 permutes (Megatron path)",
                nvlink_bytes: b.nvlink_bytes(),
                hbm_bytes: hbm,
                rounds: vec![],
            });
            arms.push(Arm {
                name: "NCCL a2a-v alone",
                nvlink_bytes: b.nvlink_bytes(),
                hbm_bytes: 0.0,
                rounds: vec![],
            });
        }
        let n = arms.len();
        for round in 0..3 {
            for i in 0..n {
                let a = if round % 2 == 0 { i } else { n - 1 - i };
                let us = time_arm(
                    &world,
                    baseline.as_ref(),
                    a,
                    &tokens,
                    args.pad_multiple,
                    &mut handle,
                    args.iters,
                )?;
                arms[a].rounds.push(us);
            }
        }
        for arm in &arms {
            let mut r = arm.rounds.clone();
            r.sort_by(f64::total_cmp);
            let med = r[r.len() / 2];
            let floor = floor_seconds(0.0, arm.hbm_bytes, arm.nvlink_bytes) * 1e6;
            println!(
                "| {sms} | {} | {med:.1} | {:.1}–{:.1} | {:.1} | {:.0} | {floor:.1} | {:.2} |",
                arm.name,
                r[0],
                r[r.len() - 1],
                arm.nvlink_bytes / 1e6,
                arm.nvlink_bytes / (med * 1e3),
                med / floor
            );
        }
        let ratio = |a: usize, b: usize| {
            let mut q: Vec<f64> = arms[a]
                .rounds
                .iter()
                .zip(&arms[b].rounds)
                .map(|(x, y)| x / y)
                .collect();
            q.sort_by(f64::total_cmp);
            format!(
                "{:.2} (rounds {:.2}–{:.2})",
                q[q.len() / 2],
                q[0],
                q[q.len() - 1]
            )
        };
        println!(
            "| {sms} | fused permute / dispatch alone | {} | | | | | |",
            ratio(0, 4)
        );
        if arms.len() > 5 {
            println!(
                "| {sms} | NCCL path / dispatch_with_permute | {} | | | | | |",
                ratio(5, 0)
            );
        }
    }
    Ok(())
}

/// Per-GPU bytes of the slowest rank: (dispatch NVLink, dispatch HBM, combine NVLink, combine
/// HBM, unpermuted dispatch HBM). Dispatch pulls each remote token once per rank it goes to and
/// writes every row (padding included); combine pulls every remote copy of its tokens' rows.
fn traffic(
    plan: &PermuteHandle,
    idx: &[Vec<i32>],
    hidden: usize,
    row_bytes: usize,
) -> (f64, f64, f64, f64, f64) {
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
    (dn, dh, cn, ch, ah)
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
) -> Result<f64, Box<dyn std::error::Error>> {
    let ranks = world.ranks();
    let bound = SyncMode::NonBlocking {
        row_bound: world.config.spec.max_rows(),
    };
    let call = |h: &mut Handle| -> Result<(), megamoe_ep::EpError> {
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
