//! The planner's streams run in the multi-rank simulator: under uniform, Zipf-skewed, masked and
//! uneven-per-rank routings no slot is reused while live, nothing deadlocks, and the live slots
//! stay within the ring; deliberately broken plans are caught.
//!
//! `cargo test --release -p megamoe-core --test simulator -- --ignored` regenerates
//! docs/SIMULATOR.md.

use megamoe_core::plan::rules::{self, ring_slots, Order};
use megamoe_core::plan::{CallPlan, Kernel, Loads, PlanFault, Stream, StreamParams, TaskKind};
use megamoe_core::quant::default_group;
use megamoe_core::rng::SplitMix64;
use megamoe_core::sim::{self, SimConfig, SimFault, TaskCosts, TimeModel};
use megamoe_core::{Preset, Shape};
use proptest::prelude::*;

#[derive(Clone, Copy, Debug)]
enum Popularity {
    Uniform,
    /// Expert weights ∝ 1/(1 + rank)^s over a seeded order of the experts.
    Zipf(f64),
}

/// Routed rows per (source rank, expert): every token names `topk` distinct experts drawn by
/// popularity; each slot is masked with probability `masked`.
fn route(
    seed: u64,
    experts: usize,
    topk: usize,
    tokens: &[usize],
    popularity: Popularity,
    masked: f64,
) -> Loads {
    let mut rng = SplitMix64::new(seed);
    let mut order: Vec<usize> = (0..experts).collect();
    for i in (1..experts).rev() {
        order.swap(i, rng.below(i + 1));
    }
    // 1/weight of each expert: ∝ (1 + rank)^s.
    let inv_weight: Vec<f64> = match popularity {
        Popularity::Uniform => vec![1.0; experts],
        Popularity::Zipf(s) => {
            let mut w = vec![0.0; experts];
            for (rank, &e) in order.iter().enumerate() {
                w[e] = (1.0 + rank as f64).powf(s);
            }
            w
        }
    };
    let mut counts = vec![0; tokens.len() * experts];
    let mut keys: Vec<(f64, usize)> = Vec::with_capacity(experts);
    for (src, &t) in tokens.iter().enumerate() {
        for _ in 0..t {
            // Weighted sampling without replacement (Efraimidis–Spirakis): the top-k keys
            // u^(1/w), compared as ln(u)/w.
            keys.clear();
            keys.extend(
                (0..experts).map(|e| (rng.unit().max(f64::MIN_POSITIVE).ln() * inv_weight[e], e)),
            );
            keys.select_nth_unstable_by(topk - 1, |a, b| b.0.total_cmp(&a.0));
            for &(_, e) in &keys[..topk] {
                if rng.unit() >= masked {
                    counts[src * experts + e] += 1;
                }
            }
        }
    }
    Loads::new(experts, tokens.to_vec(), counts).unwrap()
}

/// Tokens per rank: all equal to `bound`, or uneven in [0, bound] with one rank at the bound.
fn tokens_per_rank(seed: u64, ranks: usize, bound: usize, uneven: bool) -> Vec<usize> {
    let mut rng = SplitMix64::new(seed ^ 0x5eed);
    let mut t: Vec<usize> = (0..ranks)
        .map(|_| if uneven { rng.below(bound + 1) } else { bound })
        .collect();
    t[rng.below(ranks)] = bound;
    t
}

fn costs_for(plan: &CallPlan) -> TaskCosts {
    TaskCosts {
        shape: plan.shape,
        tile: plan.tile,
        gran: plan.gran,
        model: TimeModel::H200,
    }
}

fn tiny() -> Shape {
    Preset::by_name("tiny").unwrap().shape
}

fn popularity(kind: u8) -> Popularity {
    match kind {
        0 => Popularity::Uniform,
        1 => Popularity::Zipf(1.0),
        _ => Popularity::Zipf(2.0),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// The real rules on the tiny preset: the plan of every rank verifies and runs.
    #[test]
    fn planned_calls_never_reuse_a_live_slot_or_deadlock(
        seed in any::<u64>(),
        ranks in prop::sample::select(vec![1usize, 2, 4, 8]),
        t_max in prop::sample::select(vec![256usize, 1024, 1536, 2048, 4096]),
        bound_frac in 0.0f64..=1.0,
        uneven in any::<bool>(),
        pop in 0u8..3,
        masked in prop::sample::select(vec![0.0f64, 0.3, 0.9]),
        sms in 1usize..=12,
        jitter in any::<bool>(),
    ) {
        let shape = tiny();
        let bound = ((t_max as f64 * bound_frac) as usize).max(1);
        let tokens = tokens_per_rank(seed, ranks, bound, uneven);
        let bound = rules::validate_bound(&tokens, &vec![Some(bound); ranks], t_max).unwrap();
        let loads = route(seed, shape.experts, shape.topk, &tokens, popularity(pop), masked);
        let plan = CallPlan::new(&shape, ranks, t_max, default_group(&shape), bound).unwrap();
        let config = SimConfig { sms, jitter_seed: jitter.then_some(seed) };
        for kernel in [Kernel::Fused, Kernel::Split] {
            let streams = plan.streams(kernel, &loads).unwrap();
            for s in &streams {
                let check = s.verify().map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert!(check.peak_live_slots <= s.params.ring_slots);
            }
            let report = sim::simulate(&streams, &loads, &costs_for(&plan), &config)
                .map_err(|e| TestCaseError::fail(format!("{kernel:?}: {e}")))?;
            for (r, s) in report.ranks.iter().zip(&streams) {
                prop_assert!(r.peak_live_slots <= s.params.ring_slots);
                if let Order::Lagged { lag_units } = s.params.order {
                    prop_assert!(r.peak_live_slots <= ring_slots(lag_units));
                }
            }
            prop_assert!(report.time_s.is_finite() && report.time_s > 0.0);
        }
    }

    /// Streams with any lag, block size and tile count, on the rule's ring: every wrap is
    /// guarded and runs; the live slots reach at most the ring.
    #[test]
    fn any_lag_on_its_rule_ring_is_safe(
        seed in any::<u64>(),
        ranks in 1usize..=4,
        local in 1usize..=6,
        lag in 0usize..=12,
        block_m in prop::sample::select(vec![4usize, 8, 16]),
        n1 in 1usize..=3,
        n2 in 1usize..=3,
        tokens in 1usize..=160,
        pop in 0u8..3,
        sms in 1usize..=8,
    ) {
        let experts = ranks * local;
        let topk = 1 + (seed as usize % local.min(4));
        let loads = route(seed, experts, topk, &vec![tokens; ranks], popularity(pop), 0.1);
        let params = StreamParams::fused(Order::Lagged { lag_units: lag }, block_m, n1, n2, ring_slots(lag));
        let streams: Vec<Stream> = (0..ranks).map(|r| Stream::build(params, &loads.expert_rows(r))).collect();
        for s in &streams {
            s.verify().map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
        let shape = Shape { hidden: 256, inter: 128, experts, topk };
        let plan = CallPlan::new(&shape, ranks, 1024, 64, 1).unwrap();
        let config = SimConfig { sms, jitter_seed: Some(seed) };
        let report = sim::simulate(&streams, &loads, &costs_for(&plan), &config)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        for r in &report.ranks {
            prop_assert!(r.peak_live_slots <= ring_slots(lag));
        }
    }
}

#[test]
fn the_planned_ring_wraps_and_every_reuse_waits() {
    let shape = tiny();
    let loads = route(
        3,
        shape.experts,
        shape.topk,
        &[4096],
        Popularity::Uniform,
        0.0,
    );
    let plan = CallPlan::new(&shape, 1, 4096, 64, 4096).unwrap();
    // The rule's lag 8 lowered to 6, which leaves the 100-slot ring its two units of slack.
    assert_eq!(plan.order.order, Order::Lagged { lag_units: 6 });
    let streams = plan.streams(Kernel::Fused, &loads).unwrap();
    let s = &streams[0];
    assert!(
        s.blocks.len() > s.params.ring_slots,
        "{} blocks",
        s.blocks.len()
    );
    assert!(s.blocks.iter().filter(|b| b.waits_for.is_some()).count() > 20);
    assert!(s.verify().unwrap().peak_live_slots <= s.params.ring_slots);
    for sms in [1, 7, 132] {
        let report = sim::simulate(
            &streams,
            &loads,
            &costs_for(&plan),
            &SimConfig {
                sms,
                jitter_seed: Some(9),
            },
        )
        .unwrap();
        assert!(report.ranks[0].peak_live_slots <= s.params.ring_slots);
    }
}

#[test]
fn a_call_without_tokens_plans_and_runs_nothing() {
    let shape = Preset::by_name("flash").unwrap().shape;
    let loads = Loads::new(shape.experts, vec![0; 8], vec![0; 8 * shape.experts]).unwrap();
    let plan = CallPlan::new(&shape, 8, 8192, 128, 0).unwrap();
    assert_eq!(plan.order.order, Order::SingleWave);
    let p = sim::predict(&plan, &loads, &TimeModel::H200).unwrap();
    assert!(p.fused.ranks.iter().all(|r| r.tasks == 0));
    // The count exchange and the final barrier, nothing else.
    assert!((p.fused.time_s - 2.0 * TimeModel::H200.barrier_s).abs() < 1e-12);
}

/// 40 full units on one rank: the ring bound is tight there.
fn full_unit_loads(block_m: usize) -> Loads {
    let rows: Vec<usize> = [3, 4, 3, 2, 5, 3, 4, 2, 3, 4, 3, 4]
        .iter()
        .map(|u| u * 8 * block_m)
        .collect();
    Loads::new(rows.len(), vec![*rows.iter().max().unwrap()], rows).unwrap()
}

/// The one-rank plan of the 12 experts `full_unit_loads` fills (task costs only).
fn full_unit_plan() -> CallPlan {
    let shape = Shape {
        hidden: 256,
        inter: 128,
        experts: 12,
        topk: 1,
    };
    CallPlan::new(&shape, 1, 1024, 64, 1).unwrap()
}

/// Runs the broken stream `params` through the verifier and the simulator; both must see a
/// wait on later work.
fn assert_later_wait_is_caught(params: StreamParams, sms: usize) {
    let loads = full_unit_loads(params.block_m);
    let streams = vec![Stream::build(params, &loads.expert_rows(0))];
    let plan = full_unit_plan();
    let config = SimConfig {
        sms,
        jitter_seed: None,
    };
    let plan_fault = streams[0].verify().unwrap_err();
    let sim_fault = sim::simulate(&streams, &loads, &costs_for(&plan), &config).unwrap_err();
    assert!(
        matches!(plan_fault, PlanFault::WaitOnLaterTask { .. }),
        "{plan_fault}"
    );
    assert!(
        matches!(sim_fault, SimFault::WaitOnLaterWork { .. }),
        "{sim_fault}"
    );
}

#[test]
fn a_ring_one_slot_too_small_is_caught_by_the_verifier_and_the_simulator() {
    for lag in [0, 4, 8] {
        for sms in [1, 3, 132] {
            let params = StreamParams::fused(
                Order::Lagged { lag_units: lag },
                16,
                2,
                2,
                ring_slots(lag) - 1,
            );
            assert_later_wait_is_caught(params, sms);
        }
    }
}

#[test]
fn a_lag_larger_than_the_ring_allows_is_caught() {
    let params = StreamParams::fused(Order::Lagged { lag_units: 9 }, 16, 2, 2, ring_slots(8));
    assert_later_wait_is_caught(params, 8);
}

#[test]
fn an_l2_task_ahead_of_its_l1_deadlocks_one_sm() {
    let params = StreamParams::fused(Order::SingleWave, 16, 1, 1, 1000);
    let loads = full_unit_loads(16);
    let mut stream = Stream::build(params, &loads.expert_rows(0));
    // Move block 0's L2 task to the front.
    let l2 = stream
        .tasks
        .iter()
        .position(|t| t.kind == TaskKind::L2)
        .unwrap();
    let task = stream.tasks.remove(l2);
    stream.tasks.insert(0, task);
    assert!(matches!(
        stream.verify(),
        Err(PlanFault::L2BeforeL1 { block: 0, .. })
    ));
    let plan = full_unit_plan();
    let err = sim::simulate(
        &[stream],
        &loads,
        &costs_for(&plan),
        &SimConfig {
            sms: 1,
            jitter_seed: None,
        },
    )
    .unwrap_err();
    assert!(matches!(err, SimFault::Deadlock { rank: 0, .. }), "{err}");
}

#[test]
fn a_bound_below_a_peers_tokens_is_rejected_and_would_overwrite_a_live_slot() {
    let shape = tiny();
    let (ranks, t_max) = (4, 2048);
    let tokens = vec![128, 2048, 2048, 2048];
    let bounds = [Some(128), Some(2048), Some(2048), Some(2048)];
    let err = rules::validate_bound(&tokens, &bounds, t_max).unwrap_err();
    assert!(err.to_string().contains("rank 1"), "{err}");
    // Without the check: every token names rank 0's four experts; rank 0 plans for 128 tokens.
    let mut counts = vec![0; ranks * shape.experts];
    for (src, &t) in tokens.iter().enumerate() {
        for e in 0..4 {
            counts[src * shape.experts + e] = t;
        }
    }
    let loads = Loads::new(shape.experts, tokens, counts).unwrap();
    let gran = default_group(&shape);
    let streams: Vec<Stream> = (0..ranks)
        .map(|r| {
            let plan = CallPlan::new(&shape, ranks, t_max, gran, bounds[r].unwrap()).unwrap();
            plan.streams(Kernel::Fused, &loads).unwrap().swap_remove(r)
        })
        .collect();
    assert_eq!(streams[0].params.order, Order::SingleWave);
    assert!(matches!(
        streams[0].verify(),
        Err(PlanFault::UnguardedReuse { .. })
    ));
    let plan = CallPlan::new(&shape, ranks, t_max, gran, 128).unwrap();
    let err = sim::simulate(
        &streams,
        &loads,
        &costs_for(&plan),
        &SimConfig {
            sms: 16,
            jitter_seed: None,
        },
    )
    .unwrap_err();
    assert!(
        matches!(err, SimFault::SlotOverwritten { rank: 0, .. }),
        "{err}"
    );
}

#[test]
fn the_fused_kernel_is_predicted_faster_than_the_split_one_at_4096_tokens() {
    let shape = Preset::by_name("flash").unwrap().shape;
    let tokens = vec![4096; 8];
    let loads = route(
        7,
        shape.experts,
        shape.topk,
        &tokens,
        Popularity::Uniform,
        0.0,
    );
    let plan = CallPlan::new(&shape, 8, 8192, 128, 4096).unwrap();
    let p = sim::predict(&plan, &loads, &TimeModel::H200).unwrap();
    assert!(
        p.fused.time_s < p.split.time_s,
        "{} vs {}",
        p.fused.time_s,
        p.split.time_s
    );
    // Both above the compute floor of the rank's FLOPs.
    let floor = loads.valid_slots(0) as f64 * shape.flops_per_slot() / TimeModel::H200.fp8_flops;
    assert!(p.fused.time_s > floor);
}

/// The floor of SPEC §8 for one call: max over ranks of FLOPs at the FP8 peak, the weights of
/// its experts with rows at the HBM rate, and its NVLink bytes (pull in, scatter out).
fn floor_seconds(shape: &Shape, loads: &Loads, model: &TimeModel) -> f64 {
    let (h, i) = (shape.hidden as f64, shape.inter as f64);
    let local = loads.local_experts();
    (0..loads.ranks)
        .map(|r| {
            let rows = loads.expert_rows(r);
            let flops = rows.iter().sum::<usize>() as f64 * shape.flops_per_slot();
            let weights = rows.iter().filter(|&&n| n > 0).count() as f64 * 3.0 * h * i;
            let remote_in: usize = (0..loads.ranks)
                .filter(|&src| src != r)
                .map(|src| {
                    (0..local)
                        .map(|j| loads.rows(src, r * local + j))
                        .sum::<usize>()
                })
                .sum();
            let link = remote_in as f64 * h * 2.0; // bf16 rows back out; e4m3 rows in is half
            (flops / model.fp8_flops)
                .max(weights / model.hbm_bytes)
                .max(link / model.nvlink_bytes)
        })
        .fold(0.0, f64::max)
}

fn us(s: f64) -> String {
    format!("{:.0}", s * 1e6)
}

/// Regenerates docs/SIMULATOR.md (run in release: a few seconds).
#[test]
#[ignore]
fn simulator_report() {
    use std::fmt::Write;
    let model = TimeModel::H200;
    let (ranks, t_max) = (8, 8192);
    let mut md = String::new();
    writeln!(md, "# Simulator report\n").unwrap();
    writeln!(
        md,
        "Generated by `cargo test --release -p megamoe-core --test simulator -- --ignored`; do not edit by hand.\n\n\
         R = {ranks} ranks × {} SMs, buffers sized for {t_max} tokens per rank, default scale granularity, \
         FP8 {:.0} TFLOP/s, HBM {:.2} TB/s, NVLink {:.0} GB/s per direction (PEERS.md, \"Our machine\"), barrier {:.0} µs and \
         kernel boundary {:.0} µs (assumed). Routing: top-k drawn from uniform or Zipf(s = 1) expert popularity, \
         seed 1. Each cell is one simulated call; *peak* is the most slots live at once on any rank, *ring* the \
         call's ring capacity in m-blocks, *floor* SPEC §8's max(FLOPs, weight bytes, NVLink bytes) over ranks.\n",
        model.sms,
        model.fp8_flops / 1e12,
        model.hbm_bytes / 1e12,
        model.nvlink_bytes / 1e9,
        model.barrier_s * 1e6,
        model.kernel_boundary_s * 1e6
    )
    .unwrap();
    for preset in ["flash", "pro"] {
        let shape = Preset::by_name(preset).unwrap().shape;
        let gran = default_group(&shape);
        writeln!(
            md,
            "## {preset} (H {}, I {}, E {}, K {})\n",
            shape.hidden, shape.inter, shape.experts, shape.topk
        )
        .unwrap();
        writeln!(md, "| tokens/rank | routing | tile m×n | order | blocks/rank (max) | ring | peak live | floor µs | split µs | fused µs | fused/split |").unwrap();
        writeln!(md, "|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|").unwrap();
        for tokens in [1024, 2048, 4096, 8192] {
            for (name, pop) in [
                ("uniform", Popularity::Uniform),
                ("zipf", Popularity::Zipf(1.0)),
            ] {
                let loads = route(1, shape.experts, shape.topk, &vec![tokens; ranks], pop, 0.0);
                let plan = CallPlan::new(&shape, ranks, t_max, gran, tokens).unwrap();
                let p = sim::predict(&plan, &loads, &model).unwrap();
                let order = match plan.order.order {
                    Order::SingleWave => "single wave".to_string(),
                    Order::Lagged { lag_units } => format!("lag {lag_units}"),
                };
                let blocks = p.fused.ranks.iter().map(|r| r.blocks).max().unwrap();
                writeln!(
                    md,
                    "| {tokens} | {name} | {}×{} | {order} | {blocks} | {} | {} | {} | {} | {} | {:.3} |",
                    plan.tile.block_m,
                    plan.tile.block_n_l1,
                    plan.order.ring_slots,
                    p.fused.peak_live_slots(),
                    us(floor_seconds(&shape, &loads, &model)),
                    us(p.split.time_s),
                    us(p.fused.time_s),
                    p.fused.time_s / p.split.time_s
                )
                .unwrap();
            }
        }
        writeln!(md).unwrap();
    }
    writeln!(md, "## Lag sweep at 8192 tokens per rank (uniform)\n").unwrap();
    writeln!(
        md,
        "The fused stream with each lag on that lag's rule ring (8·(lag + 4) + 4 slots), against a single wave on \
         the full pool. *ring MiB* is the L1 input and output pools the ring needs.\n"
    )
    .unwrap();
    writeln!(
        md,
        "| preset | order | ring slots | peak live | ring MiB | fused µs |"
    )
    .unwrap();
    writeln!(md, "|---|---|---:|---:|---:|---:|").unwrap();
    for preset in ["flash", "pro"] {
        let shape = Preset::by_name(preset).unwrap().shape;
        let gran = default_group(&shape);
        let loads = route(
            1,
            shape.experts,
            shape.topk,
            &vec![8192; ranks],
            Popularity::Uniform,
            0.0,
        );
        let plan = CallPlan::new(&shape, ranks, t_max, gran, 8192).unwrap();
        let costs = TaskCosts {
            shape,
            tile: plan.tile,
            gran,
            model,
        };
        let row_bytes =
            (shape.hidden + shape.hidden / 32 + shape.inter + shape.inter * 4 / gran) as f64;
        let fused = plan.stream_params(Kernel::Fused);
        let full_pool = plan.ring.pool_rows / plan.tile.block_m;
        let mut orders: Vec<(String, StreamParams)> = [8, 14, 22, 29, 40, 64]
            .iter()
            .map(|&lag| {
                let order = Order::Lagged { lag_units: lag };
                (
                    format!("lag {lag}"),
                    StreamParams {
                        order,
                        ring_slots: ring_slots(lag),
                        ..fused
                    },
                )
            })
            .collect();
        orders.push((
            "single wave".into(),
            StreamParams::fused(
                Order::SingleWave,
                fused.block_m,
                fused.n_blocks_l1,
                fused.n_blocks_l2,
                full_pool,
            ),
        ));
        for (name, params) in orders {
            let streams: Vec<Stream> = (0..ranks)
                .map(|r| Stream::build(params, &loads.expert_rows(r)))
                .collect();
            let report = sim::simulate(
                &streams,
                &loads,
                &costs,
                &SimConfig {
                    sms: model.sms,
                    jitter_seed: None,
                },
            )
            .unwrap();
            let mib = (params.ring_slots * params.block_m) as f64 * row_bytes / (1u64 << 20) as f64;
            writeln!(
                md,
                "| {preset} | {name} | {} | {} | {mib:.0} | {} |",
                params.ring_slots,
                report.peak_live_slots(),
                us(report.time_s)
            )
            .unwrap();
        }
    }
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/SIMULATOR.md");
    std::fs::create_dir_all(std::path::Path::new(path).parent().unwrap()).unwrap();
    std::fs::write(path, &md).unwrap();
    println!("{md}");
}
