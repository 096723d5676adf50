//! Every kernel configuration of the layer compiles to sm_90a with no spills (NVRTC, no GPU).

#[test]
fn every_config_compiles_clean() {
    megamoe_cuda::jit::assert_compiles_clean(&megamoe_layer::kernel_specs());
}
