//! `megamoe bench gemm`: the FP8 grouped GEMM of one MoE layer's L1 or L2, timed next to its
//! floor (SPEC §8: FLOPs and HBM bytes at the measured rates) and DeepGEMM's measured time.

use clap::{Args, ValueEnum};
use std::io::Write;

use megamoe_core::{Accumulation, Preset, Shape};
use megamoe_cuda::Gpu;
use megamoe_gemm::bench::{run_arms, Arm, BenchOptions};
use megamoe_gemm::checks::max_diff;
use megamoe_gemm::heuristics::{GemmProblem, Layout, OutDtype};
use megamoe_gemm::testdata::group_sizes;

use crate::args::{self, usage};
use crate::jsonl::{Output, Setup};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GemmShape {
    /// x · W1ᵀ: K = H, N = 2I.
    L1,
    /// a · W2ᵀ: K = I, N = H.
    L2,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GemmLayout {
    Contiguous,
    Masked,
}

#[derive(Args, Debug)]
pub struct BenchGemmArgs {
    #[arg(long, value_enum, default_value = "l1")]
    pub shape: GemmShape,
    #[arg(long, default_value = "flash")]
    pub preset: String,
    #[arg(long, value_delimiter = ',', default_value = "192",
          value_parser = args::count(&args::ROWS_PER_EXPERT), allow_hyphen_values = true,
          help = args::help(
              "Mean rows per expert; a comma-separated list runs several sizes",
              &args::ROWS_PER_EXPERT))]
    pub rows_per_expert: Vec<usize>,
    #[arg(long, value_enum, default_value = "contiguous")]
    pub layout: GemmLayout,
    #[arg(long, default_value_t = 128, value_parser = args::count(&args::GEMM_EXPERTS),
          allow_hyphen_values = true,
          help = args::help(
              "Local experts (128 = the flash preset's 256 over EP2)",
              &args::GEMM_EXPERTS))]
    pub experts: usize,
    #[arg(long, default_value_t = 20, value_parser = args::count(&args::ITERS),
          allow_hyphen_values = true, help = args::help("Timed launches per case", &args::ITERS))]
    pub iters: usize,
    /// Seed of the operands (any u64).
    #[arg(long, default_value_t = 1, value_parser = args::seed, allow_hyphen_values = true)]
    pub seed: u64,
    /// Overrides the heuristic's BLOCK_N (128, 192 or 256; tuning knob); a comma-separated
    /// list runs each case once per value (and per cluster size),
    /// interleaved on the same operands.
    #[arg(long, value_delimiter = ',', value_parser = args::one_of(&[128, 192, 256]),
          allow_hyphen_values = true)]
    pub block_n: Vec<usize>,
    /// Stores tiles straight from registers instead of through TMA (tuning knob).
    #[arg(long)]
    pub direct_store: bool,
    /// Contiguous segment padding (64 or 128; default 64 up to 64 rows per expert, else 128); a
    /// comma-separated list runs each size once per padding, interleaved.
    #[arg(long, value_delimiter = ',', value_parser = args::one_of(&[64, 128]),
          allow_hyphen_values = true)]
    pub pad: Vec<usize>,
    #[arg(long, value_parser = args::count(&args::GROUP_M), allow_hyphen_values = true,
          help = args::help(
              "m-blocks of one expert walked together per n-block (overrides the heuristic's)",
              &args::GROUP_M))]
    pub group_m: Option<usize>,
    /// CTAs per cluster sharing the weight tile (1 or 2; tuning knob); a comma-separated list
    /// runs each case once per value, interleaved on the same operands.
    #[arg(long, value_delimiter = ',', value_parser = args::one_of(&[1, 2]),
          allow_hyphen_values = true)]
    pub cluster_m: Vec<usize>,
    #[arg(long, value_delimiter = ',', value_parser = args::accumulation,
          help = format!("{}; a comma-separated list runs each case once per value (and per \
                          cluster size), interleaved", args::ACCUMULATION_HELP))]
    pub accumulation: Vec<Accumulation>,
    /// Writes a 256 MiB buffer before every timed launch (outside its events), so each launch
    /// starts with an L2 that holds none of its operands, as DeepGEMM's benchmark does.
    #[arg(long)]
    pub flush_l2: bool,
    /// Append one JSON object per case (JSON Lines; group sizes included, for the torch
    /// comparison script) to this file; `-` writes them to stdout and the table to stderr.
    #[arg(long, alias = "json-out", value_name = "PATH")]
    pub json: Option<std::path::PathBuf>,
}

/// DeepGEMM 2.6.1 on our H200 (docs/PEERS.md, "FP8 grouped GEMM"), flash, 128 experts, contiguous: (shape, rows, µs).
const DEEPGEMM_US: &[(GemmShape, usize, f64)] = &[
    (GemmShape::L1, 32, 731.0),
    (GemmShape::L1, 192, 956.0),
    (GemmShape::L1, 512, 1947.0),
    (GemmShape::L1, 1024, 3896.0),
    (GemmShape::L2, 32, 389.0),
    (GemmShape::L2, 192, 509.0),
    (GemmShape::L2, 512, 1008.0),
    (GemmShape::L2, 1024, 1883.0),
];

pub fn run(args: &BenchGemmArgs) -> Result<(), Box<dyn std::error::Error>> {
    let preset = Preset::by_name(&args.preset).map_err(|e| usage("--preset", e))?;
    let s = preset.shape;
    let mut output = Output::open(args.json.as_deref())?;
    let mut table = output.table();
    // One line per case: `experts` is the GEMM's local experts; no routing, no tokens.
    let cells = Setup::new(
        "gemm",
        preset.name,
        &Shape {
            experts: args.experts,
            ..s
        },
        1,
        "synthetic",
    );
    let (n, k) = match args.shape {
        GemmShape::L1 => (2 * s.inter, s.hidden),
        GemmShape::L2 => (s.hidden, s.inter),
    };
    // SPEC §3 step 3: the intermediate's scale group.
    let l2_group = if s.hidden % 512 == 0 && (2 * s.inter) % 512 == 0 {
        128
    } else {
        64
    };
    let group_size = match args.shape {
        GemmShape::L1 => 128,
        GemmShape::L2 => l2_group,
    };
    super::require_gpu("bench gemm")?;
    let gpu = Gpu::new(0)?;
    writeln!(
        table,
        "| shape | layout | rows/expert | kernel | µs (min–max) | TFLOP/s | floor µs | ×floor | weight floor µs | DeepGEMM µs | diff |"
    )?;
    writeln!(table, "|---|---|---|---|---|---|---|---|---|---|---|")?;
    let pads: Vec<Option<usize>> = match args.layout {
        GemmLayout::Contiguous => args.pad.iter().map(|&p| Some(p)).collect(),
        GemmLayout::Masked => vec![None],
    };
    let pads = if pads.is_empty() { vec![None] } else { pads };
    let clusters: Vec<Option<usize>> = if args.cluster_m.is_empty() {
        vec![None]
    } else {
        args.cluster_m.iter().map(|&c| Some(c)).collect()
    };
    let accumulations = if args.accumulation.is_empty() {
        vec![Accumulation::PerBlock]
    } else {
        args.accumulation.clone()
    };
    let block_ns: Vec<Option<usize>> = if args.block_n.is_empty() {
        vec![None]
    } else {
        args.block_n.iter().map(|&b| Some(b)).collect()
    };
    let mut arms = Vec::new();
    for &block_n in &block_ns {
        for &cluster_m in &clusters {
            for &accumulation in &accumulations {
                arms.push(Arm {
                    block_n,
                    cluster_m,
                    accumulation,
                });
            }
        }
    }
    let mut cases = Vec::new();
    for &mean in &args.rows_per_expert {
        for &pad in &pads {
            cases.push((mean, pad));
        }
    }
    for (mean, pad) in cases {
        let rows = group_sizes(args.experts, mean, args.seed ^ mean as u64);
        let max_rows = *rows.iter().max().unwrap_or(&0);
        let layout = match args.layout {
            GemmLayout::Contiguous => Layout::Contiguous {
                pad: pad.unwrap_or(if mean <= 64 { 64 } else { 128 }),
            },
            GemmLayout::Masked => Layout::Masked {
                max_m: max_rows.div_ceil(4).max(1) * 4,
            },
        };
        let problem = GemmProblem {
            experts: args.experts,
            n,
            k,
            group_size,
            layout,
            out: OutDtype::Bf16,
            rows_per_expert: mean,
            accumulation: Accumulation::PerBlock,
        };
        let opts = BenchOptions {
            warmup: 3,
            iters: args.iters,
            direct_store: args.direct_store,
            group_m: args.group_m,
            flush_l2: args.flush_l2,
        };
        let results = run_arms(&gpu, problem, &rows, args.seed, &opts, &arms)?;
        for (arm, r) in arms.iter().zip(results) {
            let deepgemm = DEEPGEMM_US
                .iter()
                .find(|(sh, m, _)| {
                    *sh == args.shape
                        && *m == mean
                        && args.preset == "flash"
                        && args.experts == 128
                        && args.layout == GemmLayout::Contiguous
                })
                .map(|d| format!("{:.0}", d.2))
                .unwrap_or_else(|| "–".into());
            writeln!(
                table,
                "| {:?} | {} | {} | {} | {:.1} ({:.1}–{:.1}) | {:.0} | {:.1} | {:.2} | {:.1} | {} | {:.1e}{} |",
                args.shape,
                match layout {
                    Layout::Contiguous { pad } => format!("contiguous pad {pad}"),
                    Layout::Masked { .. } => "masked".into(),
                },
                mean,
                r.kernel,
                r.median_us,
                r.min_us,
                r.max_us,
                r.tflops,
                r.floor_us,
                r.median_us / r.floor_us,
                r.weight_floor_us,
                deepgemm,
                r.diff,
                if r.unwritten > 0 { " UNWRITTEN" } else { "" }
            )?;
            if r.diff > max_diff(arm.accumulation) || r.unwritten > 0 || r.diff.is_nan() {
                return Err(format!(
                    "{:?} {} rows: diff {:.2e}, {} bad rows",
                    args.shape, mean, r.diff, r.unwritten
                )
                .into());
            }
            let fields = serde_json::json!({
                "shape": format!("{:?}", args.shape), "layout": format!("{:?}", args.layout),
                "pad": match layout {
                    Layout::Contiguous { pad } => pad,
                    Layout::Masked { .. } => 0,
                },
                "cluster_m": arm.cluster_m.unwrap_or(1), "flush_l2": args.flush_l2, "block_n": arm.block_n,
                "accumulation": arm.accumulation.name(), "diff": r.diff,
                "rows_per_expert": mean, "n": n, "k": k, "group_sizes": rows,
                "min_us": r.min_us, "max_us": r.max_us, "weight_floor_us": r.weight_floor_us,
                "deepgemm_us": deepgemm, "kernel": r.kernel,
            });
            output.cell(&cells.cell(
                None,
                &r.kernel,
                r.median_us,
                Some(r.floor_us),
                Some(r.tflops),
                fields,
            ))?;
        }
    }
    Ok(())
}
