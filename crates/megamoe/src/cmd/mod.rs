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
