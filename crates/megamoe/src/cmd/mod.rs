//! One file per subcommand.

pub mod bench_nvlink;
pub mod bench_quant;
pub mod info;
pub mod selftest;
