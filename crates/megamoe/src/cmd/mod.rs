pub mod bench_gemm;
pub mod selftest_gemm;
