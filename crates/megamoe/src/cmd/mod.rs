//! One file per subcommand.

pub mod bench_dispatch;
pub mod plan;
pub mod run;
pub mod selftest;
