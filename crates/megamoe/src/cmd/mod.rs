pub mod bench_dispatch;
pub mod selftest;
