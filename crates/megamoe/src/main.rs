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
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        what: Bench,
    },
    /// The GPU checks (bitwise against the CPU reference); says so when no GPU is present.
    Selftest(cmd::selftest::Args),
}

#[derive(Subcommand)]
enum Bench {
    /// Dispatch and combine with fused permute, against the NCCL all-to-all path.
    Dispatch(cmd::bench_dispatch::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result: Result<(), Box<dyn std::error::Error>> = match cli.command {
        Command::Run(args) => cmd::run::run(&args),
        Command::Plan(args) => cmd::plan::run(&args),
        Command::Bench {
            what: Bench::Dispatch(args),
        } => cmd::bench_dispatch::run(args),
        Command::Selftest(args) => cmd::selftest::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("megamoe: error: {e}");
            ExitCode::FAILURE
        }
    }
}
