//! The GPU checks of the runtime, run by `megamoe selftest`, and the type of every GPU check.
//! None of them can pass without running.

use crate::device::{Gpu, LaunchConfig};
use crate::error::{Error, Result};
use crate::kernels::{
    self, LaunchCheckParams, QuantConfig, TmaCheckParams, TMA_TILE_COLS, TMA_TILE_ROWS,
};
use crate::quant::Quantizer;
use crate::ranks::World;
use crate::tma::{Swizzle, TiledMap, TmaDtype};
use crate::wait::{deadline_ns, WaitRecord, DEFAULT_DEADLINE};
use half::bf16;
use megamoe_core::numerics::INPUT_SCALE_FLOOR;
use megamoe_core::quant::quantize_rows;
use megamoe_core::rng::XorShift64;
use std::time::{Duration, Instant};

/// One named GPU check of `megamoe selftest` (this crate's, the grouped GEMM's and dispatch's):
/// `run` returns a one-line summary when the check holds, the failure otherwise.
pub struct Check {
    pub name: String,
    pub run: Box<dyn Fn() -> std::result::Result<String, String>>,
}

/// The verdict of a fault check on every rank's expired wait (`waits`, rank order): every rank
/// but `faulty` reported a wait of its own that names `faulty` as the rank it waited for. Returns
/// the waits seen, else which rank did not.
pub fn every_other_rank_names(
    waits: &[Option<Error>],
    faulty: usize,
) -> std::result::Result<String, String> {
    let mut seen = Vec::new();
    for (r, w) in waits.iter().enumerate().filter(|(r, _)| *r != faulty) {
        match w {
            Some(Error::WaitTimeout {
                rank, wait, peer, ..
            }) if *rank == r && *peer == faulty => {
                seen.push(format!("rank {r}: `{wait}`"));
            }
            other => {
                return Err(format!(
                    "rank {r} did not report a wait for rank {faulty}: {other:?}"
                ))
            }
        }
    }
    Ok(format!("{} waiting for rank {faulty}", seen.join(", ")))
}

/// Every GPU check of this crate, in the order they should run.
pub fn checks() -> Vec<Check> {
    let check = |name: &str, run: fn() -> Result<String>| Check {
        name: name.into(),
        run: Box::new(move || run().map_err(|e| e.to_string())),
    };
    vec![
        check("libraries", libraries),
        check("jit: every kernel compiles clean", jit_clean),
        check("launch: >48 KB smem, cluster, PDL", launch),
        check("tma: tensor map tile load", tma),
        check("symmetric memory: ring write", || symmetric(0)),
        check("symmetric memory: virtual ranks", || symmetric(8)),
        check("rank barrier", || barrier(0)),
        check("rank barrier: virtual ranks", || barrier(8)),
        check("barrier deadline: a rank skips", || skip(0)),
        check("barrier deadline: virtual rank skips", || skip(4)),
        check("quant e4m3: bitwise vs CPU", quant),
    ]
}

fn fail(reason: String) -> Error {
    Error::Invalid {
        arg: "selftest",
        reason,
    }
}

fn libraries() -> Result<String> {
    let v = crate::probe::versions();
    let (driver, _) = v.driver.map_err(fail)?;
    let ((major, minor), path) = v.nvrtc.map_err(fail)?;
    let nccl = match v.nccl {
        Ok((n, _)) => format!("NCCL {n}"),
        Err(_) => "NCCL not found".into(),
    };
    Ok(format!(
        "driver API {driver}, NVRTC {major}.{minor} ({path}), {nccl}"
    ))
}

fn jit_clean() -> Result<String> {
    let specs = kernels::kernel_specs();
    crate::jit::compile_all_clean(&specs).map_err(|errors| {
        fail(
            errors
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("; "),
        )
    })?;
    Ok(format!("{} configurations", specs.len()))
}

fn launch() -> Result<String> {
    let gpu = Gpu::new(0)?;
    let kernel = gpu.load(&*crate::jit::compile(&kernels::launch_check())?)?;
    let (grid, cluster) = (8u32, 2u32);
    let smem_bytes = 200 * 1024u32;
    let out = gpu.alloc(grid as usize * 3 * 4)?;
    out.memset(0xff)?;
    let params = LaunchCheckParams {
        out: out.ptr(),
        smem_words: smem_bytes / 4,
        pad: 0,
    };
    let config = LaunchConfig::new(grid, 256)
        .with_dynamic_smem(smem_bytes)
        .with_cluster(cluster, 1, 1);
    // Twice: plain, then with programmatic dependent launch behind the first.
    gpu.launch(&kernel, &config, &params)?;
    gpu.launch(&kernel, &config.with_pdl(true), &params)?;
    gpu.synchronize()?;
    let got: Vec<u32> = out.download()?;
    for b in 0..grid {
        let want = [(smem_bytes / 4 - 1) * 3 + b, b % cluster, cluster];
        let have = &got[b as usize * 3..b as usize * 3 + 3];
        if have != want {
            return Err(fail(format!("block {b}: got {have:?}, want {want:?}")));
        }
    }
    Ok(format!(
        "{grid} blocks, {} KB dynamic smem, clusters of {cluster}",
        smem_bytes / 1024
    ))
}

fn tma() -> Result<String> {
    let gpu = Gpu::new(0)?;
    let kernel = gpu.load(&*crate::jit::compile(&kernels::tma_check())?)?;
    let (rows, cols) = (64u64, 96u64);
    let data: Vec<u32> = (0..(rows * cols) as u32)
        .map(|i| i.wrapping_mul(2654435761))
        .collect();
    let src = gpu.alloc_from(&data)?;
    let map = TiledMap {
        dtype: TmaDtype::U32,
        address: src.ptr(),
        dims: &[cols, rows],
        strides: &[cols * 4],
        box_dims: &[TMA_TILE_COLS, TMA_TILE_ROWS],
        swizzle: Swizzle::None,
    }
    .encode()?;
    let out = gpu.alloc((TMA_TILE_ROWS * TMA_TILE_COLS * 4) as usize)?;
    out.memset(0)?;
    let record = gpu.alloc_zeroed(std::mem::size_of::<WaitRecord>())?;
    let (x, y) = (32i32, 16i32);
    let params = TmaCheckParams {
        map,
        out: out.ptr(),
        record: record.ptr(),
        timeout_ns: deadline_ns(DEFAULT_DEADLINE),
        x,
        y,
    };
    gpu.launch(&kernel, &LaunchConfig::new(1, 128), &params)?;
    gpu.synchronize()?;
    let rec: Vec<WaitRecord> = record.download()?;
    if let Some(e) = rec[0].to_error(DEFAULT_DEADLINE, &[]) {
        return Err(e);
    }
    let got: Vec<u32> = out.download()?;
    for r in 0..TMA_TILE_ROWS as usize {
        for c in 0..TMA_TILE_COLS as usize {
            let want = data[(y as usize + r) * cols as usize + x as usize + c];
            if got[r * TMA_TILE_COLS as usize + c] != want {
                return Err(fail(format!("tile element ({r}, {c}) differs")));
            }
        }
    }
    Ok(format!(
        "{TMA_TILE_ROWS}x{TMA_TILE_COLS} u32 tile at ({x}, {y})"
    ))
}

/// A world of `size` ranks, or one rank per GPU (at least 2, virtual if needed) when 0.
fn world(size: usize, deadline: Duration) -> Result<World> {
    let size = if size == 0 {
        crate::device::device_count()?.max(2)
    } else {
        size
    };
    World::with_deadline(size, deadline)
}

/// Every rank pushes a pattern into the next rank's buffer through the copy kernel, then every
/// rank checks what it received.
fn symmetric(size: usize) -> Result<String> {
    let world = world(size, DEFAULT_DEADLINE)?;
    let n = world.size();
    let words = 1 << 16;
    let buf = world.alloc_symmetric(words * 4)?;
    let copy = world.load(&*crate::jit::compile(&kernels::nvlink_copy())?)?;
    let pattern =
        |rank: usize| -> Vec<u32> { (0..words as u32).map(|i| i ^ (rank as u32) << 24).collect() };
    let sources = world
        .ranks()
        .iter()
        .map(|r| r.gpu.alloc_from(&pattern(r.rank)))
        .collect::<Result<Vec<_>>>()?;
    let results = world.run(|rank| {
        let src = &sources[rank.rank];
        let params = kernels::CopyParams {
            dst: buf.ptr((rank.rank + 1) % n),
            src: src.ptr(),
            bytes: (words * 4) as u64,
        };
        rank.gpu.launch(
            &copy[rank.rank],
            &LaunchConfig::new(16, kernels::COPY_THREADS),
            &params,
        )?;
        rank.gpu.synchronize()?;
        rank.barrier()?;
        let got: Vec<u32> = buf.local(rank.rank).download()?;
        let from = (rank.rank + n - 1) % n;
        if got != pattern(from) {
            return Err(fail(format!(
                "rank {}: data from rank {from} differs",
                rank.rank
            )));
        }
        Ok(())
    });
    results.into_iter().collect::<Result<Vec<()>>>()?;
    Ok(format!("{n} ranks on {} GPUs", world.gpu_count()))
}

fn barrier(size: usize) -> Result<String> {
    let world = world(size, DEFAULT_DEADLINE)?;
    let rounds = 10;
    let start = Instant::now();
    world
        .run(|rank| (0..rounds).try_for_each(|_| rank.barrier()))
        .into_iter()
        .collect::<Result<Vec<()>>>()?;
    Ok(format!(
        "{} ranks on {} GPUs, {rounds} rounds in {:.1} ms",
        world.size(),
        world.gpu_count(),
        start.elapsed().as_secs_f64() * 1e3
    ))
}

/// Rank 1 skips the second barrier: every other rank must fail within the deadline with an
/// error naming rank 1, and rank 1 must fail too.
fn skip(size: usize) -> Result<String> {
    let deadline = Duration::from_millis(300);
    let world = world(size, deadline)?;
    let start = Instant::now();
    let results = world.run(|rank| {
        rank.barrier()?;
        if rank.rank != 1 {
            rank.barrier()?;
        }
        Ok(())
    });
    let elapsed = start.elapsed();
    // Launch, host polling and thread start add to the device deadline; 10x is a hang.
    if elapsed > deadline * 10 {
        return Err(fail(format!(
            "took {elapsed:?} for a {deadline:?} deadline"
        )));
    }
    for (r, res) in results.iter().enumerate() {
        match res {
            Err(Error::WaitTimeout { rank, peer: 1, .. }) if *rank == r && r != 1 => {}
            Err(Error::PeerFailed { rank: 1, cause, .. }) if r == 1 && cause.contains("rank 1") => {
            }
            other => return Err(fail(format!("rank {r}: unexpected {other:?}"))),
        }
    }
    let first = results[0]
        .as_ref()
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    Ok(format!(
        "{} ranks failed in {:.0} ms; rank 0 says: {first}",
        world.size(),
        elapsed.as_secs_f64() * 1e3
    ))
}

/// bf16 test input of `len` values in 128-value blocks: every 35th block all zero, every 5th
/// tiny (below the scale floor), the rest random magnitudes 2^-20 .. 2^12 of either sign.
pub fn quant_input(rng: &mut XorShift64, len: usize) -> Vec<bf16> {
    (0..len)
        .map(|i| {
            let r = rng.next_u64();
            match (i / 128) % 35 {
                0 => bf16::ZERO,
                b if b % 5 == 0 => bf16::from_bits((r as u16 & 0x807f) | 0x0080),
                _ => {
                    let exp = (r >> 20) % 32;
                    let mag = f32::from_bits(((107 + exp as u32) << 23) | (r as u32 & 0x7fffff));
                    bf16::from_f32(if r & 1 == 0 { mag } else { -mag })
                }
            }
        })
        .collect()
}

/// Random bf16 data of many magnitudes (and all-zero and tiny blocks) quantized on the GPU must
/// equal megamoe-core's quantizer bit for bit, scales included, for every kernel configuration and for a
/// persistent grid that loops many times.
fn quant() -> Result<String> {
    let gpu = Gpu::new(0)?;
    let configs: Vec<QuantConfig> = ["b1", "b2", "b4", "b2p1", "b4p8"]
        .iter()
        .map(|c| c.parse())
        .collect::<Result<_>>()?;
    let quantizers = configs
        .iter()
        .map(|&c| Quantizer::with_config(&gpu, c))
        .collect::<Result<Vec<_>>>()?;
    let mut rng = XorShift64(0x9e3779b97f4a7c15);
    let shapes = [(1, 128), (3, 384), (77, 4096), (8192, 7168)];
    for (rows, cols) in shapes {
        let x = quant_input(&mut rng, rows * cols);
        let xf: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
        let want = quantize_rows(&xf, rows, cols, 128, INPUT_SCALE_FLOOR)
            .map_err(|e| fail(e.to_string()))?;
        let (want_q, want_sf) = (want.codes, want.scales);
        let xd = gpu.alloc_from(&x)?;
        let q = gpu.alloc(rows * cols)?;
        let sf = gpu.alloc(rows * cols / 128 * 4)?;
        for (quantizer, config) in quantizers.iter().zip(&configs) {
            q.memset(0xa5)?; // poisoned: every byte must be written
            sf.memset(0xa5)?;
            quantizer.launch(&gpu, &xd, &q, &sf, rows, cols)?;
            gpu.synchronize()?;
            let got_q: Vec<u8> = q.download()?;
            let got_sf: Vec<f32> = sf.download()?;
            if let Some(i) = (0..got_q.len()).find(|&i| got_q[i] != want_q[i]) {
                return Err(fail(format!(
                    "{config} [{rows}, {cols}]: q[{i}] = {:#04x}, CPU {:#04x} (x = {})",
                    got_q[i], want_q[i], x[i]
                )));
            }
            if let Some(i) =
                (0..got_sf.len()).find(|&i| got_sf[i].to_bits() != want_sf[i].to_bits())
            {
                return Err(fail(format!(
                    "{config} [{rows}, {cols}]: sf[{i}] = {}, CPU {}",
                    got_sf[i], want_sf[i]
                )));
            }
        }
    }
    Ok(format!(
        "{} shapes up to [8192, 7168] x {} configs, bitwise equal",
        shapes.len(),
        configs.len()
    ))
}
