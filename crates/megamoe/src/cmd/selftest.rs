//! `megamoe selftest`: every GPU check the binary holds (the runtime's, the grouped GEMM's,
//! dispatch/combine's, then the layer's), pass/fail per check.

use megamoe_cuda::selftest::Check;
use megamoe_cuda::Gpu;
use std::rc::Rc;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// Run only the checks whose name contains one of these texts (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
}

pub fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    super::require_gpu("selftest")?;
    let mut checks = megamoe_cuda::selftest::checks();
    checks.extend(megamoe_gemm::checks::gpu_checks(&Rc::new(Gpu::new(0)?)));
    checks.extend(megamoe_ep::selftest::gpu_checks());
    checks.extend(megamoe_layer::selftest::gpu_checks());
    checks
        .retain(|c| args.only.is_empty() || args.only.iter().any(|o| c.name.contains(o.as_str())));
    if checks.is_empty() {
        return Err("no check matches `--only`".into());
    }
    // The GEMM checks would compile their kernels one after the other; compiled in parallel
    // first, the checks find them in this process's JIT memo. A kernel that fails here fails
    // its check again below, with the same error.
    if checks.iter().any(|c| c.name.starts_with("gemm ")) {
        let start = Instant::now();
        let failed = megamoe_cuda::jit::compile_all_clean(&megamoe_gemm::kernel::kernel_specs())
            .err()
            .map_or(0, |errors| errors.len());
        println!(
            "compiled the GEMM kernels in parallel: {:.1} s, {failed} failed",
            start.elapsed().as_secs_f64()
        );
    }
    let mut failed = 0;
    for Check { name, run } in &checks {
        let start = Instant::now();
        let outcome = run();
        let ms = start.elapsed().as_secs_f64() * 1e3;
        match outcome {
            Ok(detail) => println!("PASS  {name:42} {ms:8.1} ms  {detail}"),
            Err(e) => {
                failed += 1;
                println!("FAIL  {name:42} {ms:8.1} ms  {e}");
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
