//! `megamoe bench layer`: the MoE layer's device time per token count, next to its floor and to
//! our two grouped GEMMs alone on the same routing, arms interleaved (SPEC §8).

use std::io::Write;
use std::path::PathBuf;

use megamoe_core::limits;
use megamoe_core::routing::{RoutingKind, RoutingSpec};
use megamoe_core::{Accumulation, Preset, Shape};
use megamoe_layer::bench::{self, LayerBench, LayerRow};
use megamoe_layer::{Kind, LayerSpec, Phase};
use serde::Serialize;

use crate::args::{self, usage, Usage};
use crate::jsonl::{Cell, Output, Setup};

#[derive(clap::Args)]
pub struct Args {
    /// Model shape: flash, pro, dsv3, glm or tiny.
    #[arg(long, default_value = "flash")]
    pub preset: String,
    #[arg(long, value_parser = args::count(&limits::EXPERTS), allow_hyphen_values = true,
          help = args::help(
              "Experts in all (default: the preset's; at least its top-k); `--experts 32` on \
               flash and 48 on pro with `--ranks 1` is the EP8-rank proxy (SPEC §9)",
              &limits::EXPERTS))]
    pub experts: Option<usize>,
    #[arg(long, default_value_t = 1, value_parser = args::count(&limits::RANKS),
          allow_hyphen_values = true,
          help = args::help(
              "Ranks (virtual ranks beyond the GPUs: correct, not a performance number)",
              &limits::RANKS))]
    pub ranks: usize,
    #[arg(long, value_delimiter = ',', default_value = "64,128,256,512,1024,2048,4096,8192",
          value_parser = args::count(&args::BENCH_TOKENS), allow_hyphen_values = true,
          help = args::help(
              "Tokens per rank of each row; buffers are sized for the largest",
              &args::BENCH_TOKENS))]
    pub tokens: Vec<usize>,
    /// The layer's forms to time, interleaved: split, fused or both (split always runs: it is
    /// the baseline and holds the GEMM-only arm's pool).
    #[arg(long, value_delimiter = ',', default_value = "split,fused")]
    pub kernel: Vec<String>,
    /// Expert choice: uniform (top-k of Gaussian scores) or zipf (skewed popularity).
    #[arg(long, default_value = "uniform")]
    pub routing: String,
    /// Fraction of slots masked, in [0, 1].
    #[arg(long, default_value_t = 0.0, value_parser = args::fraction, allow_hyphen_values = true)]
    pub masked: f64,
    #[arg(long, default_value_t = 3, value_parser = args::count(&args::ROUNDS),
          allow_hyphen_values = true,
          help = args::help("Rounds of the interleaved arms (A B, B A, A B, ...)", &args::ROUNDS))]
    pub rounds: usize,
    #[arg(long, default_value_t = 20, value_parser = args::count(&args::ITERS),
          allow_hyphen_values = true,
          help = args::help("Timed calls per arm and round (median)", &args::ITERS))]
    pub iters: usize,
    #[arg(long, value_parser = args::count(&args::SMS), allow_hyphen_values = true,
          help = args::help(
              "Blocks per rank for dispatch and combine (default: the layer's; at most the \
               GPU's SMs are used)",
              &args::SMS))]
    pub comm_sms: Option<usize>,
    /// Time the fused kernel that records its timeline and print where each cell's time went
    /// (rank 0's last call): phases, and per task kind the producer's wait, the consumers' gap,
    /// mainloop and epilogue.
    #[arg(long)]
    pub trace: bool,
    #[arg(long, default_value = "per-block", value_parser = args::accumulation,
          help = format!("{} (every arm)", args::ACCUMULATION_HELP))]
    pub accumulation: Accumulation,
    /// Seed of the weights and the batch (any u64).
    #[arg(long, default_value_t = 0, value_parser = args::seed, allow_hyphen_values = true)]
    pub seed: u64,
    /// Append one JSON object per measured cell and arm (JSON Lines) to this file; `-` writes
    /// them to stdout and the table to stderr.
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
}

/// The checked arguments: the shape (with `--experts`), whether the fused arm runs, the routing.
struct Checked {
    shape: Shape,
    fused: bool,
    routing: RoutingKind,
}

/// Every check that needs more than one flag, before the GPU is probed.
fn check(args: &Args) -> Result<Checked, Usage> {
    let mut fused = false;
    for k in &args.kernel {
        match Kind::by_name(k).map_err(|e| usage("--kernel", e))? {
            Kind::Fused => fused = true,
            Kind::Split => {}
        }
    }
    let mut shape = Preset::by_name(&args.preset)
        .map_err(|e| usage("--preset", e))?
        .shape;
    if let Some(e) = args.experts {
        if e < shape.topk {
            return Err(Usage(format!(
                "--experts: {e} is fewer than the preset's top-{} (each token names that many \
                 distinct experts)",
                shape.topk
            )));
        }
        shape.experts = e;
    }
    shape
        .validate(args.ranks)
        .map_err(|e| usage("--ranks", e))?;
    let max_tokens = args.tokens.iter().copied().max().unwrap_or(1);
    LayerSpec::new(shape, args.ranks, max_tokens)
        .validate()
        .map_err(|e| usage("--experts", e))?;
    let routing = match args.routing.as_str() {
        "uniform" => RoutingKind::Uniform,
        "zipf" => RoutingKind::Zipf { exponent: 1.0 },
        other => {
            return Err(Usage(format!(
                "--routing {other}: expected uniform or zipf"
            )))
        }
    };
    if args.trace && !fused {
        return Err(Usage(
            "--trace times the fused kernel: add fused to --kernel".into(),
        ));
    }
    Ok(Checked {
        shape,
        fused,
        routing,
    })
}

/// The fields of a `bench layer` cell beside the shared ones.
#[derive(Serialize)]
struct LayerFields {
    /// Every arm's accumulation ("per-block" or "rescaled").
    accumulation: &'static str,
    masked: f64,
    valid_slots: usize,
    rounds: usize,
    iters: usize,
    /// Which per-round ratio the band is: "split/gemms" on split, "fused/split" on fused.
    ratio_of: Option<&'static str>,
    ratio_min: Option<f64>,
    ratio_max: Option<f64>,
    /// The fused call's lag in units; None for a single wave and on the other arms.
    lag_units: Option<usize>,
}

/// The JSON cells of one row: split, gemms, fused (when timed), then each split phase alone.
fn cells<'a>(setup: &'a Setup<'a>, args: &Args, r: &LayerRow) -> Vec<Cell<'a, LayerFields>> {
    let fields = |ratio_of, band: Option<(f64, f64)>, lag_units| LayerFields {
        accumulation: args.accumulation.name(),
        masked: args.masked,
        valid_slots: r.valid_slots,
        rounds: args.rounds,
        iters: args.iters,
        ratio_of,
        ratio_min: band.map(|b| b.0),
        ratio_max: band.map(|b| b.1),
        lag_units,
    };
    // Valid FLOPs per rank over an arm's time (r.tflops is the split arm's).
    let tflops = |us: f64| Some(r.tflops * r.split_us / us);
    let floor = Some(r.floor_us);
    let tokens = Some(r.tokens);
    let mut out = vec![
        setup.cell(
            tokens,
            "split",
            r.split_us,
            floor,
            tflops(r.split_us),
            fields(Some("split/gemms"), Some((r.ratio_min, r.ratio_max)), None),
        ),
        setup.cell(
            tokens,
            "gemms",
            r.gemms_us,
            floor,
            tflops(r.gemms_us),
            fields(None, None, None),
        ),
    ];
    if let Some(f) = &r.fused {
        out.push(setup.cell(
            tokens,
            "fused",
            f.us,
            floor,
            tflops(f.us),
            fields(
                Some("fused/split"),
                Some((f.ratio_min, f.ratio_max)),
                f.lag_units,
            ),
        ));
    }
    for (phase, us) in Phase::ALL.iter().zip(r.phases_us) {
        out.push(setup.cell(
            tokens,
            &format!("split:{}", phase.name()),
            us,
            floor,
            None,
            fields(None, None, None),
        ));
    }
    out
}

pub fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let Checked {
        shape,
        fused,
        routing,
    } = check(args)?;
    let mut output = Output::open(args.json.as_deref())?;
    super::require_gpu("bench layer")?;
    let mut table = output.table();
    let b = LayerBench {
        shape,
        ranks: args.ranks,
        tokens: args.tokens.clone(),
        routing: RoutingSpec {
            kind: routing,
            masked_ratio: args.masked,
            uneven_tokens: false,
            seed: args.seed,
        },
        rounds: args.rounds,
        iters: args.iters,
        comm_sms: args.comm_sms,
        fused,
        trace: args.trace,
        accumulation: args.accumulation,
    };
    writeln!(
        table,
        "bench layer: {} (H {} I {} E {} top-{}), {} rank(s), {}, {} accumulation, {} routing, masked {}, buffers for {} tokens/rank, {} rounds x median of {}",
        args.preset,
        shape.hidden,
        shape.inter,
        shape.experts,
        shape.topk,
        args.ranks,
        if fused { "split and fused" } else { "split" },
        args.accumulation.name(),
        args.routing,
        args.masked,
        args.tokens.iter().max().unwrap_or(&0),
        args.rounds,
        args.iters
    )?;
    let rows = bench::run(&b, &|what| eprintln!("bench layer: {what}"))?;
    let setup = Setup::new("layer", &args.preset, &shape, args.ranks, &args.routing);
    writeln!(
        table,
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
    )?;
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
        writeln!(
            table,
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
        )?;
    }
    for r in &rows {
        for cell in cells(&setup, args, r) {
            output.cell(&cell)?;
        }
    }
    if args.trace {
        writeln!(
            table,
            "fused timeline, rank 0 (us; phases are medians over CTAs, task columns means per task, \
             ml med the median mainloop of a warpgroup, early the combine items (tokens or their column chunks) done while the CTAs waited):"
        )?;
        writeln!(
            table,
            "{:>7} {:>8} {:>8} {:>9} {:>8} {:>8} {:>6} | {:>6} {:>8} {:>6} {:>9} {:>9} {:>7} | {:>6} {:>8} {:>6} {:>9} {:>9} {:>7} | {:>6}",
            "tokens", "routing", "plan", "tasks", "wait", "combine", "busy",
            "L1 n", "p.wait", "gap", "mainloop", "epilogue", "ml med",
            "L2 n", "p.wait", "gap", "mainloop", "epilogue", "ml med", "early"
        )?;
        for r in &rows {
            let Some(t) = r.fused.as_ref().and_then(|f| f.trace.as_ref()) else {
                continue;
            };
            let [a, b] = t.kinds;
            writeln!(
            table,
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
            )?;
        }
    }
    if args.trace {
        writeln!(
            table,
            "fused critical path, rank 0 (us from the first CTA's start to the last CTA's end of each phase; \
             the CTA that signalled last: its fence, barrier and signal, and wait for every rank's signal):"
        )?;
        writeln!(
            table,
            "{:>7} {:>8} {:>8} {:>9} {:>8} {:>8} | {:>7} {:>7} {:>7}",
            "tokens", "routed", "planned", "tasks", "written", "end", "fence", "signal", "seen"
        )?;
        for r in &rows {
            if let Some(t) = r.fused.as_ref().and_then(|f| f.trace.as_ref()) {
                let (l, a) = (t.last_us, t.after_tasks_us);
                writeln!(
                    table,
                    "{:>7} {:>8.1} {:>8.1} {:>9.1} {:>8.1} {:>8.1} | {:>7.1} {:>7.1} {:>7.1}",
                    r.tokens, l[0], l[1], l[2], l[3], l[4], a[0], a[1], a[2]
                )?;
            }
        }
    }
    writeln!(table, "each phase of the split layer alone (median us):")?;
    write!(table, "{:>7}", "tokens")?;
    for phase in Phase::ALL {
        write!(table, " {:>10}", phase.name())?;
    }
    writeln!(table, " {:>10}", "sum")?;
    for r in &rows {
        write!(table, "{:>7}", r.tokens)?;
        for us in r.phases_us {
            write!(table, " {us:>10.1}")?;
        }
        writeln!(table, " {:>10.1}", r.phases_us.iter().sum::<f64>())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use megamoe_layer::bench::FusedCell;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    #[test]
    fn a_row_gives_one_cell_per_arm_with_its_band_and_rate() {
        let args =
            Cli::parse_from(["bench", "--preset", "tiny", "--rounds", "2", "--iters", "5"]).args;
        let shape = Preset::by_name("tiny").unwrap().shape;
        let row = LayerRow {
            tokens: 64,
            valid_slots: 256,
            split_us: 100.0,
            gemms_us: 50.0,
            ratio_min: 1.9,
            ratio_max: 2.1,
            fused: Some(FusedCell {
                us: 80.0,
                ratio_min: 0.7,
                ratio_max: 0.9,
                lag_units: Some(8),
                trace: None,
            }),
            floor_us: 40.0,
            tflops: 2.0,
            phases_us: [10.0, 20.0, 30.0, 40.0],
        };
        let setup = Setup::new("layer", "tiny", &shape, 1, "uniform");
        let cells: Vec<serde_json::Value> = cells(&setup, &args, &row)
            .iter()
            .map(|c| serde_json::to_value(c).unwrap())
            .collect();
        let arms: Vec<&str> = cells.iter().map(|c| c["arm"].as_str().unwrap()).collect();
        assert_eq!(
            arms,
            [
                "split",
                "gemms",
                "fused",
                "split:dispatch",
                "split:L1+SwiGLU",
                "split:L2",
                "split:combine"
            ]
        );
        let [split, gemms, fused, dispatch] = [&cells[0], &cells[1], &cells[2], &cells[3]];
        assert_eq!(split["ratio_of"], "split/gemms");
        assert_eq!(
            (split["ratio_min"].as_f64(), split["ratio_max"].as_f64()),
            (Some(1.9), Some(2.1))
        );
        assert_eq!(split["tflops"], 2.0);
        // The same FLOPs in half the time.
        assert_eq!(gemms["tflops"], 4.0);
        assert_eq!(gemms["ratio_of"], serde_json::Value::Null);
        assert_eq!(fused["ratio_of"], "fused/split");
        assert_eq!(fused["lag_units"], 8);
        assert_eq!(fused["x_floor"], 2.0);
        assert_eq!(dispatch["median_us"], 10.0);
        assert_eq!(dispatch["tflops"], serde_json::Value::Null);
        for c in &cells {
            assert_eq!(
                (
                    c["tokens"].as_u64(),
                    c["rounds"].as_u64(),
                    c["iters"].as_u64()
                ),
                (Some(64), Some(2), Some(5))
            );
            assert_eq!(c["intermediate"], 128);
            assert_eq!(c["floor_us"], 40.0);
        }
    }
}
