//! `megamoe bench quant`: bf16 -> e4m3 per-128 quantization time against the HBM floor.

use megamoe_core::limits;
use megamoe_cuda::kernels::QuantConfig;
use megamoe_cuda::{bench, Gpu};

use crate::args;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, value_delimiter = ',', default_value = "1024,4096,8192",
          value_parser = args::count(&args::BENCH_TOKENS), allow_hyphen_values = true,
          help = args::help("Tokens (rows)", &args::BENCH_TOKENS))]
    pub tokens: Vec<usize>,
    #[arg(long, default_value_t = 7168, value_parser = args::count(&limits::HIDDEN),
          allow_hyphen_values = true, help = args::help("Hidden size (columns)", &limits::HIDDEN))]
    pub hidden: usize,
    /// Configurations to compare: `b<blocks per half-warp>[p<thread blocks per SM>]`.
    #[arg(long, value_delimiter = ',', default_value = "b1,b2,b4,b2p4")]
    pub configs: Vec<QuantConfig>,
    #[arg(long, default_value_t = 20, value_parser = args::count(&args::ITERS),
          allow_hyphen_values = true,
          help = args::help("Timed launches per shape (median reported)", &args::ITERS))]
    pub iters: usize,
}

pub fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    super::require_gpu("bench quant")?;
    let gpu = Gpu::new(0)?;
    println!(
        "quantization bf16 -> e4m3 + f32 scales per 128, median of {}",
        args.iters
    );
    println!(
        "{:>6} {:>6} {:>6} {:>10} {:>10} {:>10} {:>8} {:>9}",
        "T", "H", "config", "median us", "min us", "floor us", "TB/s", "of floor"
    );
    for &t in &args.tokens {
        for r in bench::quant(&gpu, t, args.hidden, &args.configs, args.iters)? {
            let s = r.stats;
            println!(
                "{:>6} {:>6} {:>6} {:>10.1} {:>10.1} {:>10.1} {:>8.2} {:>8.0}%",
                r.rows,
                r.cols,
                r.config.to_string(),
                s.median_ms * 1e3,
                s.min_ms * 1e3,
                r.floor_ms * 1e3,
                r.bytes as f64 / (s.median_ms * 1e-3) / 1e12,
                r.floor_ms / s.median_ms * 100.0
            );
        }
    }
    Ok(())
}
