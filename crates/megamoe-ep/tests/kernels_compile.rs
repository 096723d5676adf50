//! Every kernel builds for sm_90a under NVRTC with no spill, stack frame or local memory (needs
//! NVRTC, not a GPU; without NVRTC it fails and says how to get it).

#[test]
fn kernels_compile_clean() {
    megamoe_cuda::jit::assert_compiles_clean(&megamoe_ep::kernel_specs());
}
