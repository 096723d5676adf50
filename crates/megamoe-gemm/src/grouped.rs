//! Host side of one grouped GEMM launch: tensor maps, params, launch, wait record.

use std::sync::Arc;

use megamoe_cuda::wait::{deadline_ns, DEFAULT_DEADLINE};
use megamoe_cuda::{
    jit, DeviceBuffer, Gpu, Kernel, LaunchConfig, Swizzle, TensorMap, TiledMap, TmaDtype,
    WaitNames, WaitRecord,
};

use crate::error::{GemmError, Result};
use crate::heuristics::{block_n_tiles, validate, GemmConfig, GemmProblem, Layout, OutDtype};
use crate::kernel::{kernel_spec, THREADS};
use crate::params::{EpilogueParams, GroupedGemmParams, MainloopParams, SchedulerParams};

/// The names of the kernel's waits, numbered as `WaitId` in
/// device/megamoe_gemm/pipeline/barriers.cuh.
pub const WAITS: WaitNames = WaitNames {
    first: 0x100,
    names: &[
        "consumer waiting for a stage's TMA data (full barrier)",
        "producer waiting for a free stage (empty barrier)",
    ],
};

/// A 2-D tiled map: `dims = [inner, outer]` elements, `row_bytes` between outer rows.
fn map_2d(
    dtype: TmaDtype,
    address: u64,
    dims: [u64; 2],
    row_bytes: u64,
    box_dims: [u32; 2],
    swizzle: Swizzle,
) -> Result<TensorMap> {
    Ok(TiledMap {
        dtype,
        address,
        dims: &dims,
        strides: &[row_bytes],
        box_dims: &box_dims,
        swizzle,
    }
    .encode()?)
}

/// Device addresses of the operands (see `GemmOperands` in reference.rs for the layouts).
#[derive(Clone, Copy, Debug)]
pub struct GemmPointers {
    pub a: u64,
    pub scale_a: u64,
    pub b: u64,
    pub scale_b: u64,
    /// i32 `[E]`: padded segment sizes (contiguous) or valid rows (masked).
    pub expert_rows: u64,
    pub out: u64,
}

/// What the mainloop reads, as its TMA maps view it.
#[derive(Clone, Copy, Debug)]
pub struct MainloopOperands {
    /// e4m3 activations: `rows` rows of K bytes.
    pub a: u64,
    pub rows: usize,
    /// f32 activation scales, K-group-major: `scale_a_dims[1]` rows of `scale_a_dims[0]`.
    pub scale_a: u64,
    pub scale_a_dims: [usize; 2],
    /// e4m3 weights `[E, N, K]` and their f32 scales `[E, N/128, K/128]`.
    pub b: u64,
    pub scale_b: u64,
    pub experts: usize,
    pub n: usize,
    pub k: usize,
    /// Columns of A per activation scale (G).
    pub group: usize,
}

impl MainloopOperands {
    /// The mainloop's params: the operands' maps in boxes of `tile` = [rows, weight rows] (128
    /// columns of K each), with expired waits recorded in the `megamoe_cuda::WaitRecord` at
    /// `wait_record` after `timeout_ns`.
    pub fn params(
        &self,
        tile: [usize; 2],
        wait_record: u64,
        timeout_ns: u64,
    ) -> Result<MainloopParams> {
        let (k, g) = (self.k as u64, self.group);
        let tma_a = map_2d(
            TmaDtype::U8,
            self.a,
            [k, self.rows as u64],
            k,
            [128, tile[0] as u32],
            Swizzle::B128,
        )?;
        let tma_b = map_2d(
            TmaDtype::U8,
            self.b,
            [k, (self.experts * self.n) as u64],
            k,
            [128, tile[1] as u32],
            Swizzle::B128,
        )?;
        let [sa_inner, sa_outer] = self.scale_a_dims.map(|d| d as u64);
        let tma_sa = map_2d(
            TmaDtype::F32,
            self.scale_a,
            [sa_inner, sa_outer],
            sa_inner * 4,
            [tile[0] as u32, (128 / g) as u32],
            Swizzle::None,
        )?;
        Ok(MainloopParams {
            tma_a,
            tma_b,
            tma_sa,
            scale_b: self.scale_b,
            error: wait_record,
            timeout_ns,
            k: self.k as u32,
            n: self.n as u32,
        })
    }
}

/// Rows of the 2-D view of the activations and the output.
pub fn view_rows(problem: &GemmProblem, contiguous_rows: usize) -> usize {
    match problem.layout {
        Layout::Contiguous { .. } => contiguous_rows,
        Layout::Masked { max_m } => problem.experts * max_m,
    }
}

/// Grid, block, shared memory and cluster of `config`'s launch.
pub fn launch_config(config: &GemmConfig) -> LaunchConfig {
    let launch = LaunchConfig::new(config.ctas as u32, THREADS)
        .with_dynamic_smem(config.smem_bytes() as u32);
    if config.cluster_m > 1 {
        launch.with_cluster(config.cluster_m as u32, 1, 1)
    } else {
        launch
    }
}

/// A prepared launch: configuration, kernel and parameters.
pub struct GroupedGemm {
    pub problem: GemmProblem,
    pub config: GemmConfig,
    pub compiled: Arc<jit::CompiledKernel>,
    kernel: Kernel,
    params: GroupedGemmParams,
    error: DeviceBuffer,
}

/// The checked parameters of one launch of `problem` with `config` (tensor maps over the
/// operands in `ptr`) and the launch's zeroed wait record, which they point to; for kernels that
/// embed the GEMM with an epilogue of their own (the MoE layer's).
pub fn gemm_params(
    gpu: &Gpu,
    problem: &GemmProblem,
    config: &GemmConfig,
    contiguous_rows: usize,
    ptr: GemmPointers,
) -> Result<(GroupedGemmParams, DeviceBuffer)> {
    validate(problem)?;
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
    if config.cluster_m > 1
        && (problem.n % (config.cluster_m * config.block_n) != 0
            || config.ctas % config.cluster_m != 0)
    {
        return Err(GemmError::Shape {
            arg: "n",
            reason: format!(
                "clusters of {} need N ({}) a multiple of {} and an even grid ({})",
                config.cluster_m,
                problem.n,
                config.cluster_m * config.block_n,
                config.ctas
            ),
        });
    }
    if !block_n_tiles(problem.n, config.block_n) {
        return Err(GemmError::Shape {
            arg: "n",
            reason: format!(
                "{} is not a multiple of BLOCK_N {}",
                problem.n, config.block_n
            ),
        });
    }
    let (e, n, k, g) = (problem.experts, problem.n, problem.k, problem.group_size);
    let rows = view_rows(problem, contiguous_rows).max(1);
    let kg = k / g;
    let scale_a_dims = match problem.layout {
        Layout::Contiguous { .. } => [rows, kg],
        Layout::Masked { max_m } => [max_m, e * kg],
    };
    // Only the TMA-store epilogue reads it; the output's element size is 2 bytes then.
    let tma_d = map_2d(
        TmaDtype::Bf16,
        ptr.out,
        [n as u64, rows as u64],
        (n * problem.out.bytes()) as u64,
        [64, 64],
        Swizzle::B128,
    )?;
    if config.tma_store && (config.masked || problem.out != OutDtype::Bf16) {
        return Err(GemmError::Shape {
            arg: "config",
            reason: "the TMA-store epilogue writes whole bf16 tiles of the contiguous layout"
                .into(),
        });
    }
    let error = gpu.alloc_zeroed(std::mem::size_of::<WaitRecord>())?;
    let operands = MainloopOperands {
        a: ptr.a,
        rows,
        scale_a: ptr.scale_a,
        scale_a_dims,
        b: ptr.b,
        scale_b: ptr.scale_b,
        experts: e,
        n,
        k,
        group: g,
    };
    // Clusters load the weight tile in halves (pipeline/tma_producer.cuh).
    let tile = [config.block_m, config.block_n / config.cluster_m];
    let params = GroupedGemmParams {
        mainloop: operands.params(tile, error.ptr(), deadline_ns(DEFAULT_DEADLINE))?,
        scheduler: SchedulerParams {
            expert_rows: ptr.expert_rows,
            num_experts: e as u32,
            n: n as u32,
            max_m: match problem.layout {
                Layout::Masked { max_m } => max_m as u32,
                Layout::Contiguous { .. } => 0,
            },
            group_m: config.group_m as u32,
        },
        epilogue: EpilogueParams {
            tma_d,
            out: ptr.out,
            n: n as u32,
        },
    };
    Ok((params, error))
}

/// Whether a launch's wait record reports an expired wait: the error naming the wait.
pub fn check_wait_record(record: WaitRecord, kernel: &str) -> Result<()> {
    if record.status == 0 {
        return Ok(());
    }
    Err(GemmError::DeviceTimeout {
        kernel: kernel.to_string(),
        what: record.wait_name(&[&WAITS]).to_string(),
    })
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
        let (params, error) = gemm_params(gpu, &problem, &config, contiguous_rows, ptr)?;
        let compiled = jit::compile(&kernel_spec(&config))?;
        let kernel = gpu.load(&compiled)?;
        let mut config = config;
        if config.cluster_m > 1 {
            // The persistent schedule needs every CTA resident at once; a GPC with an odd
            // number of free SMs cannot hold a whole pair.
            let clusters = gpu.max_active_clusters(&kernel, &launch_config(&config))? as usize;
            if clusters == 0 {
                return Err(GemmError::Shape {
                    arg: "config",
                    reason: format!("no cluster of {} fits", config.kernel_name()),
                });
            }
            config.ctas = config.ctas.min(clusters * config.cluster_m);
        }
        Ok(GroupedGemm {
            problem,
            config,
            kernel,
            compiled,
            params,
            error,
        })
    }

    /// Enqueues the kernel on the GPU's stream.
    pub fn launch(&self, gpu: &Gpu) -> Result<()> {
        Ok(gpu.launch(&self.kernel, &launch_config(&self.config), &self.params)?)
    }

    /// Synchronises and turns an expired device wait into an error.
    pub fn check(&self, gpu: &Gpu) -> Result<()> {
        gpu.synchronize()?;
        self.check_synchronized()
    }

    /// [`Self::check`] for a caller that has already waited for the GPU's stream (the kernel's
    /// name is formatted only for an error).
    pub fn check_synchronized(&self) -> Result<()> {
        let record = self.error.download::<WaitRecord>()?[0];
        if record.status == 0 {
            return Ok(());
        }
        check_wait_record(record, &self.config.kernel_name())
    }
}
