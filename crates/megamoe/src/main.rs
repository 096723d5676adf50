mod cmd;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "megamoe", about = "Expert-parallel MoE layer for Hopper")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        what: Bench,
    },
    /// GPU correctness checks.
    Selftest,
}

#[derive(Subcommand)]
enum Bench {
    /// FP8 grouped GEMM (L1 or L2 of one MoE layer).
    Gemm(cmd::bench_gemm::BenchGemmArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench {
            what: Bench::Gemm(args),
        } => cmd::bench_gemm::run(args),
        Command::Selftest => cmd::selftest_gemm::run(),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
