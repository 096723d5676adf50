//! One file per subcommand.

pub mod bench_gemm;
pub mod plan;
pub mod run;
pub mod selftest_gemm;
