//! megamoe: the command line of the expert-parallel MoE layer.

mod cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "megamoe", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Symmetric-buffer sizes (split vs fused) and the schedule of one preset.
    Plan(cmd::plan::PlanArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Plan(args) => cmd::plan::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("megamoe: {e}");
            ExitCode::FAILURE
        }
    }
}
