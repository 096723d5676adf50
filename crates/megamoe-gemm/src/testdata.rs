//! Random operands for checks and benchmarks, the device copies, and the comparison with the
//! CPU reference.

use megamoe_core::rng::SplitMix64;
use megamoe_cuda::{DeviceBuffer, Gpu};
use rayon::prelude::*;

use crate::error::{GemmError, Result};
use crate::grouped::{view_rows, GemmPointers};
use crate::heuristics::{GemmProblem, Layout, OutDtype};
use crate::reference::{diff, reference_row, GemmOperands};

/// Group sizes drawn uniformly in 0.7–1.3× the mean (the benchmark protocol's rule).
pub fn group_sizes(experts: usize, mean: usize, seed: u64) -> Vec<usize> {
    let mut rng = SplitMix64::new(seed);
    (0..experts)
        .map(|_| (mean as f64 * (0.7 + 0.6 * rng.unit())).round() as usize)
        .collect()
}

/// A random finite e4m3 byte of magnitude in [2^-4, 2^4).
fn random_e4m3(r: u64) -> u8 {
    let sign = (r & 0x80) as u8;
    let exp = (((r >> 8) % 8) + 3) as u8;
    let man = ((r >> 16) & 7) as u8;
    sign | (exp << 3) | man
}

fn fill_e4m3(buf: &mut [u8], seed: u64) {
    buf.par_chunks_mut(1 << 16)
        .enumerate()
        .for_each(|(i, chunk)| {
            let mut rng = SplitMix64::new(seed ^ (i as u64).wrapping_mul(0xA24B_AED4_963E_E407));
            for x in chunk {
                *x = random_e4m3(rng.next_u64());
            }
        });
}

/// Host operands of one problem; padding rows (and masked rows past the count) are zero.
pub struct HostOperands {
    pub problem: GemmProblem,
    /// Valid rows per expert.
    pub rows: Vec<usize>,
    /// First view row of each expert's segment.
    pub seg_start: Vec<usize>,
    /// i32 per expert as the kernel reads it (padded sizes, or counts).
    pub expert_rows: Vec<i32>,
    pub view_rows: usize,
    /// Padded rows of the contiguous layout (0 for masked).
    pub contiguous_rows: usize,
    pub a: Vec<u8>,
    pub scale_a: Vec<f32>,
    pub b: Vec<u8>,
    pub scale_b: Vec<f32>,
}

impl HostOperands {
    pub fn random(problem: GemmProblem, rows: &[usize], seed: u64) -> Result<HostOperands> {
        assert_eq!(rows.len(), problem.experts);
        let (e, n, k, g) = (problem.experts, problem.n, problem.k, problem.group_size);
        let (seg_rows, expert_rows): (Vec<usize>, Vec<i32>) = match problem.layout {
            Layout::Contiguous { pad } => rows
                .iter()
                .map(|&r| {
                    let p = r.div_ceil(pad) * pad;
                    (p, p as i32)
                })
                .unzip(),
            Layout::Masked { max_m } => {
                if let Some(&r) = rows.iter().find(|&&r| r > max_m) {
                    return Err(GemmError::Shape {
                        arg: "rows",
                        reason: format!("{r} rows exceed max_m {max_m}"),
                    });
                }
                (vec![max_m; e], rows.iter().map(|&r| r as i32).collect())
            }
        };
        let mut seg_start = Vec::with_capacity(e);
        let mut acc = 0;
        for &s in &seg_rows {
            seg_start.push(acc);
            acc += s;
        }
        let contiguous_rows = match problem.layout {
            Layout::Contiguous { .. } => acc,
            Layout::Masked { .. } => 0,
        };
        let vrows = view_rows(&problem, contiguous_rows);
        let mut a = vec![0u8; vrows * k];
        fill_e4m3(&mut a, seed);
        let mut b = vec![0u8; e * n * k];
        fill_e4m3(&mut b, seed.wrapping_add(1));
        let mut rng = SplitMix64::new(seed.wrapping_add(2));
        let kg = k / g;
        let mut scale_a = vec![0f32; vrows * kg];
        for (ex, (&start, &valid)) in seg_start.iter().zip(rows).enumerate() {
            for r in 0..seg_rows[ex] {
                let row = start + r;
                if r >= valid {
                    a[row * k..(row + 1) * k].fill(0);
                    continue;
                }
                for gi in 0..kg {
                    let v = (0.5 + rng.unit() as f32) / 64.0;
                    match problem.layout {
                        Layout::Contiguous { .. } => scale_a[gi * vrows + row] = v,
                        Layout::Masked { max_m } => scale_a[(ex * kg + gi) * max_m + r] = v,
                    }
                }
            }
        }
        let scale_b = (0..e * (n / 128) * (k / 128))
            .map(|_| (0.5 + rng.unit() as f32) / 32.0)
            .collect();
        Ok(HostOperands {
            problem,
            rows: rows.to_vec(),
            seg_start,
            expert_rows,
            view_rows: vrows,
            contiguous_rows,
            a,
            scale_a,
            b,
            scale_b,
        })
    }

    fn operands(&self) -> (GemmOperands<'_>, usize) {
        let ld = match self.problem.layout {
            Layout::Contiguous { .. } => self.view_rows,
            Layout::Masked { max_m } => max_m,
        };
        (
            GemmOperands {
                n: self.problem.n,
                k: self.problem.k,
                group_size: self.problem.group_size,
                a: &self.a,
                scale_a: &self.scale_a,
                scale_a_ld: ld,
                b: &self.b,
                scale_b: &self.scale_b,
            },
            ld,
        )
    }

    /// Reference of view row `row` (expert `expert`, row `r` of its segment).
    pub fn reference(&self, expert: usize, r: usize) -> Vec<f32> {
        let (op, _) = self.operands();
        let row = self.seg_start[expert] + r;
        let scale_row = match self.problem.layout {
            Layout::Contiguous { .. } => row,
            Layout::Masked { .. } => r,
        };
        // Masked scales live at (expert·K/G + g)·max_m + r: shift the base by the expert.
        let kg = self.problem.k / self.problem.group_size;
        let op = match self.problem.layout {
            Layout::Contiguous { .. } => op,
            Layout::Masked { max_m } => GemmOperands {
                scale_a: &self.scale_a[expert * kg * max_m..],
                ..op
            },
        };
        reference_row(&op, expert, row, scale_row)
    }

    /// Valid FLOPs, and HBM bytes that must move at least once.
    pub fn flops_and_bytes(&self) -> (f64, f64) {
        let p = &self.problem;
        let valid: usize = self.rows.iter().sum();
        let active = self.rows.iter().filter(|&&r| r > 0).count();
        let flops = 2.0 * valid as f64 * p.n as f64 * p.k as f64;
        let bytes = valid as f64 * (p.k as f64 + (p.k / p.group_size) as f64 * 4.0)
            + active as f64 * (p.n * p.k) as f64 * (1.0 + 4.0 / (128.0 * 128.0))
            + valid as f64 * p.n as f64 * p.out.bytes() as f64;
        (flops, bytes)
    }

    /// Bytes of the weights of experts that have rows (the decode floor).
    pub fn weight_bytes(&self) -> f64 {
        let active = self.rows.iter().filter(|&&r| r > 0).count();
        active as f64 * (self.problem.n * self.problem.k) as f64
    }
}

/// Device copies of the operands plus the output buffer.
pub struct DeviceOperands {
    pub a: DeviceBuffer,
    pub scale_a: DeviceBuffer,
    pub b: DeviceBuffer,
    pub scale_b: DeviceBuffer,
    pub expert_rows: DeviceBuffer,
    pub out: DeviceBuffer,
}

impl DeviceOperands {
    pub fn upload(gpu: &Gpu, host: &HostOperands) -> Result<DeviceOperands> {
        let out_bytes = host.view_rows.max(1) * host.problem.n * host.problem.out.bytes();
        Ok(DeviceOperands {
            a: gpu.alloc_from(&host.a)?,
            scale_a: gpu.alloc_from(&host.scale_a)?,
            b: gpu.alloc_from(&host.b)?,
            scale_b: gpu.alloc_from(&host.scale_b)?,
            expert_rows: gpu.alloc_from(&host.expert_rows)?,
            out: gpu.alloc_zeroed(out_bytes)?,
        })
    }

    pub fn pointers(&self) -> GemmPointers {
        GemmPointers {
            a: self.a.ptr(),
            scale_a: self.scale_a.ptr(),
            b: self.b.ptr(),
            scale_b: self.scale_b.ptr(),
            expert_rows: self.expert_rows.ptr(),
            out: self.out.ptr(),
        }
    }

    /// Fills the output with NaN bytes so unwritten elements show.
    pub fn poison_output(&self) -> Result<()> {
        Ok(self.out.memset(0xFF)?)
    }
}

/// Output element `i` of `bytes` as f32.
fn out_value(bytes: &[u8], dtype: OutDtype, i: usize) -> f32 {
    match dtype {
        OutDtype::Bf16 => {
            half::bf16::from_bits(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])).to_f32()
        }
        OutDtype::F32 => f32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap()),
    }
}

/// Result of comparing a GPU output with the reference.
#[derive(Debug)]
pub struct Comparison {
    pub diff: f64,
    pub rows_checked: usize,
    /// Valid rows holding a NaN (unwritten poison) — must be 0.
    pub unwritten: usize,
    /// Masked rows past the count that were written — must be 0.
    pub overwritten: usize,
}

/// Compares `out` (downloaded) with the reference on the rows `sample` picks
/// (`every` = 1 checks every valid row); checks every element for poison.
pub fn compare(host: &HostOperands, out: &[u8], every: usize) -> Comparison {
    let p = &host.problem;
    let n = p.n;
    let mut sampled = Vec::new();
    let mut unwritten = 0;
    let mut overwritten = 0;
    for (ex, &valid) in host.rows.iter().enumerate() {
        let seg = match p.layout {
            Layout::Contiguous { pad } => valid.div_ceil(pad) * pad,
            Layout::Masked { max_m } => max_m,
        };
        for r in 0..seg {
            let row = host.seg_start[ex] + r;
            let nan = (0..n)
                .filter(|&c| out_value(out, p.out, row * n + c).is_nan())
                .count();
            let must_write = r < valid || matches!(p.layout, Layout::Contiguous { .. });
            if must_write {
                unwritten += (nan > 0) as usize;
            } else {
                overwritten += (nan < n) as usize;
            }
            if r < valid && (r % every == 0 || r + 1 == valid) {
                sampled.push((ex, r));
            }
        }
    }
    let pairs: Vec<(Vec<f32>, Vec<f32>)> = sampled
        .par_iter()
        .map(|&(ex, r)| {
            let row = host.seg_start[ex] + r;
            let gpu: Vec<f32> = (0..n).map(|c| out_value(out, p.out, row * n + c)).collect();
            let mut reference = host.reference(ex, r);
            if p.out == OutDtype::Bf16 {
                for v in &mut reference {
                    *v = half::bf16::from_f32(*v).to_f32();
                }
            }
            (gpu, reference)
        })
        .collect();
    let (gpu, reference): (Vec<f32>, Vec<f32>) = pairs
        .into_iter()
        .flat_map(|(g, r)| g.into_iter().zip(r))
        .unzip();
    Comparison {
        diff: diff(&gpu, &reference),
        rows_checked: sampled.len(),
        unwritten,
        overwritten,
    }
}
