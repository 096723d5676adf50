//! One file per subcommand.

pub mod bench_dispatch;
pub mod bench_gemm;
pub mod bench_layer;
pub mod bench_nvlink;
pub mod bench_quant;
pub mod ep_procs;
pub mod info;
pub mod plan;
pub mod run;
pub mod selftest;
pub mod soak;

/// The GPUs visible, or why `megamoe COMMAND` cannot run here (one line, before any work).
pub fn require_gpu(command: &str) -> Result<usize, String> {
    match megamoe_cuda::device_count() {
        Ok(0) => Err(format!(
            "no GPU: `megamoe {command}` needs a CUDA GPU (none is visible)"
        )),
        Err(e) => Err(format!("no GPU: `megamoe {command}` needs a CUDA GPU: {e}")),
        Ok(n) => Ok(n),
    }
}
