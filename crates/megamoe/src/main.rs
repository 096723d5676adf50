//! `megamoe`: the command line of the megamoe expert-parallel MoE layer. A thin shell: every
//! subcommand lives in its own file under `cmd/` and calls the library crates.

mod cmd;

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
    /// Run every GPU check the binary holds and print pass/fail per check.
    Selftest(cmd::selftest::Args),
    /// List GPUs, peer access, library versions and the JIT cache.
    Info(cmd::info::Args),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(Bench),
}

#[derive(Subcommand)]
enum Bench {
    /// NVLink exchange between GPUs 0 and 1: pull and push GB/s, one and both directions.
    Nvlink(cmd::bench_nvlink::Args),
    /// bf16 -> e4m3 per-128 quantization against the HBM floor.
    Quant(cmd::bench_quant::Args),
}

fn main() {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Selftest(args) => cmd::selftest::run(args),
        Command::Info(args) => cmd::info::run(args),
        Command::Bench(Bench::Nvlink(args)) => cmd::bench_nvlink::run(args),
        Command::Bench(Bench::Quant(args)) => cmd::bench_quant::run(args),
    };
    if let Err(err) = result {
        eprintln!("megamoe: error: {err}");
        std::process::exit(1);
    }
}
