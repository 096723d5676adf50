//! `megamoe bench dispatch`: dispatch/combine with fused permute on the H200 pair, SPEC §8 method
//! (CUDA events around every call, warm-up, median of ≥ 20 calls per observation, arms
//! interleaved A B / B A / A B in one process; per call the slowest rank counts).

use std::io::Write;
use std::path::PathBuf;

use megamoe_core::limits;
use megamoe_ep::bench::{BenchSetup, DispatchBench};
use megamoe_ep::selftest::Routing;
use megamoe_ep::{BufferSpec, CombineOrder, RowDtype};
use serde::Serialize;

use crate::args::{self, usage, Usage};
use crate::jsonl::{Cell, Output, Setup};

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Model preset (SPEC §1).
    #[arg(long, default_value = "flash")]
    pub preset: String,
    #[arg(long, default_value_t = 4096, value_parser = args::count(&args::BENCH_TOKENS),
          allow_hyphen_values = true, help = args::help("Tokens per rank", &args::BENCH_TOKENS))]
    pub tokens: usize,
    /// Row format of the dispatch: bf16 or fp8.
    #[arg(long, default_value = "bf16")]
    pub dtype: String,
    #[arg(long, value_delimiter = ',', default_values_t = vec![megamoe_ep::DEFAULT_NUM_SMS],
          value_parser = args::count(&args::SMS), allow_hyphen_values = true,
          help = args::help("SMs per rank; several values (comma-separated) sweep", &args::SMS))]
    pub sms: Vec<usize>,
    #[arg(long, default_value_t = 2, value_parser = args::count(&limits::RANKS),
          allow_hyphen_values = true,
          help = args::help("Ranks (one per GPU when enough GPUs are present)", &limits::RANKS))]
    pub ranks: usize,
    #[arg(long, default_value_t = 128, value_parser = args::count(&args::PAD_MULTIPLE),
          allow_hyphen_values = true,
          help = args::help("Rows each expert's segment is padded to", &args::PAD_MULTIPLE))]
    pub pad_multiple: usize,
    /// uniform, zipf, masked or uneven.
    #[arg(long, default_value = "uniform")]
    pub routing: String,
    /// Combine orders (SPEC §5), comma-separated: exact, per_rank.
    #[arg(long, value_delimiter = ',', default_values_t = vec!["exact".to_string()])]
    pub combine: Vec<String>,
    #[arg(long, default_value_t = 20, value_parser = args::count(&args::ITERS),
          allow_hyphen_values = true,
          help = args::help("Timed calls per observation", &args::ITERS))]
    pub iters: usize,
    /// Append one JSON object per measured SM count and arm (JSON Lines) to this file; `-`
    /// writes them to stdout and the table to stderr.
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
}

/// Every check that needs more than one flag, before the GPU is probed.
fn check(args: &Args) -> Result<BenchSetup, Usage> {
    let shape = args::preset(&args.preset, args.ranks)?.shape;
    BufferSpec::for_shape(args.ranks, &shape, args.tokens, args.pad_multiple)
        .validate()
        .map_err(|e| usage("--preset", e))?;
    let dtype = match args.dtype.as_str() {
        "bf16" => RowDtype::Bf16,
        "fp8" => RowDtype::Fp8,
        other => return Err(Usage(format!("--dtype {other}: expected bf16 or fp8"))),
    };
    let routing = Routing::ALL
        .into_iter()
        .find(|r| r.name() == args.routing)
        .ok_or_else(|| {
            Usage(format!(
                "--routing {}: expected uniform, zipf, masked or uneven",
                args.routing
            ))
        })?;
    let combine_orders = args
        .combine
        .iter()
        .map(|name| {
            CombineOrder::by_name(name)
                .ok_or_else(|| Usage(format!("--combine {name}: expected exact or per_rank")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(BenchSetup {
        shape,
        ranks: args.ranks,
        tokens: args.tokens,
        dtype,
        pad_multiple: args.pad_multiple,
        routing,
        combine_orders,
    })
}

/// The fields of a `bench dispatch` cell beside the shared ones.
#[derive(Serialize)]
struct DispatchFields<'a> {
    dtype: &'a str,
    pad_multiple: usize,
    /// GPUs the ranks ran on (ranks beyond it are virtual ranks sharing a GPU).
    gpus: usize,
    sms: usize,
    iters: usize,
    /// The per-round medians, in round order.
    rounds_us: &'a [f64],
    round_min_us: f64,
    round_max_us: f64,
    /// Bytes of the slowest rank.
    nvlink_bytes_per_gpu: f64,
    hbm_bytes_per_gpu: f64,
    nvlink_gb_per_s_per_gpu: f64,
}

/// One arm's cell: `(gpus, sms)` where it ran, `timing` is (median, floor) in µs, `bytes`
/// (NVLink, HBM) per GPU.
fn arm_cell<'a>(
    setup: &'a Setup<'a>,
    args: &'a Args,
    (gpus, sms): (usize, usize),
    arm: &str,
    rounds_us: &'a [f64],
    (median_us, floor_us): (f64, f64),
    (nvlink, hbm): (f64, f64),
) -> Cell<'a, DispatchFields<'a>> {
    let fields = DispatchFields {
        dtype: &args.dtype,
        pad_multiple: args.pad_multiple,
        gpus,
        sms,
        iters: args.iters,
        rounds_us,
        round_min_us: rounds_us.iter().copied().fold(f64::INFINITY, f64::min),
        round_max_us: rounds_us.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        nvlink_bytes_per_gpu: nvlink,
        hbm_bytes_per_gpu: hbm,
        nvlink_gb_per_s_per_gpu: nvlink / (median_us * 1e3),
    };
    setup.cell(
        Some(args.tokens),
        arm,
        median_us,
        Some(floor_us),
        None,
        fields,
    )
}

pub fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let setup = check(args)?;
    let (shape, dtype, routing) = (setup.shape, setup.dtype, setup.routing);
    let mut output = Output::open(args.json.as_deref())?;
    super::require_gpu("bench dispatch")?;
    let mut table = output.table();
    let mut bench = DispatchBench::new(setup)?;
    let world = &bench.world;
    let gpus = world.physical_gpus();
    writeln!(
        table,
        "bench dispatch: preset {} (H {} E {} K {}), {} ranks on {} GPU(s), {} tokens/rank, {:?}, {} routing, pad {}, symmetric buffer {:.0} MiB/rank",
        args.preset, shape.hidden, shape.experts, shape.topk, args.ranks, world.physical_gpus(), args.tokens, dtype,
        routing.name(), args.pad_multiple, world.layout.size as f64 / (1 << 20) as f64
    )?;
    if let Err(e) = &bench.baseline {
        writeln!(table, "NCCL baseline not run: {e}")?;
    }
    if let Some(same) = bench.baseline_identical {
        writeln!(
            table,
            "NCCL baseline output identical to dispatch_with_permute: {same}"
        )?;
    }
    writeln!(table, "| SMs | arm | µs median | per-round min–max | NVLink MB/GPU | GB/s per GPU | floor µs | × floor |")?;
    writeln!(table, "|---|---|---|---|---|---|---|---|")?;
    let cells = Setup::new("dispatch", &args.preset, &shape, args.ranks, routing.name());
    for &sms in &args.sms {
        let m = bench.measure(sms, args.iters)?;
        for arm in &m.arms {
            let r = arm.sorted_rounds();
            let (med, floor) = (arm.median_us(), arm.floor_us());
            writeln!(
                table,
                "| {sms} | {} | {med:.1} | {:.1}–{:.1} | {:.1} | {:.0} | {floor:.1} | {:.2} |",
                arm.name,
                r[0],
                r[r.len() - 1],
                arm.nvlink_bytes / 1e6,
                arm.nvlink_bytes / (med * 1e3),
                med / floor
            )?;
            output.cell(&arm_cell(
                &cells,
                args,
                (gpus, sms),
                &arm.name,
                &arm.rounds,
                (med, floor),
                (arm.nvlink_bytes, arm.hbm_bytes),
            ))?;
        }
        for q in &m.ratios {
            writeln!(
                table,
                "| {sms} | {} | {:.2} (rounds {:.2}–{:.2}) | | | | | |",
                q.name, q.median, q.min, q.max
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    #[test]
    fn an_arms_cell_has_its_rounds_band_and_rates() {
        let args = Cli::parse_from(["bench", "--preset", "tiny", "--tokens", "64"]).args;
        let setup = check(&args).unwrap();
        let cells = Setup::new("dispatch", "tiny", &setup.shape, 2, "uniform");
        let rounds = [12.0, 10.0, 11.0];
        let v = serde_json::to_value(arm_cell(
            &cells,
            &args,
            (1, 24),
            "dispatch_with_permute",
            &rounds,
            (11.0, 5.5),
            (2.2e6, 1e6),
        ))
        .unwrap();
        assert_eq!(v["arm"], "dispatch_with_permute");
        assert_eq!(v["rounds_us"], serde_json::json!([12.0, 10.0, 11.0]));
        assert_eq!(
            (v["round_min_us"].as_f64(), v["round_max_us"].as_f64()),
            (Some(10.0), Some(12.0))
        );
        assert_eq!(v["x_floor"], 2.0);
        // 2.2 MB in 11 µs.
        assert_eq!(v["nvlink_gb_per_s_per_gpu"], 200.0);
        assert_eq!(v["tflops"], serde_json::Value::Null);
        assert_eq!(
            (v["gpus"].as_u64(), v["sms"].as_u64(), v["tokens"].as_u64()),
            (Some(1), Some(24), Some(64))
        );
        assert_eq!(v["dtype"], "bf16");
    }

    #[test]
    fn bad_names_are_usage_errors_naming_the_flag() {
        for (flag, value) in [
            ("--dtype", "fp16"),
            ("--routing", "skewed"),
            ("--combine", "sum"),
            ("--preset", "huge"),
        ] {
            let args = Cli::parse_from(["bench", flag, value]).args;
            let e = check(&args).expect_err("refused").0;
            assert!(e.starts_with(flag), "{e}");
        }
    }
}
