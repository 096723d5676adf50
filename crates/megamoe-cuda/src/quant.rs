//! Per-token, per-128-column bf16 → e4m3 quantization on the GPU (SPEC §3) and the CPU rule it
//! must match bit for bit.

use crate::device::{DeviceBuffer, Gpu, Kernel, LaunchConfig};
use crate::error::{Error, Result};
use crate::kernels::{self, QuantConfig, QuantParams, QUANT_THREADS};
use half::bf16;

/// Scale floor of inputs (SPEC §3).
pub const INPUT_SCALE_FLOOR: f32 = 1e-4;

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
            ("q", q, rows * cols),
            ("sf", sf, rows * cols / 128 * 4),
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
            q: q.ptr(),
            sf: sf.ptr(),
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

/// f32 → e4m3 (e4m3fn) code, round to nearest even, saturating to ±448 (PTX
/// `cvt.rn.satfinite.e4m3x2.f32`); NaN gives 0x7f.
// TODO(core): replace with megamoe-core's numerics::e4m3_from_f32 once it lands on main.
pub fn e4m3_from_f32(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs();
    if a.is_nan() {
        return 0x7f;
    }
    if a >= 448.0 {
        return sign | 0x7e;
    }
    let code = if a < 2f32.powi(-6) {
        // Subnormal: steps of 2^-9; 8 steps round up into the smallest normal, code 0x08.
        (a as f64 * 512.0).round_ties_even() as u32
    } else {
        let e = ((a.to_bits() >> 23) & 0xff) as i32 - 127;
        let m = (a as f64 * 2f64.powi(3 - e)).round_ties_even() as u32; // 8..=16
        (((e + 7) as u32) << 3) + (m - 8)
    };
    sign | code.min(0x7e) as u8
}

/// The CPU rule of SPEC §3 over bf16 `[rows, cols]`: per row and 128-column block,
/// sf = max(amax, 1e-4) / 448 and q = e4m3(v · (1 / sf)), in f32. Returns (q, sf).
pub fn quantize_reference(x: &[bf16], rows: usize, cols: usize) -> (Vec<u8>, Vec<f32>) {
    assert_eq!(
        x.len(),
        rows * cols,
        "x has {} elements, expected {rows} x {cols}",
        x.len()
    );
    assert_eq!(cols % 128, 0, "cols {cols} is not a multiple of 128");
    let mut q = vec![0u8; rows * cols];
    let mut sf = vec![0f32; rows * cols / 128];
    for (b, (block, out)) in x.chunks_exact(128).zip(q.chunks_exact_mut(128)).enumerate() {
        let amax = block.iter().fold(0f32, |m, v| m.max(v.to_f32().abs()));
        let s = amax.max(INPUT_SCALE_FLOOR) / 448.0;
        let inv = 1.0 / s;
        for (o, v) in out.iter_mut().zip(block) {
            *o = e4m3_from_f32(v.to_f32() * inv);
        }
        sf[b] = s;
    }
    (q, sf)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// e4m3 code → value, for checking the encoder against the format's definition.
    fn decode(code: u8) -> f32 {
        let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
        let e = ((code >> 3) & 0xf) as i32;
        let m = (code & 7) as f32;
        sign * if e == 0 {
            m * 2f32.powi(-9)
        } else {
            (1.0 + m / 8.0) * 2f32.powi(e - 7)
        }
    }

    #[test]
    fn every_code_round_trips() {
        for code in (0u8..=0xff).filter(|c| c & 0x7f != 0x7f) {
            let v = decode(code);
            let back = e4m3_from_f32(v);
            // +0 and -0 both round trip to their own sign.
            assert_eq!(back, code, "code {code:#x} value {v}");
        }
    }

    #[test]
    fn rounds_to_nearest_even_and_saturates() {
        // 1.0625 lies halfway between 1.0 (code 0x38) and 1.125 (0x39): even mantissa wins.
        assert_eq!(e4m3_from_f32(1.0625), 0x38);
        assert_eq!(e4m3_from_f32(1.1875), 0x3a);
        assert_eq!(e4m3_from_f32(1.07), 0x39);
        assert_eq!(e4m3_from_f32(448.0), 0x7e);
        assert_eq!(e4m3_from_f32(460.0), 0x7e);
        assert_eq!(e4m3_from_f32(1e9), 0x7e);
        assert_eq!(e4m3_from_f32(-1e9), 0xfe);
        // Half the smallest subnormal rounds to zero (even), just above rounds up.
        assert_eq!(e4m3_from_f32(2f32.powi(-10)), 0x00);
        assert_eq!(e4m3_from_f32(2f32.powi(-10) * 1.01), 0x01);
        // Largest subnormal region rounds up into the smallest normal.
        assert_eq!(e4m3_from_f32(2f32.powi(-6) * 0.99), 0x08);
        assert_eq!(e4m3_from_f32(f32::NAN), 0x7f);
    }

    #[test]
    fn reference_scales_by_block_amax_with_floor() {
        let mut x = vec![bf16::ZERO; 256];
        x[5] = bf16::from_f32(-2.0);
        x[6] = bf16::from_f32(1.0);
        let (q, sf) = quantize_reference(&x, 1, 256);
        assert_eq!(sf[0], 2.0 / 448.0);
        assert_eq!(q[5], 0xfe); // -448
        assert_eq!(sf[1], 1e-4 / 448.0); // all-zero block: the floor
        assert!(q[128..].iter().all(|&c| c == 0));
        assert_eq!(decode(q[6]), 224.0);
    }
}
