//! The kernel's single parameter struct, laid out exactly as `GroupedGemmParams` in
//! device/megamoe_gemm/impls/grouped_gemm_params.cuh (which asserts the same size and alignment).

use megamoe_cuda::{Pod, TensorMap};

/// Parameters of one grouped GEMM launch (see the device header for each field's meaning).
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
pub struct GroupedGemmParams {
    pub tma_a: TensorMap,
    pub tma_b: TensorMap,
    pub tma_sa: TensorMap,
    pub tma_d: TensorMap,
    pub out: u64,
    pub scale_b: u64,
    pub expert_rows: u64,
    pub error: u64,
    pub timeout_ns: u64,
    pub num_experts: u32,
    pub n: u32,
    pub k: u32,
    pub max_m: u32,
    pub group_m: u32,
    pub reserved: [u32; 3],
}

const _: () = assert!(std::mem::size_of::<GroupedGemmParams>() == 640);
const _: () = assert!(std::mem::align_of::<GroupedGemmParams>() == 64);
const _: () = assert!(std::mem::offset_of!(GroupedGemmParams, out) == 512);
const _: () = assert!(std::mem::offset_of!(GroupedGemmParams, num_experts) == 552);
const _: () = assert!(std::mem::offset_of!(GroupedGemmParams, group_m) == 568);
// SAFETY: plain data (tensor maps, integers), no padding the device reads, size asserted above.
unsafe impl Pod for GroupedGemmParams {}
