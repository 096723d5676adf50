//! Host side of one grouped GEMM launch: tensor maps, params, launch, error word.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, DevicePtr};

use crate::error::{GemmError, Result};
use crate::heuristics::{validate, GemmConfig, GemmProblem, Layout};
use crate::kernel::THREADS;
use crate::params::GroupedGemmParams;
use crate::runtime::{encode_tma_2d, Gpu, Kernel, TmaElem};

/// Default deadline of every device wait.
pub const DEFAULT_TIMEOUT_NS: u64 = 5_000_000_000;

/// Device addresses of the operands (see `GemmOperands` in reference.rs for the layouts).
#[derive(Clone, Copy, Debug)]
pub struct GemmPointers {
    pub a: u64,
    pub scale_a: u64,
    pub b: u64,
    pub scale_b: u64,
    /// i32 [E]: padded segment sizes (contiguous) or valid rows (masked).
    pub expert_rows: u64,
    pub out: u64,
}

/// Rows of the 2-D view of the activations and the output.
pub fn view_rows(problem: &GemmProblem, contiguous_rows: usize) -> usize {
    match problem.layout {
        Layout::Contiguous { .. } => contiguous_rows,
        Layout::Masked { max_m } => problem.experts * max_m,
    }
}

/// A prepared launch: configuration, kernel and parameters.
pub struct GroupedGemm {
    pub problem: GemmProblem,
    pub config: GemmConfig,
    kernel: Arc<Kernel>,
    params: GroupedGemmParams,
    error: CudaSlice<u32>,
}

impl GroupedGemm {
    /// Prepares `problem` with `config`; `contiguous_rows` is the total padded row count of the
    /// contiguous layout (ignored for masked).
    pub fn new(
        gpu: &Gpu,
        problem: GemmProblem,
        config: GemmConfig,
        contiguous_rows: usize,
        ptr: GemmPointers,
    ) -> Result<GroupedGemm> {
        validate(&problem)?;
        if let Layout::Contiguous { pad } = problem.layout {
            if pad % config.block_m != 0 {
                return Err(GemmError::Shape {
                    arg: "pad",
                    reason: format!("{pad} is not a multiple of BLOCK_M {}", config.block_m),
                });
            }
            if contiguous_rows % pad != 0 {
                return Err(GemmError::Shape {
                    arg: "contiguous_rows",
                    reason: format!("{contiguous_rows} is not a multiple of the pad {pad}"),
                });
            }
        }
        if problem.n % config.block_n != 0 {
            return Err(GemmError::Shape {
                arg: "n",
                reason: format!("{} is not a multiple of BLOCK_N {}", problem.n, config.block_n),
            });
        }
        let (e, n, k, g) = (problem.experts, problem.n, problem.k, problem.group_size);
        let rows = view_rows(&problem, contiguous_rows).max(1);
        let kg = (k / g) as u64;
        let tma_a = encode_tma_2d(
            ptr.a,
            TmaElem::U8,
            [k as u64, rows as u64],
            k as u64,
            [128, config.block_m as u32],
            true,
        )?;
        let tma_b = encode_tma_2d(
            ptr.b,
            TmaElem::U8,
            [k as u64, (e * n) as u64],
            k as u64,
            [128, config.block_n as u32],
            true,
        )?;
        let (sa_inner, sa_outer) = match problem.layout {
            Layout::Contiguous { .. } => (rows as u64, kg),
            Layout::Masked { max_m } => (max_m as u64, e as u64 * kg),
        };
        let tma_sa = encode_tma_2d(
            ptr.scale_a,
            TmaElem::F32,
            [sa_inner, sa_outer],
            sa_inner * 4,
            [config.block_m as u32, (128 / g) as u32],
            false,
        )?;
        // Only the TMA-store epilogue reads it; the output's element size is 2 bytes then.
        let tma_d = encode_tma_2d(
            ptr.out,
            TmaElem::Bf16,
            [n as u64, rows as u64],
            (n * problem.out.bytes()) as u64,
            [64, 64],
            true,
        )?;
        if config.tma_store && (config.masked || problem.out != crate::heuristics::OutDtype::Bf16) {
            return Err(GemmError::Shape {
                arg: "config",
                reason: "the TMA-store epilogue writes whole bf16 tiles of the contiguous layout".into(),
            });
        }
        let error = gpu
            .stream
            .alloc_zeros::<u32>(1)
            .map_err(|source| GemmError::Driver {
                step: "error word allocation",
                source,
            })?;
        let error_ptr = error.device_ptr(&gpu.stream).0;
        let params = GroupedGemmParams {
            tma_a,
            tma_b,
            tma_sa,
            tma_d,
            out: ptr.out,
            scale_b: ptr.scale_b,
            expert_rows: ptr.expert_rows,
            error: error_ptr,
            timeout_ns: DEFAULT_TIMEOUT_NS,
            num_experts: e as u32,
            n: n as u32,
            k: k as u32,
            max_m: match problem.layout {
                Layout::Masked { max_m } => max_m as u32,
                Layout::Contiguous { .. } => 0,
            },
            group_m: config.group_m as u32,
            reserved: [0; 3],
        };
        Ok(GroupedGemm {
            problem,
            config,
            kernel: gpu.kernel(&config)?,
            params,
            error,
        })
    }

    pub fn kernel(&self) -> &Kernel {
        &self.kernel
    }

    /// Enqueues the kernel on the GPU's stream.
    pub fn launch(&self, gpu: &Gpu) -> Result<()> {
        gpu.launch(
            &self.kernel,
            self.config.ctas as u32,
            THREADS,
            self.config.smem_bytes(),
            &self.params,
        )
    }

    /// Synchronises and turns an expired device wait into an error.
    pub fn check(&self, gpu: &Gpu) -> Result<()> {
        let word = gpu
            .stream
            .clone_dtoh(&self.error)
            .map_err(|source| GemmError::Driver {
                step: "kernel execution",
                source,
            })?[0];
        if word == 0 {
            return Ok(());
        }
        let what = match word & 0xFFFF {
            1 => "consumer waiting for a stage's TMA data (full barrier)",
            2 => "producer waiting for a free stage (empty barrier)",
            _ => "unknown wait",
        };
        Err(GemmError::DeviceTimeout {
            kernel: self.config.kernel_name(),
            what: what.to_string(),
        })
    }
}
