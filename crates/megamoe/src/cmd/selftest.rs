//! `megamoe selftest`: every GPU check the binary holds (the runtime's, the grouped GEMM's,
//! dispatch/combine's, then the layer's), pass/fail per check.

use megamoe_cuda::Gpu;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// Run only the checks whose name contains this text.
    #[arg(long)]
    pub only: Option<String>,
}

type CheckFn = Box<dyn Fn() -> Result<String, String>>;

pub fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    match megamoe_cuda::device_count() {
        Ok(0) => {
            return Err("no GPU: `megamoe selftest` needs a CUDA GPU (none is visible)".into())
        }
        Err(e) => return Err(format!("no GPU: {e}").into()),
        Ok(_) => {}
    }
    let mut checks: Vec<(String, CheckFn)> = megamoe_cuda::selftest::checks()
        .into_iter()
        .map(|c| {
            let run: CheckFn = Box::new(move || (c.run)().map_err(|e| e.to_string()));
            (c.name.to_string(), run)
        })
        .collect();
    let gpu = std::rc::Rc::new(Gpu::new(0)?);
    for check in megamoe_gemm::checks::gpu_checks(gpu.props().sm_count as usize) {
        let gpu = gpu.clone();
        let run: CheckFn = Box::new(move || (check.run)(&gpu));
        checks.push((check.name, run));
    }
    for check in megamoe_ep::selftest::gpu_checks() {
        checks.push((check.name, check.run));
    }
    for check in megamoe_layer::selftest::gpu_checks() {
        checks.push((check.name, check.run));
    }
    checks.retain(|(name, _)| args.only.as_deref().is_none_or(|o| name.contains(o)));
    if checks.is_empty() {
        return Err("no check matches `--only`".into());
    }
    // The GEMM checks would compile their kernels one after the other; compiled in parallel
    // first, the checks find them in this process's JIT memo. A kernel that fails here fails
    // its check again below, with the same error.
    if checks.iter().any(|(name, _)| name.starts_with("gemm ")) {
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
    for (name, run) in &checks {
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
