//! Compiles every registered kernel configuration of this crate with NVRTC to an sm_90a CUBIN
//! and fails on any compile error, spill, stack frame or local memory. Needs NVRTC, not a GPU:
//! `scripts/install-cuda-toolchain.sh` installs it into `.toolchain/`. Without NVRTC this test
//! fails (with that instruction) rather than pass silently.

#[test]
fn every_registered_kernel_compiles_clean() {
    megamoe_cuda::jit::assert_compiles_clean(&megamoe_cuda::kernels::kernel_specs());
}
