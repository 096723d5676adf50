//! Every configuration the heuristics can pick compiles to an sm_90a CUBIN with no spill, stack
//! frame, local memory or wgmmas serialized by ptxas (needs NVRTC, not a GPU; without NVRTC it
//! fails and says how to get it).

#[test]
fn every_config_compiles_clean() {
    megamoe_cuda::jit::assert_compiles_clean(&megamoe_gemm::kernel::kernel_specs());
}
