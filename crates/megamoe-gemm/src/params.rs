//! The kernel's single parameter struct, laid out exactly as `GroupedGemmParams` in
//! kernels/impls/grouped_gemm_params.cuh.

/// An encoded CUtensorMap: 128 opaque bytes, 64-byte aligned.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
pub struct TmaDesc(pub [u64; 16]);

/// Parameters of one grouped GEMM launch (see the device header for each field's meaning).
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
pub struct GroupedGemmParams {
    pub tma_a: TmaDesc,
    pub tma_b: TmaDesc,
    pub tma_sa: TmaDesc,
    pub tma_d: TmaDesc,
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

const _: () = assert!(std::mem::size_of::<TmaDesc>() == 128);
const _: () = assert!(std::mem::align_of::<TmaDesc>() == 64);
const _: () = assert!(std::mem::size_of::<GroupedGemmParams>() == 640);
const _: () = assert!(std::mem::align_of::<GroupedGemmParams>() == 64);
const _: () = assert!(std::mem::offset_of!(GroupedGemmParams, out) == 512);
const _: () = assert!(std::mem::offset_of!(GroupedGemmParams, num_experts) == 552);
const _: () = assert!(std::mem::offset_of!(GroupedGemmParams, group_m) == 568);
