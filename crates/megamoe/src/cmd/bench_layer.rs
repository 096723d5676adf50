//! `megamoe bench layer`: the MoE layer's device time per token count, next to its floor and to
//! our two grouped GEMMs alone on the same routing, arms interleaved (SPEC §8).

use megamoe_core::routing::{RoutingKind, RoutingSpec};
use megamoe_core::Preset;
use megamoe_layer::bench::{self, LayerBench};
use megamoe_layer::split::Phase;

#[derive(clap::Args)]
pub struct Args {
    /// Model shape: flash, pro, dsv3, glm or tiny.
    #[arg(long, default_value = "flash")]
    pub preset: String,
    /// Experts in all (default: the preset's); `--experts 32` on flash and 48 on pro with
    /// `--ranks 1` is the EP8-rank proxy (SPEC §9).
    #[arg(long)]
    pub experts: Option<usize>,
    /// Ranks (virtual ranks beyond the GPUs: correct, not a performance number).
    #[arg(long, default_value_t = 1)]
    pub ranks: usize,
    /// Tokens per rank of each row; buffers are sized for the largest.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "64,128,256,512,1024,2048,4096,8192"
    )]
    pub tokens: Vec<usize>,
    /// The layer's forms to time, interleaved: split, fused or both (split always runs: it is
    /// the baseline and holds the GEMM-only arm's pool).
    #[arg(long, value_delimiter = ',', default_value = "split,fused")]
    pub kernel: Vec<String>,
    /// Expert choice: uniform (top-k of Gaussian scores) or zipf (skewed popularity).
    #[arg(long, default_value = "uniform")]
    pub routing: String,
    /// Fraction of slots masked.
    #[arg(long, default_value_t = 0.0)]
    pub masked: f64,
    /// Rounds of the interleaved arms (A B, B A, A B, ...).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Timed calls per arm and round (median).
    #[arg(long, default_value_t = 20)]
    pub iters: usize,
    /// Blocks per rank for dispatch and combine (default: the layer's).
    #[arg(long)]
    pub comm_sms: Option<usize>,
    /// Time the fused kernel that records its timeline and print where each cell's time went
    /// (rank 0's last call): phases, and per task kind the producer's wait, the consumers' gap,
    /// mainloop and epilogue.
    #[arg(long)]
    pub trace: bool,
    /// Seed of the weights and the batch.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

pub fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let mut fused = false;
    for k in &args.kernel {
        match megamoe_layer::Kind::by_name(k)? {
            megamoe_layer::Kind::Fused => fused = true,
            megamoe_layer::Kind::Split => {}
        }
    }
    let mut shape = Preset::by_name(&args.preset)?.shape;
    if let Some(e) = args.experts {
        shape.experts = e;
    }
    shape.validate(args.ranks)?;
    let kind = match args.routing.as_str() {
        "uniform" => RoutingKind::Uniform,
        "zipf" => RoutingKind::Zipf { exponent: 1.0 },
        other => return Err(format!("--routing {other}: expected uniform or zipf").into()),
    };
    if args.rounds == 0 || args.iters == 0 || args.tokens.is_empty() {
        return Err("--rounds, --iters and --tokens need at least one".into());
    }
    let b = LayerBench {
        shape,
        ranks: args.ranks,
        tokens: args.tokens.clone(),
        routing: RoutingSpec {
            kind,
            masked_ratio: args.masked,
            uneven_tokens: false,
            seed: args.seed,
        },
        rounds: args.rounds,
        iters: args.iters,
        comm_sms: args.comm_sms,
        fused,
        trace: args.trace,
    };
    if args.trace && !fused {
        return Err("--trace times the fused kernel: add fused to --kernel".into());
    }
    println!(
        "bench layer: {} (H {} I {} E {} top-{}), {} rank(s), {}, {} routing, masked {}, buffers for {} tokens/rank, {} rounds x median of {}",
        args.preset,
        shape.hidden,
        shape.inter,
        shape.experts,
        shape.topk,
        args.ranks,
        if fused { "split and fused" } else { "split" },
        args.routing,
        args.masked,
        args.tokens.iter().max().unwrap(),
        args.rounds,
        args.iters
    );
    let rows = bench::run(&b, &|what| eprintln!("bench layer: {what}"))?;
    println!(
        "{:>7} {:>9} {:>10} {:>10} {:>7} {:>13} {:>10} {:>7} {:>13} {:>5} {:>9} {:>8} {:>8}",
        "tokens",
        "slots",
        "split us",
        "GEMMs us",
        "s/GEMMs",
        "band",
        "fused us",
        "f/split",
        "band",
        "lag",
        "floor us",
        "x floor",
        "TFLOP/s"
    );
    for r in &rows {
        // The fastest arm's ×floor and TFLOP/s.
        let best = r.fused.map_or(r.split_us, |f| f.us.min(r.split_us));
        let (fused_us, ratio, band, lag) = match r.fused {
            Some(f) => (
                format!("{:.1}", f.us),
                format!("{:.3}", f.us / r.split_us),
                format!("{:.3}-{:.3}", f.ratio_min, f.ratio_max),
                f.lag_units.map_or("wave".into(), |l| l.to_string()),
            ),
            None => ("-".into(), "-".into(), "-".into(), "-".into()),
        };
        println!(
            "{:>7} {:>9} {:>10.1} {:>10.1} {:>7.3} {:>6.3}-{:<6.3} {:>10} {:>7} {:>13} {:>5} {:>9.1} {:>8.2} {:>8.0}",
            r.tokens,
            r.valid_slots,
            r.split_us,
            r.gemms_us,
            r.split_us / r.gemms_us,
            r.ratio_min,
            r.ratio_max,
            fused_us,
            ratio,
            band,
            lag,
            r.floor_us,
            best / r.floor_us,
            r.tflops * r.split_us / best
        );
    }
    if args.trace {
        println!(
            "fused timeline, rank 0 (us; phases are medians over CTAs, task columns means per task, \
             ml med the median mainloop of a warpgroup, early the tokens combined while the CTAs waited):"
        );
        println!(
            "{:>7} {:>8} {:>8} {:>9} {:>8} {:>8} {:>6} | {:>6} {:>8} {:>6} {:>9} {:>9} {:>7} | {:>6} {:>8} {:>6} {:>9} {:>9} {:>7} | {:>6}",
            "tokens", "routing", "plan", "tasks", "wait", "combine", "busy",
            "L1 n", "p.wait", "gap", "mainloop", "epilogue", "ml med",
            "L2 n", "p.wait", "gap", "mainloop", "epilogue", "ml med", "early"
        );
        for r in &rows {
            let Some(t) = r.fused.as_ref().and_then(|f| f.trace.as_ref()) else {
                continue;
            };
            let [a, b] = t.kinds;
            println!(
                "{:>7} {:>8.1} {:>8.1} {:>9.1} {:>8.1} {:>8.1} {:>6.3} | {:>6} {:>8.2} {:>6.2} {:>9.2} {:>9.2} {:>7.2} | {:>6} {:>8.2} {:>6.2} {:>9.2} {:>9.2} {:>7.2} | {:>6}",
                r.tokens,
                t.phases_us[0],
                t.phases_us[1],
                t.phases_us[2],
                t.phases_us[3],
                t.phases_us[4],
                t.mainloop_share,
                a.tasks,
                a.producer_wait_us,
                a.gap_us,
                a.mainloop_us,
                a.epilogue_us,
                a.mainloop_median_us,
                b.tasks,
                b.producer_wait_us,
                b.gap_us,
                b.mainloop_us,
                b.epilogue_us,
                b.mainloop_median_us,
                t.combined_early
            );
        }
    }
    println!("each phase of the split layer alone (median us):");
    print!("{:>7}", "tokens");
    for phase in Phase::ALL {
        print!(" {:>10}", phase.name());
    }
    println!(" {:>10}", "sum");
    for r in &rows {
        print!("{:>7}", r.tokens);
        for us in r.phases_us {
            print!(" {us:>10.1}");
        }
        println!(" {:>10.1}", r.phases_us.iter().sum::<f64>());
    }
    Ok(())
}
