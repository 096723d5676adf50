//! `megamoe run`: runs the MoE layer on a generated batch (on the GPU when one is usable, else
//! the CPU reference) and reports time, accuracy against the CPU reference and the unquantized
//! f64 layer, and a hash of the output bits.

use std::time::Instant;

use clap::{Args, ValueEnum};
use half::bf16;
use megamoe_core::limits;
use megamoe_core::reference::PerRank;
use megamoe_core::routing::{generate_world, RoutingKind, RoutingSpec};
use megamoe_core::{
    diff, fused_layer_and_f64, Accumulation, LayerOptions, Preset, WeightGen, WorldInputs,
};
use megamoe_layer::inputs::{bf16_inputs, spec_for};
use megamoe_layer::{Kind, LayerSpec, MoeLayer};
use serde::Serialize;

use crate::args::{self, Usage};
use crate::progress::Progress;

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Model shape: flash, pro, dsv3, glm or tiny.
    #[arg(long, default_value = "tiny")]
    preset: String,
    #[arg(long, default_value_t = 2, value_parser = args::count(&limits::RANKS),
          allow_hyphen_values = true,
          help = args::help("Ranks in the expert-parallel world, R", &limits::RANKS))]
    ranks: usize,
    #[arg(long, default_value_t = 64, value_parser = args::count(&limits::HOST_BATCH_TOKENS),
          allow_hyphen_values = true,
          help = args::help("Tokens per rank, T", &limits::HOST_BATCH_TOKENS))]
    tokens: usize,
    /// Expert choice: top-k of Gaussian scores, or skewed by a Zipf law of expert popularity.
    #[arg(long, value_enum, default_value_t = RoutingArg::Uniform)]
    routing: RoutingArg,
    /// Exponent of the Zipf law when --routing zipf, finite and not negative.
    #[arg(long, default_value_t = 1.0, value_parser = args::exponent, allow_hyphen_values = true)]
    zipf_exponent: f64,
    /// Fraction of slots masked (−1), in [0, 1].
    #[arg(long, default_value_t = 0.0, value_parser = args::fraction, allow_hyphen_values = true)]
    masked: f64,
    /// Give the ranks different token counts (same total).
    #[arg(long)]
    uneven: bool,
    /// Seed of every generated input and weight (any u64).
    #[arg(long, default_value_t = 0, value_parser = args::seed, allow_hyphen_values = true)]
    seed: u64,
    /// Columns per scale of the re-quantized intermediate: 64 or 128, dividing the preset's
    /// intermediate size (default by SPEC §3).
    #[arg(long, value_parser = args::one_of(&[64, 128]), allow_hyphen_values = true)]
    gran: Option<usize>,
    /// SwiGLU clamp c, positive and finite.
    #[arg(long, value_parser = args::clamp, allow_hyphen_values = true)]
    clamp: Option<f32>,
    /// Where the layer runs.
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    backend: Backend,
    /// The GPU layer's form (default fused). The CPU reference has none: refused with
    /// `--backend cpu`, noted and not used when `--backend auto` finds no GPU.
    #[arg(long, value_enum)]
    kernel: Option<KernelArg>,
    #[arg(long, value_parser = args::accumulation,
          help = format!("{}. GPU only: refused with `--backend cpu` (the reference is \
                          per-block), noted when `--backend auto` finds no GPU",
                         args::ACCUMULATION_HELP))]
    accumulation: Option<Accumulation>,
    /// GPU backend: also compute the CPU reference and report `diff_vs_reference` and
    /// `diff_vs_f64` (done without asking where the reference is cheap, e.g. tiny). Refused
    /// with `--backend cpu` (the reference is all it runs), noted when `--backend auto` finds no
    /// GPU.
    #[arg(long)]
    check: bool,
    /// Print one JSON object instead of the table (an error too).
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum RoutingArg {
    Uniform,
    Zipf,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Backend {
    /// The GPU layer when a GPU is usable, else the CPU reference (and a note that says why).
    Auto,
    /// The CPU reference (SPEC §3).
    Cpu,
    /// The GPU layer; an error when no GPU is usable.
    Gpu,
}

/// The GPU layer's form (SPEC §4).
#[derive(Clone, Copy, Debug, ValueEnum)]
enum KernelArg {
    /// Dispatch, L1 GEMM + SwiGLU + re-quantization, L2 GEMM, combine: four launches.
    Split,
    /// One persistent launch per rank (the default).
    Fused,
}

#[derive(Serialize)]
struct RunReport {
    backend: &'static str,
    /// The GPU layer's form; null on the CPU backend.
    kernel: Option<&'static str>,
    /// The GPU layer's accumulation ("per-block" or "rescaled"); null on the CPU backend.
    accumulation: Option<&'static str>,
    preset: &'static str,
    ranks: usize,
    tokens_per_rank: usize,
    tokens: usize,
    valid_slots: usize,
    /// As `--routing` spells it.
    routing: &'static str,
    /// The Zipf law's exponent; null for uniform routing.
    zipf_exponent: Option<f64>,
    masked: f64,
    uneven: bool,
    seed: u64,
    group: usize,
    /// Wall time of the layer (input generation excluded). The CPU reference computes the f64
    /// layer in the same pass over the experts (both share each generated weight strip), so on
    /// the CPU this is the time of both. On the GPU: one forward call as a caller sees it
    /// (uploads, kernels, downloads), after a first call of the same batch.
    time_ms: f64,
    /// FLOPs of the valid slots over `time_ms`.
    tflops: f64,
    /// Distance to the unquantized f64 layer (the FP8 cost); null on the GPU when the CPU
    /// reference was not computed (see `--check`).
    diff_vs_f64: Option<f64>,
    /// GPU only: distance to the CPU reference on the same batch (SPEC §3 promises <= 1e-4);
    /// null when not computed.
    #[serde(skip_serializing_if = "Option::is_none")]
    diff_vs_reference: Option<Option<f64>>,
    /// GPU only, beside `diff_vs_reference`: the largest absolute error against the CPU
    /// reference, and that error over the reference's largest magnitude.
    #[serde(skip_serializing_if = "Option::is_none")]
    max_abs_vs_reference: Option<Option<f64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_rel_vs_reference: Option<Option<f64>>,
    output_hash: String,
    /// Why `--backend auto` ran the CPU reference (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

/// Weights of a whole shape up to which `run` computes the CPU reference beside the GPU layer
/// without `--check` (tiny: 1.6 M; flash: 6.4 G, tens of seconds of CPU time).
const CHEAP_REFERENCE_WEIGHTS: usize = 64 << 20;

/// The checks clap's parsers cannot make alone (a value against the preset or another flag),
/// before anything is generated or probed.
fn check(args: &RunArgs) -> Result<(Preset, LayerOptions), Usage> {
    let preset = args::preset(&args.preset, args.ranks)?;
    let options = LayerOptions {
        group: args::gran(&preset.shape, args.gran)?,
        clamp: args.clamp,
    };
    if let Backend::Cpu = args.backend {
        if let Some(k) = args.kernel {
            return Err(Usage(format!(
                "--kernel {}: --backend cpu runs the CPU reference, which has no kernel form",
                k.kind().name()
            )));
        }
        if args.check {
            return Err(Usage(
                "--check compares the GPU layer with the CPU reference; --backend cpu runs only \
                 the reference"
                    .into(),
            ));
        }
        if let Some(a) = args.accumulation {
            return Err(Usage(format!(
                "--accumulation {}: --backend cpu runs the CPU reference, which accumulates \
                 per block (SPEC §3)",
                a.name()
            )));
        }
    }
    Ok((preset, options))
}

impl KernelArg {
    fn kind(self) -> Kind {
        match self {
            KernelArg::Split => Kind::Split,
            KernelArg::Fused => Kind::Fused,
        }
    }
}

pub fn run(args: &RunArgs) -> Result<(), Box<dyn std::error::Error>> {
    let (preset, options) = check(args)?;
    let shape = preset.shape;
    let spec = RoutingSpec {
        kind: match args.routing {
            RoutingArg::Uniform => RoutingKind::Uniform,
            RoutingArg::Zipf => RoutingKind::Zipf {
                exponent: args.zipf_exponent,
            },
        },
        masked_ratio: args.masked,
        uneven_tokens: args.uneven,
        seed: args.seed,
    };
    let (gpu, note) = choose_backend(args)?;

    let world = generate_world(shape, args.ranks, args.tokens, &spec)?;
    let weights = WeightGen::new(shape, args.seed);
    let valid_slots = world.valid_slots();
    let mut report = RunReport {
        backend: if gpu { "gpu" } else { "cpu" },
        kernel: None,
        accumulation: None,
        preset: preset.name,
        ranks: args.ranks,
        tokens_per_rank: args.tokens,
        tokens: world.global_tokens(),
        valid_slots,
        routing: match args.routing {
            RoutingArg::Uniform => "uniform",
            RoutingArg::Zipf => "zipf",
        },
        zipf_exponent: matches!(args.routing, RoutingArg::Zipf).then_some(args.zipf_exponent),
        masked: args.masked,
        uneven: args.uneven,
        seed: args.seed,
        group: options.group,
        time_ms: 0.0,
        tflops: 0.0,
        diff_vs_f64: None,
        diff_vs_reference: None,
        max_abs_vs_reference: None,
        max_rel_vs_reference: None,
        output_hash: String::new(),
        note,
    };
    let reference = |label: &str| {
        let bar = Progress::new(label);
        let out = fused_layer_and_f64(&world, &weights, &options, &|done, total| {
            bar.update(done, total)
        });
        bar.finish();
        out
    };
    let out = if gpu {
        let kind = args.kernel.unwrap_or(KernelArg::Fused).kind();
        let accumulation = args.accumulation.unwrap_or_default();
        let (out, time_ms) = gpu_layer(kind, accumulation, &world, &weights, &options)?;
        report.kernel = Some(kind.name());
        report.accumulation = Some(accumulation.name());
        report.time_ms = time_ms;
        let cheap = shape.experts * 3 * shape.hidden * shape.inter <= CHEAP_REFERENCE_WEIGHTS;
        report.diff_vs_reference = Some(None);
        report.max_abs_vs_reference = Some(None);
        report.max_rel_vs_reference = Some(None);
        if args.check || cheap {
            let (want, exact) = reference("CPU reference ")?;
            let (max_abs, max_rel) = diff::max_error_bf16(&out, &want);
            report.diff_vs_reference = Some(Some(diff::diff_bf16(&out, &want)));
            report.max_abs_vs_reference = Some(Some(max_abs));
            report.max_rel_vs_reference = Some(Some(max_rel));
            report.diff_vs_f64 = Some(diff::diff_bf16_f64(&out, &exact));
        }
        out
    } else {
        let start = Instant::now();
        let (out, exact) = reference("layer and f64 ")?;
        report.time_ms = start.elapsed().as_secs_f64() * 1e3;
        report.diff_vs_f64 = Some(diff::diff_bf16_f64(&out, &exact));
        out
    };
    report.tflops = valid_slots as f64 * shape.flops_per_slot() / (report.time_ms * 1e-3) / 1e12;
    report.output_hash = format!("{:016x}", diff::output_hash(&out));
    if let Some(note) = &report.note {
        eprintln!("megamoe run: {note}");
    }
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_table(&report, &shape);
    }
    Ok(())
}

/// The GPU layer on `world`: builds it (T_max = the largest T), runs the batch once, then once
/// more timed; both runs must give the same bits.
fn gpu_layer(
    kind: Kind,
    accumulation: Accumulation,
    world: &WorldInputs,
    weights: &WeightGen,
    options: &LayerOptions,
) -> Result<(PerRank<bf16>, f64), Box<dyn std::error::Error>> {
    let ranks = world.num_ranks();
    let bar = Progress::new("weights ");
    let spec = LayerSpec {
        kind,
        accumulation,
        ..spec_for(world, options)
    };
    let mut layer = MoeLayer::new(spec, |r| {
        bar.update(r, ranks);
        weights.rank_fp8(r, ranks)
    })?;
    bar.finish();
    let inputs = bf16_inputs(world);
    let first = layer.forward(&inputs, None)?;
    let start = Instant::now();
    let second = layer.forward(&inputs, None)?;
    let time_ms = start.elapsed().as_secs_f64() * 1e3;
    if first != second {
        return Err("the GPU layer gave other bits on a second run of the same batch".into());
    }
    Ok((second, time_ms))
}

/// Whether `--backend` runs the GPU layer, and for `auto` on a machine without a usable GPU a
/// note saying why the CPU reference runs instead (and which flags it leaves unused).
fn choose_backend(args: &RunArgs) -> Result<(bool, Option<String>), Box<dyn std::error::Error>> {
    if let Backend::Cpu = args.backend {
        return Ok((false, None));
    }
    // A missing driver is "no GPU" too; `megamoe info` says what was looked for.
    let cause = match megamoe_cuda::device_count() {
        Ok(n) if n > 0 => return Ok((true, None)),
        Ok(_) => "the driver reports no GPU".to_string(),
        Err(e) => e.to_string(),
    };
    if let Backend::Gpu = args.backend {
        return Err(format!("--backend gpu: no GPU can be used: {cause}").into());
    }
    let unused: Vec<&str> = [
        args.kernel.map(|_| "--kernel"),
        args.accumulation.map(|_| "--accumulation"),
        args.check.then_some("--check"),
    ]
    .into_iter()
    .flatten()
    .collect();
    let unused = if unused.is_empty() {
        String::new()
    } else {
        let verb = if unused.len() == 1 {
            "applies"
        } else {
            "apply"
        };
        format!(" ({} {verb} to the GPU layer only)", unused.join(" and "))
    };
    Ok((
        false,
        Some(format!(
            "no GPU ({cause}){unused}: running the CPU reference"
        )),
    ))
}

/// "1 rank", "2 ranks".
fn plural(n: usize, noun: &str) -> String {
    match n {
        1 => format!("1 {noun}"),
        _ => format!("{n} {noun}s"),
    }
}

fn print_table(r: &RunReport, shape: &megamoe_core::Shape) {
    println!(
        "megamoe run: {} (H {}, I {}, E {}, top-{}), {} x {}, G {}, backend {}{}{}",
        r.preset,
        shape.hidden,
        shape.inter,
        shape.experts,
        shape.topk,
        plural(r.ranks, "rank"),
        plural(r.tokens_per_rank, "token"),
        r.group,
        r.backend,
        r.kernel.map_or(String::new(), |k| format!(" ({k})")),
        r.accumulation
            .map_or(String::new(), |a| format!(", {a} accumulation"))
    );
    let sci = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3e}"));
    println!(
        "{:>8} {:>12} {:>12} {:>10} {:>14} {:>14} {:>18}",
        "tokens",
        "valid slots",
        "time (ms)",
        "TFLOP/s",
        "diff vs ref",
        "diff vs f64",
        "output hash"
    );
    println!(
        "{:>8} {:>12} {:>12.2} {:>10.4} {:>14} {:>14} {:>18}",
        r.tokens,
        r.valid_slots,
        r.time_ms,
        r.tflops,
        sci(r.diff_vs_reference.flatten()),
        sci(r.diff_vs_f64),
        r.output_hash
    );
}
