//! `megamoe`: the command line of the megamoe expert-parallel MoE layer. A thin shell: every
//! subcommand lives in its own file under `cmd/` and calls the library crates.

mod cmd;
mod progress;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    /// Run the fused MoE layer on a generated batch (the CPU reference where no GPU layer runs).
    Run(cmd::run::RunArgs),
    /// Symmetric-buffer sizes (split vs fused) and the schedule of one preset.
    Plan(cmd::plan::PlanArgs),
    /// Benchmarks next to their floors.
    Bench {
        #[command(subcommand)]
        what: Bench,
    },
    /// GPU correctness checks (the grouped GEMM's, in this build).
    Selftest,
}

#[derive(Subcommand)]
enum Bench {
    /// FP8 grouped GEMM (L1 or L2 of one MoE layer) with the floor and DeepGEMM's time.
    Gemm(cmd::bench_gemm::BenchGemmArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Run(args) => cmd::run::run(args),
        Command::Plan(args) => cmd::plan::run(args),
        Command::Bench {
            what: Bench::Gemm(args),
        } => cmd::bench_gemm::run(args),
        Command::Selftest => cmd::selftest_gemm::run(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("megamoe: error: {e}");
            ExitCode::FAILURE
        }
    }
}
