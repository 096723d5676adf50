//! `megamoe selftest`: every GPU check the binary holds, pass/fail per check.

use megamoe_cuda::selftest::checks;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// Run only the checks whose name contains this text.
    #[arg(long)]
    pub only: Option<String>,
}

pub fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    match megamoe_cuda::device_count() {
        Ok(0) => {
            return Err("no GPU: `megamoe selftest` needs a CUDA GPU (none is visible)".into())
        }
        Err(e) => return Err(format!("no GPU: {e}").into()),
        Ok(_) => {}
    }
    let checks: Vec<_> = checks()
        .into_iter()
        .filter(|c| args.only.as_deref().is_none_or(|o| c.name.contains(o)))
        .collect();
    if checks.is_empty() {
        return Err("no check matches `--only`".into());
    }
    let mut failed = 0;
    for check in &checks {
        let start = Instant::now();
        let outcome = (check.run)();
        let ms = start.elapsed().as_secs_f64() * 1e3;
        match outcome {
            Ok(detail) => println!("PASS  {:42} {ms:8.1} ms  {detail}", check.name),
            Err(e) => {
                failed += 1;
                println!("FAIL  {:42} {ms:8.1} ms  {e}", check.name);
            }
        }
    }
    println!(
        "{} of {} checks passed",
        checks.len() - failed,
        checks.len()
    );
    if failed > 0 {
        return Err(format!("{failed} check(s) failed").into());
    }
    Ok(())
}
