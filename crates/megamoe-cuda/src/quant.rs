//! Per-token, per-128-column bf16 → e4m3 quantization on the GPU (SPEC §3), bitwise equal to
//! `megamoe_core::quant::quantize_rows(x, rows, cols, 128, INPUT_SCALE_FLOOR)`.

use crate::device::{DeviceBuffer, Gpu, Kernel, LaunchConfig};
use crate::error::{Error, Result};
use crate::kernels::{self, QuantConfig, QuantParams, QUANT_THREADS};

/// The quantization kernel, loaded on one GPU.
pub struct Quantizer {
    kernel: Kernel,
    config: QuantConfig,
    sm_count: u32,
}

impl Quantizer {
    /// The default configuration.
    pub fn new(gpu: &Gpu) -> Result<Quantizer> {
        Quantizer::with_config(gpu, QuantConfig::DEFAULT)
    }

    pub fn with_config(gpu: &Gpu, config: QuantConfig) -> Result<Quantizer> {
        if !kernels::QUANT_BLOCKS_PER_HALF_WARP.contains(&config.blocks_per_half_warp) {
            return Err(Error::Invalid {
                arg: "config",
                reason: format!(
                    "{config}: blocks per half-warp must be one of {:?}",
                    kernels::QUANT_BLOCKS_PER_HALF_WARP
                ),
            });
        }
        let compiled = crate::jit::compile(&kernels::quant_e4m3(config.blocks_per_half_warp))?;
        Ok(Quantizer {
            kernel: gpu.load(&compiled)?,
            config,
            sm_count: gpu.props().sm_count,
        })
    }

    /// Queues `x` (bf16 `[rows, cols]`) → `q` (e4m3 `[rows, cols]`), `sf` (f32
    /// `[rows, cols / 128]`) on `gpu`'s stream. Sizes are checked before anything is launched.
    pub fn launch(
        &self,
        gpu: &Gpu,
        x: &DeviceBuffer,
        q: &DeviceBuffer,
        sf: &DeviceBuffer,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        self.launch_at(gpu, x, (q, 0), (sf, 0), rows, cols)
    }

    /// [`Self::launch`] with `q` and `sf` at byte offsets inside larger buffers (regions of a
    /// symmetric buffer, say).
    pub fn launch_at(
        &self,
        gpu: &Gpu,
        x: &DeviceBuffer,
        (q, q_offset): (&DeviceBuffer, usize),
        (sf, sf_offset): (&DeviceBuffer, usize),
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        if cols % 128 != 0 || cols == 0 {
            return Err(Error::Invalid {
                arg: "cols",
                reason: format!("{cols} is not a positive multiple of 128"),
            });
        }
        if rows > u32::MAX as usize || cols > u32::MAX as usize {
            return Err(Error::Invalid {
                arg: "rows",
                reason: format!("{rows} x {cols} exceeds the kernel's 32-bit sizes"),
            });
        }
        let need = [
            ("x", x, rows * cols * 2),
            ("q", q, q_offset + rows * cols),
            ("sf", sf, sf_offset + rows * cols / 128 * 4),
        ];
        for (arg, buf, bytes) in need {
            if buf.bytes() < bytes {
                return Err(Error::Invalid {
                    arg,
                    reason: format!("{} bytes, needs {bytes}", buf.bytes()),
                });
            }
        }
        if rows == 0 {
            return Ok(());
        }
        let blocks = (rows * cols / 128) as u64;
        let per_cta = (QUANT_THREADS / 16 * self.config.blocks_per_half_warp) as u64;
        let mut grid = blocks.div_ceil(per_cta);
        if self.config.ctas_per_sm > 0 {
            grid = grid.min(self.sm_count as u64 * self.config.ctas_per_sm as u64);
        }
        let params = QuantParams {
            x: x.ptr(),
            q: q.ptr() + q_offset as u64,
            sf: sf.ptr() + sf_offset as u64,
            rows: rows as u32,
            cols: cols as u32,
        };
        gpu.launch(
            &self.kernel,
            &LaunchConfig::new(grid as u32, QUANT_THREADS),
            &params,
        )
    }
}
