//! Every configuration the heuristics can pick compiles to an sm_90a CUBIN without spills.
//! Needs libnvrtc (not a GPU); where it cannot be loaded the test says so and checks nothing.

use megamoe_gemm::heuristics::all_configs;
use megamoe_gemm::runtime::{compile, probe_nvrtc};

#[test]
fn every_config_compiles_without_spills() {
    if let Err(e) = probe_nvrtc() {
        eprintln!("SKIPPED: {e} (put libnvrtc on LD_LIBRARY_PATH to run this check)");
        return;
    }
    for config in all_configs(132) {
        let cubin = compile(&config).unwrap_or_else(|e| panic!("{e}"));
        eprintln!("{}: {:?}", config.kernel_name(), cubin.report);
        assert!(!cubin.image.is_empty());
        assert!(cubin.report.registers > 0, "no ptxas report for {}", config.kernel_name());
        assert!(!cubin.report.spills(), "{} spills: {:?}", config.kernel_name(), cubin.report);
    }
}
