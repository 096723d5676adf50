//! The kernels build for sm_90a under NVRTC without register spills (needs NVRTC, not a GPU;
//! where NVRTC cannot be loaded the test says so and checks nothing).

#[test]
fn kernels_compile_for_sm90a_without_spills() {
    match megamoe_ep::gpu::compile() {
        Err(megamoe_ep::EpError::NoGpu(why)) => {
            eprintln!("NVRTC not available ({why}): kernel build not checked")
        }
        Err(e) => panic!("{e}"),
        Ok(cubin) => {
            assert!(!cubin.image.is_empty());
            for kernel in ["ep_dispatch", "ep_combine"] {
                assert!(cubin.log.contains(kernel), "{}", cubin.log);
            }
            assert!(
                !cubin.log.lines().any(|l| l.contains("spill")
                    && !l.contains("0 bytes spill stores, 0 bytes spill loads")),
                "{}",
                cubin.log
            );
            eprintln!("{}", cubin.log);
        }
    }
}
