//! `megamoe`: the command line of the megamoe expert-parallel MoE layer. A thin shell: every
//! subcommand lives in its own file under `cmd/` and calls the library crates.

mod args;
mod cmd;
mod jsonl;
mod progress;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "megamoe",
    version,
    about = "Expert-parallel MoE layer for Hopper GPUs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the MoE layer on a generated batch (on the GPU when one is usable, else the CPU
    /// reference).
    Run(cmd::run::RunArgs),
    /// Symmetric-buffer sizes (split vs fused) and the schedule of one preset.
    Plan(cmd::plan::PlanArgs),
    /// Run every GPU check the binary holds and print pass/fail per check.
    Selftest(cmd::selftest::Args),
    /// Thousands of forward calls of both layer kinds on random shapes, routings and bounds,
    /// every output checked, device and host memory watched.
    Soak(cmd::soak::Args),
    /// List GPUs, peer access, library versions and the JIT cache.
    Info(cmd::info::Args),
    /// Dispatch and combine with one process per rank on one GPU (CUDA IPC), bit for bit
    /// against the CPU reference, and a missing peer failing within the deadline.
    EpProcs(cmd::ep_procs::Args),
    /// One rank of `ep-procs` (started by it).
    #[command(hide = true)]
    EpRank(cmd::ep_procs::RankArgs),
    /// Benchmarks next to their floors.
    #[command(subcommand)]
    Bench(Bench),
}

#[derive(Subcommand)]
enum Bench {
    /// FP8 grouped GEMM (L1 or L2 of one MoE layer) with the floor and DeepGEMM's time.
    Gemm(cmd::bench_gemm::BenchGemmArgs),
    /// NVLink exchange between GPUs 0 and 1: pull and push GB/s, one and both directions.
    Nvlink(cmd::bench_nvlink::Args),
    /// bf16 -> e4m3 per-128 quantization against the HBM floor.
    Quant(cmd::bench_quant::Args),
    /// Dispatch and combine with fused permute, against the NCCL all-to-all path.
    Dispatch(cmd::bench_dispatch::Args),
    /// The MoE layer against its floor and our two GEMMs alone, arms interleaved.
    Layer(cmd::bench_layer::Args),
}

/// Exit status of bad input (clap's own for a parse error); 1 is any other failure.
const USAGE_EXIT: u8 = 2;

fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    // Under --json (a flag, or a bench's output path) an error is a JSON object on stdout too.
    let json = argv
        .iter()
        .skip(1)
        .any(|a| a == "--json" || a.to_str().is_some_and(|a| a.starts_with("--json=")));
    let command = Cli::command().after_help(args::limits_help());
    let cli = match command
        .try_get_matches_from(&argv)
        .and_then(|m| Cli::from_arg_matches(&m))
    {
        Ok(cli) => cli,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            e.exit()
        }
        Err(e) => return fail(json, USAGE_EXIT, &parse_error(&e)),
    };
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is::<args::Usage>() => fail(json, USAGE_EXIT, &e.to_string()),
        Err(e) => fail(json, 1, &e.to_string()),
    }
}

/// clap's error as one line: its first paragraph (a missing argument lists the flags on the
/// lines below its first), without the "error: " prefix.
fn parse_error(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let first: Vec<&str> = text
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect();
    first.join(" ").trim_start_matches("error: ").to_string()
}

/// Reports an error: one line on stderr, or under --json one JSON object on stdout.
fn fail(json: bool, status: u8, message: &str) -> ExitCode {
    if json {
        let kind = if status == USAGE_EXIT {
            "usage"
        } else {
            "failure"
        };
        println!(
            "{}",
            serde_json::json!({ "error": message, "kind": kind, "exit_status": status })
        );
    } else {
        eprintln!("megamoe: error: {message}");
    }
    ExitCode::from(status)
}

fn run(cli: &Cli) -> Result<(), Box<dyn std::error::Error>> {
    match &cli.command {
        Command::Run(args) => cmd::run::run(args),
        Command::Plan(args) => cmd::plan::run(args),
        Command::Selftest(args) => cmd::selftest::run(args),
        Command::Soak(args) => cmd::soak::run(args),
        Command::Info(args) => cmd::info::run(args),
        Command::EpProcs(args) => cmd::ep_procs::run(args),
        Command::EpRank(args) => cmd::ep_procs::run_rank(args),
        Command::Bench(Bench::Gemm(args)) => cmd::bench_gemm::run(args),
        Command::Bench(Bench::Nvlink(args)) => cmd::bench_nvlink::run(args),
        Command::Bench(Bench::Quant(args)) => cmd::bench_quant::run(args),
        Command::Bench(Bench::Dispatch(args)) => cmd::bench_dispatch::run(args),
        Command::Bench(Bench::Layer(args)) => cmd::bench_layer::run(args),
    }
}
