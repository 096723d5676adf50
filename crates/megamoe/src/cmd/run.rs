//! `megamoe run`: runs the fused MoE layer on a generated batch and reports time, accuracy
//! against the unquantized f64 layer and a hash of the output bits.

use std::time::Instant;

use clap::{Args, ValueEnum};
use megamoe_core::routing::{generate_world, RoutingKind, RoutingSpec};
use megamoe_core::{diff, fused_layer_and_f64, LayerOptions, Preset, WeightGen};
use serde::Serialize;

use crate::progress::Progress;

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Model shape: flash, pro, dsv3, glm or tiny.
    #[arg(long, default_value = "tiny")]
    preset: String,
    /// Ranks in the expert-parallel world, R.
    #[arg(long, default_value_t = 2)]
    ranks: usize,
    /// Tokens per rank, T.
    #[arg(long, default_value_t = 64)]
    tokens: usize,
    /// Expert choice: top-k of Gaussian scores, or skewed by a Zipf law of expert popularity.
    #[arg(long, value_enum, default_value_t = RoutingArg::Uniform)]
    routing: RoutingArg,
    /// Exponent of the Zipf law when --routing zipf.
    #[arg(long, default_value_t = 1.0)]
    zipf_exponent: f64,
    /// Fraction of slots masked (−1), in [0, 1].
    #[arg(long, default_value_t = 0.0)]
    masked: f64,
    /// Give the ranks different token counts (same total).
    #[arg(long)]
    uneven: bool,
    /// Seed of every generated input and weight.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Columns per scale of the re-quantized intermediate (64 or 128; default by SPEC §3).
    #[arg(long)]
    gran: Option<usize>,
    /// SwiGLU clamp c.
    #[arg(long)]
    clamp: Option<f32>,
    /// Where the layer runs.
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    backend: Backend,
    /// Print one JSON object instead of the table.
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
    /// The GPU layer where this build has one for the machine, else the CPU reference (and a
    /// note that says why).
    Auto,
    /// The CPU reference (SPEC §3).
    Cpu,
}

#[derive(Serialize)]
struct RunReport {
    backend: &'static str,
    preset: &'static str,
    ranks: usize,
    tokens_per_rank: usize,
    tokens: usize,
    valid_slots: usize,
    routing: RoutingSpec,
    group: usize,
    /// Wall time of the layer (input generation excluded). The CPU reference computes the f64
    /// layer in the same pass over the experts (both share each generated weight strip), so on
    /// the CPU this is the time of both.
    time_ms: f64,
    /// FLOPs of the valid slots over `time_ms`.
    tflops: f64,
    diff_vs_f64: f64,
    output_hash: String,
    /// Why `--backend auto` ran the CPU reference (absent for `--backend cpu`).
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

pub fn run(args: &RunArgs) -> Result<(), Box<dyn std::error::Error>> {
    let preset = Preset::by_name(&args.preset)?;
    let shape = preset.shape;
    shape.validate(args.ranks)?;
    let mut options = LayerOptions::for_shape(&shape);
    if let Some(group) = args.gran {
        options.group = group;
    }
    options.clamp = args.clamp;
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
    let (backend, note) = choose_backend(args.backend);

    let world = generate_world(shape, args.ranks, args.tokens, &spec)?;
    let weights = WeightGen::new(shape, args.seed);

    let bar = Progress::new("layer and f64 ");
    let start = Instant::now();
    let (out, exact) = fused_layer_and_f64(&world, &weights, &options, &|done, total| {
        bar.update(done, total)
    })?;
    let time_ms = start.elapsed().as_secs_f64() * 1e3;
    bar.finish();

    let valid_slots = world.valid_slots();
    let report = RunReport {
        backend,
        preset: preset.name,
        ranks: args.ranks,
        tokens_per_rank: args.tokens,
        tokens: world.global_tokens(),
        valid_slots,
        routing: spec,
        group: options.group,
        time_ms,
        tflops: valid_slots as f64 * shape.flops_per_slot() / (time_ms * 1e-3) / 1e12,
        diff_vs_f64: diff::diff_bf16_f64(&out, &exact),
        output_hash: format!("{:016x}", diff::output_hash(&out)),
        note,
    };
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

/// The backend `--backend` runs on in this build, and for `auto` a note saying why: the GPU
/// layer is not part of the build yet, so `auto` runs the CPU reference on every machine.
fn choose_backend(backend: Backend) -> (&'static str, Option<String>) {
    let note = match backend {
        Backend::Cpu => None,
        // A missing driver is "no GPU" too; `megamoe info` says what was looked for.
        Backend::Auto => Some(match megamoe_cuda::device_count().unwrap_or(0) {
            0 => "no GPU: running the CPU reference".to_string(),
            gpus => format!(
                "{gpus} GPU(s) visible, but this build has no GPU layer yet: running the CPU reference"
            ),
        }),
    };
    ("cpu", note)
}

fn print_table(r: &RunReport, shape: &megamoe_core::Shape) {
    println!(
        "megamoe run: {} (H {}, I {}, E {}, top-{}), {} ranks x {} tokens, G {}, backend {}",
        r.preset,
        shape.hidden,
        shape.inter,
        shape.experts,
        shape.topk,
        r.ranks,
        r.tokens_per_rank,
        r.group,
        r.backend
    );
    println!(
        "{:>8} {:>12} {:>12} {:>10} {:>14} {:>18}",
        "tokens", "valid slots", "time (ms)", "TFLOP/s", "diff vs f64", "output hash"
    );
    println!(
        "{:>8} {:>12} {:>12.2} {:>10.4} {:>14.3e} {:>18}",
        r.tokens, r.valid_slots, r.time_ms, r.tflops, r.diff_vs_f64, r.output_hash
    );
}
