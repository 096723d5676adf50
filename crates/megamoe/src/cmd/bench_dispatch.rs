//! `megamoe bench dispatch`: dispatch/combine with fused permute on the H200 pair, SPEC §8 method
//! (CUDA events around every call, warm-up, median of ≥ 20 calls per observation, arms
//! interleaved A B / B A / A B in one process; per call the slowest rank counts).

use megamoe_core::Preset;
use megamoe_ep::bench::{BenchSetup, DispatchBench};
use megamoe_ep::layout::RowDtype;
use megamoe_ep::selftest::Routing;
use megamoe_ep::CombineOrder;

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
    /// Combine orders (SPEC §5), comma-separated: exact, per_rank.
    #[arg(long, value_delimiter = ',', default_values_t = vec!["exact".to_string()])]
    pub combine: Vec<String>,
    /// Timed calls per observation.
    #[arg(long, default_value_t = 20)]
    pub iters: usize,
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
    let combine_orders = args
        .combine
        .iter()
        .map(|name| {
            CombineOrder::by_name(name)
                .ok_or_else(|| format!("--combine {name}: expected exact or per_rank"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut bench = DispatchBench::new(BenchSetup {
        shape,
        ranks: args.ranks,
        tokens: args.tokens,
        dtype,
        pad_multiple: args.pad_multiple,
        routing,
        combine_orders,
    })?;
    let world = &bench.world;
    println!(
        "bench dispatch: preset {} (H {} E {} K {}), {} ranks on {} GPU(s), {} tokens/rank, {:?}, {} routing, pad {}, symmetric buffer {:.0} MiB/rank",
        args.preset, shape.hidden, shape.experts, shape.topk, args.ranks, world.physical_gpus(), args.tokens, dtype,
        routing.name(), args.pad_multiple, world.layout.size as f64 / (1 << 20) as f64
    );
    if let Err(e) = &bench.baseline {
        println!("NCCL baseline not run: {e}");
    }
    if let Some(same) = bench.baseline_identical {
        println!("NCCL baseline output identical to dispatch_with_permute: {same}");
    }
    println!("| SMs | arm | µs median | per-round min–max | NVLink MB/GPU | GB/s per GPU | floor µs | × floor |");
    println!("|---|---|---|---|---|---|---|---|");
    for &sms in &args.sms {
        let m = bench.measure(sms, args.iters)?;
        for arm in &m.arms {
            let r = arm.sorted_rounds();
            let (med, floor) = (arm.median_us(), arm.floor_us());
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
        for q in &m.ratios {
            println!(
                "| {sms} | {} | {:.2} (rounds {:.2}–{:.2}) | | | | | |",
                q.name, q.median, q.min, q.max
            );
        }
    }
    Ok(())
}
