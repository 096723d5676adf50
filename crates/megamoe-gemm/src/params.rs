//! The kernel's single parameter struct and the params of its pieces, declared once here:
//! `MainloopParams`, `SchedulerParams`, `EpilogueParams` and their composition
//! `GroupedGemmParams`. Their C++ declarations (device/megamoe_gemm/mma/mainloop_params.cuh and
//! impls/grouped_gemm_params.cuh) are generated from these ([`generated_headers`]).

use megamoe_cuda::interface::{DeviceStruct, GeneratedHeader, Item};
use megamoe_cuda::TensorMap;

use crate::grouped::WAITS;
use crate::heuristics::{MAX_EXPERTS, MAX_K_BLOCKS};
use crate::kernel::THREADS;

megamoe_cuda::device_struct! {
    #[device(namespace = "megamoe::gemm")]
    /// The mainloop's parameters: what the TMA producer loads and the wgmma consumer multiplies
    /// and scales, and the deadline of both roles' waits.
    #[repr(C, align(64))]
    #[derive(Clone, Copy, Debug)]
    pub struct MainloopParams {
        /// e4m3 activations, 2-D {K, rows}; 128-byte swizzle, box {128, BLOCK_M}.
        pub tma_a: TensorMap,
        /// e4m3 weights W[E, N, K] as 2-D {K, E*N}; box {128, BLOCK_N}.
        pub tma_b: TensorMap,
        /// f32 activation scales, K-group-major 2-D {rows, groups}; box {BLOCK_M, 128/G}.
        pub tma_sa: TensorMap,
        /// f32 weight scales [E, N/128, K/128].
        pub scale_b: u64,
        /// megamoe::comm::WaitRecord; see WaitId.
        pub error: u64,
        /// Deadline of every device wait.
        pub timeout_ns: u64,
        pub k: u32,
        pub n: u32,
    }
}

megamoe_cuda::device_struct! {
    #[device(namespace = "megamoe::gemm")]
    /// The tile scheduler's walk over the experts.
    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    pub struct SchedulerParams {
        /// i32 [E]: padded segment sizes (contiguous) or valid rows (masked).
        pub expert_rows: u64,
        pub num_experts: u32,
        pub n: u32,
        /// Masked: row capacity of each expert; contiguous: unused (0).
        pub max_m: u32,
        /// M-blocks walked together per n-block (L2 reuse of the weight tile).
        pub group_m: u32,
    }
}

megamoe_cuda::device_struct! {
    #[device(namespace = "megamoe::gemm")]
    /// The output of the GEMM's own epilogues (epilogue/store.cuh: TMA stores or row stores).
    #[repr(C, align(64))]
    #[derive(Clone, Copy, Debug)]
    pub struct EpilogueParams {
        /// bf16 output 2-D {N, rows}; box {64, 64}, 128-byte swizzle (TmaStoreBf16).
        pub tma_d: TensorMap,
        /// bf16 or f32 output, rows like the activations, N columns (StoreRows).
        pub out: u64,
        pub n: u32,
    }
}

megamoe_cuda::device_struct! {
    #[device(namespace = "megamoe::gemm")]
    /// Parameters of one grouped GEMM launch: the params of its pieces.
    #[repr(C, align(64))]
    #[derive(Clone, Copy, Debug)]
    pub struct GroupedGemmParams {
        pub mainloop: MainloopParams,
        pub scheduler: SchedulerParams,
        /// The TmaStoreBf16 and StoreRows epilogues'.
        pub epilogue: EpilogueParams,
    }
}

/// The device headers generated from this module.
pub fn generated_headers() -> Vec<GeneratedHeader> {
    vec![
        GeneratedHeader {
            path: "megamoe_gemm/mma/mainloop_params.cuh",
            source: file!(),
            about: &[
                " The mainloop's side of the host/device interface: the threads of a CTA that runs",
                " its roles (pipeline/roles.cuh), its waits and its params.",
            ],
            includes: &["megamoe/ptx/tma.cuh"],
            namespace: "megamoe::gemm",
            preamble: &[],
            items: vec![
                Item::constant(
                    " Threads per CTA: two consumer warpgroups and one producer warpgroup.",
                    "kThreads",
                    "u32",
                    THREADS,
                ),
                Item::constant(
                    " Experts a launch may have (their row counts are staged in shared memory).",
                    "kMaxExperts",
                    "int",
                    MAX_EXPERTS,
                ),
                Item::constant(
                    " Longest K, in 128-wide blocks (a tile's weight scales are staged in shared memory).",
                    "kMaxKBlocks",
                    "int",
                    MAX_K_BLOCKS,
                ),
                Item::waits(
                    " The kernel's waits, in this crate's range of wait ids.",
                    "WaitId",
                    &WAITS,
                    &["kWaitFull", "kWaitEmpty"],
                ),
                MainloopParams::declaration(),
            ],
        },
        GeneratedHeader {
            path: "megamoe_gemm/impls/grouped_gemm_params.cuh",
            source: file!(),
            about: &[" The grouped GEMM kernels' single parameter struct and its pieces."],
            includes: &[
                "megamoe/ptx/tma.cuh",
                "megamoe_gemm/mma/mainloop_params.cuh",
            ],
            namespace: "megamoe::gemm",
            preamble: &[],
            items: vec![
                SchedulerParams::declaration(),
                EpilogueParams::declaration(),
                GroupedGemmParams::declaration(),
            ],
        },
    ]
}

#[cfg(test)]
mod tests {
    #[test]
    fn generated_headers_are_current() {
        megamoe_cuda::interface::check_headers(
            env!("CARGO_MANIFEST_DIR"),
            &super::generated_headers(),
        );
    }
}
