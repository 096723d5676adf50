//! `megamoe bench nvlink`: pull and push GB/s per GPU between GPUs 0 and 1, with one and both
//! directions busy, against the copy engine and the NVLink floor.

use megamoe_core::floor::NVLINK_BYTES_PER_S;
use megamoe_cuda::bench;

#[derive(clap::Args)]
pub struct Args {
    /// MiB moved per transfer.
    #[arg(long, default_value_t = 256)]
    pub mib: usize,
    /// Thread-block counts of the copy kernel to measure.
    #[arg(long, value_delimiter = ',', default_value = "16,32,66,132")]
    pub blocks: Vec<u32>,
    /// Timed transfers per measurement (median reported).
    #[arg(long, default_value_t = 20)]
    pub iters: usize,
}

pub fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let rows = bench::nvlink(args.mib << 20, &args.blocks, args.iters)?;
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
