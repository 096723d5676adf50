//! `megamoe bench nvlink`: pull and push GB/s per GPU between GPUs 0 and 1, with one and both
//! directions busy, against the copy engine and the NVLink floor.

use megamoe_core::floor::NVLINK_BYTES_PER_S;
use megamoe_cuda::bench;

use crate::args;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, default_value_t = 256, value_parser = args::count(&args::MIB),
          allow_hyphen_values = true, help = args::help("MiB moved per transfer", &args::MIB))]
    pub mib: usize,
    #[arg(long, value_delimiter = ',', default_value = "16,32,66,132",
          value_parser = args::count(&args::COPY_BLOCKS), allow_hyphen_values = true,
          help = args::help("Thread-block counts of the copy kernel to measure", &args::COPY_BLOCKS))]
    pub blocks: Vec<usize>,
    #[arg(long, default_value_t = 20, value_parser = args::count(&args::ITERS),
          allow_hyphen_values = true,
          help = args::help("Timed transfers per measurement (median reported)", &args::ITERS))]
    pub iters: usize,
}

pub fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    super::require_gpu("bench nvlink")?;
    // COPY_BLOCKS keeps every count within u32.
    let blocks: Vec<u32> = args.blocks.iter().map(|&b| b as u32).collect();
    let rows = bench::nvlink(args.mib << 20, &blocks, args.iters)?;
    println!(
        "NVLink exchange, {} MiB per transfer, median of {} (floor {:.0} GB/s per direction)",
        args.mib,
        args.iters,
        NVLINK_BYTES_PER_S / 1e9
    );
    println!(
        "{:12} {:>6} {:>6} {:>10} {:>10}",
        "mode", "dirs", "blocks", "GPU0 GB/s", "GPU1 GB/s"
    );
    for r in rows {
        let blocks = r.blocks.map_or("-".to_string(), |b| b.to_string());
        let g1 = r.gbps.get(1).map_or("-".to_string(), |g| format!("{g:.1}"));
        println!(
            "{:12} {:>6} {:>6} {:>10.1} {:>10}",
            r.mode, r.directions, blocks, r.gbps[0], g1
        );
    }
    Ok(())
}
