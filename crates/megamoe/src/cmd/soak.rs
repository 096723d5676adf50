//! `megamoe soak`: forward calls of both layer kinds, one after the other, on random shapes,
//! token counts (T = 0 ranks included), routings (uniform, Zipf, masked up to every slot) and
//! bounds, every output checked: the fused layer's bits against the split layer's on every call,
//! both against the CPU reference on every n-th round, every all-masked token exactly 0; every
//! third round dispatch and combine alone (forward and backward, bit for bit against
//! megamoe-core's reference). Device
//! memory (cuMemGetInfo) and host RSS are sampled once every layer has run and at every tenth of
//! the soak: neither may grow over its second half.

use std::time::{Duration, Instant};

use half::bf16;
use megamoe_core::preset::Shape;
use megamoe_core::rng::SplitMix64;
use megamoe_core::routing::{soak_batch, soak_setups};
use megamoe_core::{diff, fused_layer, LayerOptions, WeightGen, WorldInputs};
use megamoe_cuda::Gpu;
use megamoe_ep::selftest::{round_trip, small, Routing, SMALL_TOKENS};
use megamoe_ep::{EpConfig, EpWorld, RowDtype};
use megamoe_layer::inputs::bf16_inputs;
use megamoe_layer::selftest::MAX_DIFF;
use megamoe_layer::{Kind, LayerSpec, MoeLayer};

use crate::args;
use crate::progress::Progress;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[arg(long, default_value_t = 2000, value_parser = args::count(&args::CALLS),
          allow_hyphen_values = true,
          help = args::help("Stop after this many forward calls (both kinds counted)", &args::CALLS))]
    pub calls: usize,
    #[arg(long, default_value_t = 300, value_parser = args::count(&args::SECONDS),
          allow_hyphen_values = true,
          help = args::help("Stop after this many seconds, whichever comes first", &args::SECONDS))]
    pub seconds: usize,
    #[arg(long, default_value_t = 4, value_parser = args::count(&args::REFERENCE_EVERY),
          allow_hyphen_values = true,
          help = args::help(
              "Check both kinds against the CPU reference every n-th round (1: every round)",
              &args::REFERENCE_EVERY))]
    pub reference_every: usize,
    /// Seed of the weights and of every random choice (any u64).
    #[arg(long, default_value_t = 0, value_parser = args::seed, allow_hyphen_values = true)]
    pub seed: u64,
}

/// Growth of device or host memory over the soak's second half above which it fails (the
/// first half is the allocators' warm-up: the host's grows its per-thread arenas there).
const MAX_GROWTH_BYTES: i64 = 16 << 20;

/// One layer configuration of the soak: both kinds built on the same weights.
struct Setup {
    name: String,
    spec: LayerSpec,
    gen: WeightGen,
    split: MoeLayer,
    fused: MoeLayer,
}

impl Setup {
    fn new(
        name: &str,
        shape: Shape,
        ranks: usize,
        max_tokens: usize,
        seed: u64,
    ) -> Result<Setup, String> {
        let spec = LayerSpec::new(shape, ranks, max_tokens);
        let gen = WeightGen::new(shape, seed);
        let (split, fused) = Setup::layers(spec, &gen)?;
        Ok(Setup {
            name: format!("{name} R={ranks} T_max={max_tokens}"),
            spec,
            gen,
            split,
            fused,
        })
    }

    fn layers(spec: LayerSpec, gen: &WeightGen) -> Result<(MoeLayer, MoeLayer), String> {
        let ranks = spec.ranks;
        let build = |kind| {
            MoeLayer::new(LayerSpec { kind, ..spec }, |r| gen.rank_fp8(r, ranks))
                .map_err(|e| format!("building the {} layer: {e}", kind.name()))
        };
        Ok((build(Kind::Split)?, build(Kind::Fused)?))
    }
}

fn setups(seed: u64) -> Result<Vec<Setup>, String> {
    soak_setups()
        .into_iter()
        .enumerate()
        .map(|(i, (name, shape, ranks, t))| Setup::new(name, shape, ranks, t, seed ^ i as u64))
        .collect()
}

/// One round's random batch for `spec` (megamoe-core's [`soak_batch`]).
fn batch(
    spec: &LayerSpec,
    rng: &mut SplitMix64,
) -> Result<(WorldInputs, Option<usize>, String), String> {
    soak_batch(spec.shape, spec.ranks, spec.max_tokens, rng).map_err(|e| e.to_string())
}

/// Every token whose slots are all masked has an output of exactly 0.
fn all_masked_are_zero(world: &WorldInputs, out: &[Vec<bf16>]) -> Result<usize, String> {
    let (h, k) = (world.shape.hidden, world.shape.topk);
    let mut n = 0;
    for (r, inputs) in world.ranks.iter().enumerate() {
        for t in 0..inputs.tokens {
            if inputs.topk_idx[t * k..][..k].iter().all(|&e| e < 0) {
                n += 1;
                if out[r][t * h..][..h].iter().any(|v| v.to_bits() != 0) {
                    return Err(format!(
                        "rank {r} token {t}: every slot masked, output not 0"
                    ));
                }
            }
        }
    }
    Ok(n)
}

/// The soak's running figures.
#[derive(Default)]
struct Figures {
    calls: usize,
    /// Rounds of the layer (fused + split on one batch).
    rounds: usize,
    /// Rounds of dispatch and combine alone (forward and backward on one routing).
    ep_rounds: usize,
    reference_checks: usize,
    bytes_checked: usize,
    all_masked_tokens: usize,
    zero_token_ranks: usize,
    failures: Vec<String>,
}

/// One round on `setup`: both kinds in alternating order on one batch, their bits compared,
/// the CPU reference on `reference` rounds.
fn round(
    setup: &mut Setup,
    rng: &mut SplitMix64,
    reference: bool,
    fig: &mut Figures,
) -> Result<(), String> {
    let (world, bound, label) = batch(&setup.spec, rng)?;
    let what = |e: String| format!("{}: {label}: {e}", setup.name);
    let inputs = bf16_inputs(&world);
    let fused_first = fig.rounds % 2 == 0;
    let mut outputs = Vec::with_capacity(2);
    for fused in [fused_first, !fused_first] {
        let layer = if fused {
            &mut setup.fused
        } else {
            &mut setup.split
        };
        fig.calls += 1;
        let out = layer
            .forward(&inputs, bound)
            .map_err(|e| what(format!("{} forward: {e}", layer.spec().kind.name())))?;
        outputs.push(out);
    }
    let bytes: usize = outputs[0].iter().map(|o| o.len() * 2).sum();
    if outputs[0] != outputs[1] {
        return Err(what("the fused and the split layer give other bits".into()));
    }
    fig.bytes_checked += 2 * bytes;
    fig.all_masked_tokens += all_masked_are_zero(&world, &outputs[0]).map_err(what)?;
    fig.zero_token_ranks += world.ranks.iter().filter(|r| r.tokens == 0).count();
    if reference {
        let options = LayerOptions::for_shape(&world.shape);
        let want = fused_layer(&world, &setup.gen, &options, &|_, _| {})
            .map_err(|e| what(e.to_string()))?;
        let d = diff::diff_bf16(&outputs[0], &want);
        if d.is_nan() || d > MAX_DIFF {
            return Err(what(format!("diff {d:.3e} against the CPU reference")));
        }
        fig.reference_checks += 1;
        fig.bytes_checked += 2 * bytes;
    }
    Ok(())
}

/// Dispatch and combine alone on the small checks' buffer of megamoe-ep's selftest.
struct EpSetup {
    name: String,
    world: EpWorld,
}

impl EpSetup {
    fn new(ranks: usize, dtype: RowDtype) -> Result<EpSetup, String> {
        let config = EpConfig {
            num_sms: 16,
            ..EpConfig::new(small(ranks), dtype)
        };
        Ok(EpSetup {
            name: format!("dispatch/combine R={ranks} {dtype:?}"),
            world: EpWorld::new(config).map_err(|e| e.to_string())?,
        })
    }
}

/// One round of dispatch and combine alone: a random routing, T and pad; dispatch,
/// combine and both backwards, each bit for bit against megamoe-core's reference.
fn ep_round(setup: &EpSetup, rng: &mut SplitMix64, fig: &mut Figures) -> Result<(), String> {
    let routing = Routing::ALL[rng.below(Routing::ALL.len())];
    // T = 0 ranks come with the uneven routing (and in the layer's rounds).
    let tokens = 1 + rng.below(SMALL_TOKENS);
    let pad = [1, 16, 64, 128][rng.below(4)];
    let seed = rng.next_u64();
    fig.calls += 4;
    fig.ep_rounds += 1;
    round_trip(&setup.world, routing, tokens, pad, seed).map_err(|e| {
        format!(
            "{}: {} T {tokens} pad {pad} seed {seed:#x}: {e}",
            setup.name,
            routing.name()
        )
    })
}

/// Resident host memory of this process in bytes (VmRSS of /proc/self/status).
fn host_rss() -> Result<i64, String> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|e| format!("/proc/self/status: {e}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<i64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| "no VmRSS in /proc/self/status".into())
}

/// How far memory in use grew from the first half's samples to the second's. The allocators'
/// swings move the host RSS by tens of MiB between samples, both ways (freed blocks kept or given
/// back), so two single samples say little; a leak lifts the whole second half, its lowest
/// sample above the first half's lowest and its highest above the first half's highest, where a
/// swing lifts one of them. The smaller of the two rises.
fn second_half_growth(first: &[i64], second: &[i64]) -> i64 {
    let span = |v: &[i64]| (*v.iter().min().unwrap(), *v.iter().max().unwrap());
    let ((lo1, hi1), (lo2, hi2)) = (span(first), span(second));
    (lo2 - lo1).min(hi2 - hi1)
}

/// Free device memory and host RSS, now.
fn memory(gpu: &Gpu) -> Result<(i64, i64), String> {
    Ok((
        gpu.free_memory().map_err(|e| e.to_string())? as i64,
        host_rss()?,
    ))
}

pub fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    super::require_gpu("soak")?;
    let gpu = Gpu::new(0)?;
    let start = Instant::now();
    let mut setups = setups(args.seed)?;
    let mut ep_setups = [
        EpSetup::new(2, RowDtype::Bf16)?,
        EpSetup::new(4, RowDtype::Fp8)?,
    ];
    let names: Vec<&str> = setups
        .iter()
        .map(|s| s.name.as_str())
        .chain(ep_setups.iter().map(|s| s.name.as_str()))
        .collect();
    println!(
        "soak: {} setups built in {:.1} s: {}",
        names.len(),
        start.elapsed().as_secs_f64(),
        names.join("; ")
    );
    let mut rng = SplitMix64::new(args.seed);
    let mut fig = Figures::default();
    let progress = Progress::new("soak");
    let budget = Duration::from_secs(args.seconds as u64);
    // (per mille of the soak done, device free, host RSS) after the first round of every setup
    // and at every tenth.
    let mut samples: Vec<(usize, i64, i64)> = Vec::new();
    let soak_start = Instant::now();
    // Every setup's first round comes in order (the warm-up: modules loaded, every buffer
    // allocated), then a random one per round; every third round is dispatch and combine alone.
    let pick =
        |done: usize, n: usize, rng: &mut SplitMix64| if done < n { done } else { rng.below(n) };
    for step in 0.. {
        if fig.calls >= args.calls || soak_start.elapsed() >= budget {
            break;
        }
        if step % 3 == 2 {
            let i = pick(fig.ep_rounds, ep_setups.len(), &mut rng);
            if let Err(e) = ep_round(&ep_setups[i], &mut rng, &mut fig) {
                println!("FAIL  {e}");
                fig.failures.push(e);
                // A failed call may leave the world broken: build it anew.
                let (ranks, dtype) = (ep_setups[i].world.ranks(), ep_setups[i].world.config.dtype);
                ep_setups[i] = EpSetup::new(ranks, dtype)?;
            }
        } else {
            let i = pick(fig.rounds, setups.len(), &mut rng);
            let reference = fig.rounds % args.reference_every == 0;
            if let Err(e) = round(&mut setups[i], &mut rng, reference, &mut fig) {
                println!("FAIL  {e}");
                fig.failures.push(e);
                // A failed call may leave a layer broken: build the setup's layers anew.
                let s = &mut setups[i];
                (s.split, s.fused) = Setup::layers(s.spec, &s.gen)?;
            }
            fig.rounds += 1;
        }
        let by_time = (soak_start.elapsed().as_secs_f64() / budget.as_secs_f64() * 1000.0) as usize;
        let done = (fig.calls * 1000 / args.calls).max(by_time).min(1000);
        let tenth = |d: usize| d / 100;
        let warm = fig.rounds >= setups.len() && fig.ep_rounds >= ep_setups.len();
        if warm && samples.last().is_none_or(|s| tenth(s.0) < tenth(done)) {
            let (dev, rss) = memory(&gpu)?;
            samples.push((done, dev, rss));
        }
        progress.update(done, 1000);
    }
    let secs = soak_start.elapsed().as_secs_f64();
    println!(
        "calls {} ({} rounds of fused + split, {} of dispatch + combine and both backwards) in {secs:.1} s, {:.1} calls/s",
        fig.calls,
        fig.rounds,
        fig.ep_rounds,
        fig.calls as f64 / secs
    );
    println!(
        "checked: {} bytes of layer output ({:.1} MiB): every call's bits against the other kind, {} rounds against the CPU reference; {} all-masked tokens exactly 0; {} ranks with T = 0; dispatch/combine: every output bit against the reference",
        fig.bytes_checked,
        fig.bytes_checked as f64 / (1 << 20) as f64,
        fig.reference_checks,
        fig.all_masked_tokens,
        fig.zero_token_ranks
    );
    let mib = |b: i64| b as f64 / 1048576.0;
    for (done, dev, rss) in &samples {
        println!(
            "memory at {:5.1} %: device free {:.1} MiB, host RSS {:.1} MiB",
            *done as f64 / 10.0,
            mib(*dev),
            mib(*rss)
        );
    }
    let mut growth_failures = Vec::new();
    let (first, second): (Vec<_>, Vec<_>) = samples.iter().partition(|s| s.0 <= 500);
    match (first.is_empty(), second.is_empty()) {
        (false, false) => {
            // Device memory in use grows as its free memory shrinks.
            let used = |h: &[&(usize, i64, i64)]| h.iter().map(|s| -s.1).collect::<Vec<_>>();
            let rss = |h: &[&(usize, i64, i64)]| h.iter().map(|s| s.2).collect::<Vec<_>>();
            let dev_growth = second_half_growth(&used(&first), &used(&second));
            let rss_growth = second_half_growth(&rss(&first), &rss(&second));
            println!(
                "memory growth over the second half (its lowest and its highest sample, each against the first half's; the smaller rise): device {dev_growth} B, host RSS {rss_growth} B (limit {MAX_GROWTH_BYTES} B each)"
            );
            for (what, growth) in [("device memory", dev_growth), ("host RSS", rss_growth)] {
                if growth > MAX_GROWTH_BYTES {
                    growth_failures.push(format!(
                        "{what} grew by {growth} bytes over the second half"
                    ));
                }
            }
        }
        _ => println!("memory: the soak was too short for a growth figure"),
    }
    println!("failures: {}", fig.failures.len() + growth_failures.len());
    for f in &growth_failures {
        println!("FAIL  {f}");
    }
    if !fig.failures.is_empty() || !growth_failures.is_empty() {
        return Err(format!(
            "{} failed call(s), {} memory growth failure(s)",
            fig.failures.len(),
            growth_failures.len()
        )
        .into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_growth_tells_a_leak_from_the_allocators_swings() {
        let mib = |v: &[f64]| v.iter().map(|m| (m * 1048576.0) as i64).collect::<Vec<_>>();
        // Host RSS of a soak with no leak (MiB at 0, 10, ..., 100 %): two single samples
        // (50 % -> 100 %) rose by 26.9 MiB, the lowest sample of the second half by 23.1 and the
        // highest by 7.8.
        let swings = mib(&[
            265.7, 276.5, 282.2, 258.1, 283.0, 263.9, 288.3, 289.5, 289.5, 281.2, 290.8,
        ]);
        let g = second_half_growth(&swings[..6], &swings[6..]);
        assert!(g < MAX_GROWTH_BYTES, "{g}");
        assert_eq!(g, mib(&[290.8])[0] - mib(&[283.0])[0]);
        // A leak of 4 MiB per sample on top of the same swings: 20 MiB over the second half.
        let leak: Vec<i64> = swings
            .iter()
            .enumerate()
            .map(|(i, v)| v + i as i64 * (4 << 20))
            .collect();
        assert!(second_half_growth(&leak[..6], &leak[6..]) > MAX_GROWTH_BYTES);
        // Memory given back: no growth.
        assert!(second_half_growth(&[300, 310], &[200, 210]) < 0);
    }

    #[test]
    fn every_configuration_is_a_valid_layer_of_both_kinds() {
        for (name, shape, ranks, t) in soak_setups() {
            let spec = LayerSpec::new(shape, ranks, t);
            spec.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
            spec.fused_layout()
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }

    #[test]
    fn a_batch_keeps_every_t_within_t_max_and_the_bound_between_the_largest_t_and_t_max() {
        let tiny = megamoe_core::Preset::by_name("tiny").unwrap().shape;
        let spec = LayerSpec::new(tiny, 4, 48);
        let mut rng = SplitMix64::new(3);
        let (mut zero_ranks, mut bounds) = (0, 0);
        for _ in 0..64 {
            let (world, bound, _) = batch(&spec, &mut rng).unwrap();
            let largest = world.ranks.iter().map(|r| r.tokens).max().unwrap();
            for r in &world.ranks {
                assert!(r.tokens <= 48);
                assert_eq!(r.x.len(), r.tokens * tiny.hidden);
                assert_eq!(r.topk_idx.len(), r.tokens * tiny.topk);
                zero_ranks += (r.tokens == 0) as usize;
            }
            if let Some(b) = bound {
                assert!((largest..=48).contains(&b));
                bounds += 1;
            }
        }
        assert!(zero_ranks > 0 && bounds > 0);
    }
}
