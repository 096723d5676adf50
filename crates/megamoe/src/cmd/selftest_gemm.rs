//! The grouped GEMM's GPU checks (every heuristic configuration against the CPU reference).

use megamoe_cuda::Gpu;
use megamoe_gemm::checks::gpu_checks;

pub fn run() -> Result<(), Box<dyn std::error::Error>> {
    let gpu = Gpu::new(0)?;
    let mut failed = 0;
    for check in gpu_checks(gpu.props().sm_count as usize) {
        match (check.run)(&gpu) {
            Ok(summary) => println!("ok    {}: {summary}", check.name),
            Err(why) => {
                failed += 1;
                println!("FAIL  {}: {why}", check.name);
            }
        }
    }
    if failed > 0 {
        return Err(format!("{failed} grouped GEMM checks failed").into());
    }
    Ok(())
}
