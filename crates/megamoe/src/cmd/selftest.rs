//! `megamoe selftest`: the GPU checks, each with its verdict; fails if any fails.

use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// Only checks whose name contains this.
    #[arg(long)]
    pub filter: Option<String>,
}

pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    if let Err(e) = megamoe_ep::gpu::gpu_count().and_then(|n| {
        if n == 0 {
            Err(megamoe_ep::EpError::NoGpu("no device".into()))
        } else {
            Ok(n)
        }
    }) {
        println!("selftest: no GPU present ({e}); GPU checks not run");
        return Ok(());
    }
    let mut failed = 0;
    let mut ran = 0;
    for check in megamoe_ep::selftest::gpu_checks() {
        if args
            .filter
            .as_deref()
            .is_some_and(|f| !check.name.contains(f))
        {
            continue;
        }
        ran += 1;
        let start = Instant::now();
        match (check.run)() {
            Ok(summary) => println!(
                "PASS {} ({:.1} s): {summary}",
                check.name,
                start.elapsed().as_secs_f64()
            ),
            Err(e) => {
                failed += 1;
                println!(
                    "FAIL {} ({:.1} s): {e}",
                    check.name,
                    start.elapsed().as_secs_f64()
                );
            }
        }
    }
    println!("selftest: {} of {ran} checks passed", ran - failed);
    if failed > 0 {
        return Err(format!("{failed} check(s) failed").into());
    }
    Ok(())
}
