use clap::{Parser, Subcommand};

mod cmd;

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
    /// Runs the GPU checks (bitwise against the CPU reference).
    Selftest(cmd::selftest::Args),
}

#[derive(Subcommand)]
enum Bench {
    /// Dispatch and combine with fused permute, against the NCCL all-to-all path.
    Dispatch(cmd::bench_dispatch::Args),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench {
            what: Bench::Dispatch(args),
        } => cmd::bench_dispatch::run(args),
        Command::Selftest(args) => cmd::selftest::run(args),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
