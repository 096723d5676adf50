//! `megamoe bench layer`: the layer's device time, split and fused, against its floor and
//! against our two grouped GEMMs alone on the same routing (SPEC §8): per token count, arms
//! interleaved in rounds (A B C, C B A, A B C, ...), CUDA events around each call on every
//! rank's stream (the slowest rank counts), median of `iters` calls per arm and round, the
//! median over rounds and the band of per-round ratios.

use megamoe_core::floor::floor_seconds;
use megamoe_core::routing::{generate_world, RoutingSpec};
use megamoe_core::{Accumulation, Shape, WeightGen, WorldInputs};
use megamoe_cuda::bench::Stats;

use crate::error::Result;
use crate::fused::{FusedLayer, FusedOptions, FusedStaged, TraceReport};
use crate::inputs::{fp8_inputs, quantize_inputs};
use crate::spec::{Kind, LayerSpec};
use crate::split::{Phase, SplitLayer};

/// What to measure.
#[derive(Clone, Debug)]
pub struct LayerBench {
    pub shape: Shape,
    pub ranks: usize,
    /// Tokens per rank of each cell; the buffers are sized for the largest.
    pub tokens: Vec<usize>,
    pub routing: RoutingSpec,
    pub rounds: usize,
    pub iters: usize,
    /// Blocks per rank for dispatch and combine (None: the layer's default).
    pub comm_sms: Option<usize>,
    /// Whether the fused arm runs beside the split one.
    pub fused: bool,
    /// The fused arm runs the kernel that records its timeline, and each cell reports it.
    pub trace: bool,
    /// How every arm's GEMMs sum over K.
    pub accumulation: Accumulation,
}

/// One measured cell.
#[derive(Clone, Debug)]
pub struct LayerRow {
    pub tokens: usize,
    pub valid_slots: usize,
    /// The split layer (dispatch, L1, L2, combine), median over rounds, µs.
    pub split_us: f64,
    /// L1 (plain bf16 output) + L2 GEMMs alone on the same pool, median over rounds, µs.
    pub gemms_us: f64,
    /// Band of per-round split / GEMMs ratios.
    pub ratio_min: f64,
    pub ratio_max: f64,
    /// The fused layer, median over rounds, µs, and the band of its per-round ratio to split.
    pub fused: Option<FusedCell>,
    /// max(FLOPs / peak, weight bytes of the experts that receive rows / HBM), µs.
    pub floor_us: f64,
    /// Valid-slot TFLOP/s of the split layer.
    pub tflops: f64,
    /// Each phase launched alone (after the rounds), median µs, in [`Phase::ALL`] order.
    pub phases_us: [f64; 4],
}

/// The fused arm of one cell.
#[derive(Clone, Copy, Debug)]
pub struct FusedCell {
    pub us: f64,
    pub ratio_min: f64,
    pub ratio_max: f64,
    /// The call's order: lag in units (None: a single wave).
    pub lag_units: Option<usize>,
    /// Where rank 0's last call spent its time (with [`LayerBench::trace`]).
    pub trace: Option<TraceReport>,
}

/// Runs every cell.
pub fn run(b: &LayerBench, progress: &dyn Fn(&str)) -> Result<Vec<LayerRow>> {
    let (mut layer, mut fused) = layers(b, progress)?;
    let mut rows = Vec::new();
    for &tokens in &b.tokens {
        progress(&format!("{tokens} tokens per rank"));
        rows.push(cell(b, &mut layer, fused.as_mut(), tokens)?);
    }
    Ok(rows)
}

/// The split layer and, with [`LayerBench::fused`], the fused one, sized for the largest cell.
fn layers(b: &LayerBench, progress: &dyn Fn(&str)) -> Result<(SplitLayer, Option<FusedLayer>)> {
    let max_tokens = b.tokens.iter().copied().max().unwrap_or(1).max(1);
    let mut spec = LayerSpec::new(b.shape, b.ranks, max_tokens);
    spec.comm_sms = b.comm_sms;
    spec.accumulation = b.accumulation;
    let gen = WeightGen::new(b.shape, b.routing.seed);
    progress("generating and loading the weights");
    let layer = SplitLayer::new(spec, |r| gen.rank_fp8(r, b.ranks))?;
    if !b.fused {
        return Ok((layer, None));
    }
    let spec = LayerSpec {
        kind: Kind::Fused,
        ..spec
    };
    let options = FusedOptions {
        trace: b.trace,
        ..FusedOptions::default()
    };
    let fused = FusedLayer::with_options(spec, |r| gen.rank_fp8(r, b.ranks), options)?;
    Ok((layer, Some(fused)))
}

/// The per-round times of one cell's arms, ms: split, the GEMMs alone, fused (empty without
/// the fused layer).
struct Rounds {
    split: Vec<f64>,
    alone: Vec<f64>,
    fused: Vec<f64>,
}

/// One cell: `tokens` per rank on a generated routing, every arm timed in rounds, then each
/// phase alone.
fn cell(
    b: &LayerBench,
    layer: &mut SplitLayer,
    mut fused: Option<&mut FusedLayer>,
    tokens: usize,
) -> Result<LayerRow> {
    let world = generate_world(b.shape, b.ranks, tokens, &b.routing)?;
    let quant = quantize_inputs(&world);
    let inputs = fp8_inputs(&world, &quant);
    let staged = layer.stage(&inputs, None)?;
    // A first call fills the pool the GEMM-only arm reads, and compiles its kernels.
    layer.launch(&staged)?;
    layer.finish()?;
    let gemms = layer.gemms_only(&staged)?;
    let fused_staged = match fused.as_deref_mut() {
        Some(f) => {
            // The bound of the call (a serving engine passes its batch's): the order and
            // ring of this token count, not of the buffer's capacity.
            let st = f.stage(&inputs, Some(tokens))?;
            f.launch(&st)?;
            f.finish()?;
            Some(st)
        }
        None => None,
    };
    let mut t = Rounds {
        split: Vec::new(),
        alone: Vec::new(),
        fused: Vec::new(),
    };
    for round in 0..b.rounds {
        // A B C, C B A, A B C, ...
        let arms = if round % 2 == 0 { [0, 1, 2] } else { [2, 1, 0] };
        for arm in arms {
            match arm {
                0 => t.split.push(time(layer, b.iters, |l| l.launch(&staged))?),
                1 => t.alone.push(time(layer, b.iters, |l| gemms.launch(l))?),
                _ => {
                    if let (Some(f), Some(st)) = (fused.as_deref_mut(), fused_staged.as_ref()) {
                        t.fused.push(time(f, b.iters, |f| f.launch(st))?);
                    }
                }
            }
        }
    }
    let mut phases_us = [0.0; 4];
    for (us, phase) in phases_us.iter_mut().zip(Phase::ALL) {
        *us = time(layer, b.iters, |l| l.launch_phase(&staged, phase))? * 1e3;
    }
    let fused_cell = match (fused.as_deref(), fused_staged) {
        (Some(f), Some(st)) => Some(fused_cell(b, f, &st, &t)?),
        _ => None,
    };
    Ok(row(b, tokens, &world, &t, fused_cell, phases_us))
}

/// The fused arm's cell from the rounds' times.
fn fused_cell(b: &LayerBench, f: &FusedLayer, st: &FusedStaged, t: &Rounds) -> Result<FusedCell> {
    let r: Vec<f64> = t.fused.iter().zip(&t.split).map(|(f, s)| f / s).collect();
    Ok(FusedCell {
        us: Stats::of(&t.fused).median_ms * 1e3,
        ratio_min: r.iter().copied().fold(f64::INFINITY, f64::min),
        ratio_max: r.iter().copied().fold(0.0, f64::max),
        lag_units: st.lag_units(),
        trace: if b.trace {
            Some(f.trace_report(0)?)
        } else {
            None
        },
    })
}

/// The row of a cell of `tokens` per rank (`world`) from the rounds' times: medians, the split / GEMMs band, the
/// floor and the split layer's rate.
fn row(
    b: &LayerBench,
    tokens: usize,
    world: &WorldInputs,
    t: &Rounds,
    fused: Option<FusedCell>,
    phases_us: [f64; 4],
) -> LayerRow {
    let ratios: Vec<f64> = t.split.iter().zip(&t.alone).map(|(s, g)| s / g).collect();
    let valid_slots = world.valid_slots();
    let flops = valid_slots as f64 * b.shape.flops_per_slot();
    let experts_hit = experts_receiving(
        &world
            .ranks
            .iter()
            .flat_map(|r| r.topk_idx.iter().copied())
            .collect::<Vec<_>>(),
        b.shape.experts,
    );
    let weight_bytes = experts_hit as f64 * 3.0 * (b.shape.hidden * b.shape.inter) as f64;
    // Every rank does 1/R of the work at once.
    let floor_s = floor_seconds(flops / b.ranks as f64, weight_bytes / b.ranks as f64, 0.0);
    let split_us = Stats::of(&t.split).median_ms * 1e3;
    LayerRow {
        fused,
        tokens,
        valid_slots,
        split_us,
        gemms_us: Stats::of(&t.alone).median_ms * 1e3,
        ratio_min: ratios.iter().copied().fold(f64::INFINITY, f64::min),
        ratio_max: ratios.iter().copied().fold(0.0, f64::max),
        floor_us: floor_s * 1e6,
        tflops: flops / b.ranks as f64 / (split_us * 1e-6) / 1e12,
        phases_us,
    }
}

/// Distinct experts named by valid slots.
fn experts_receiving(topk_idx: &[i32], experts: usize) -> usize {
    let mut hit = vec![false; experts];
    for &e in topk_idx {
        if e >= 0 {
            hit[e as usize] = true;
        }
    }
    hit.iter().filter(|&&h| h).count()
}

/// A layer whose calls the benchmark times: its ranks' GPUs and the wait that closes a batch.
trait Timed {
    fn gpus(&self) -> Vec<megamoe_cuda::Gpu>;
    fn finish_calls(&mut self) -> Result<()>;
}

impl Timed for SplitLayer {
    fn gpus(&self) -> Vec<megamoe_cuda::Gpu> {
        (0..self.spec.ranks).map(|r| self.gpu(r).clone()).collect()
    }
    fn finish_calls(&mut self) -> Result<()> {
        self.finish()
    }
}

impl Timed for FusedLayer {
    fn gpus(&self) -> Vec<megamoe_cuda::Gpu> {
        (0..self.spec.ranks).map(|r| self.gpu(r).clone()).collect()
    }
    fn finish_calls(&mut self) -> Result<()> {
        self.finish()
    }
}

/// Median over `iters` calls (after two warm-up calls) of the slowest rank's device time, ms.
fn time<L: Timed>(
    layer: &mut L,
    iters: usize,
    mut call: impl FnMut(&mut L) -> Result<()>,
) -> Result<f64> {
    let gpus = layer.gpus();
    let layer = std::cell::RefCell::new(layer);
    median_ms(
        &gpus,
        iters,
        || call(&mut layer.borrow_mut()),
        || layer.borrow_mut().finish_calls(),
    )
}

/// Median over `iters` calls of `call` (after two warm-up calls, each batch closed by
/// `finish`) of the slowest rank's device time, ms.
fn median_ms(
    gpus: &[megamoe_cuda::Gpu],
    iters: usize,
    mut call: impl FnMut() -> Result<()>,
    mut finish: impl FnMut() -> Result<()>,
) -> Result<f64> {
    let timers = gpus
        .iter()
        .map(|g| g.timer())
        .collect::<std::result::Result<Vec<_>, _>>()?;
    for _ in 0..2 {
        call()?;
    }
    finish()?;
    let mut samples = Vec::with_capacity(iters);
    for _ in 0..iters {
        for t in &timers {
            t.start()?;
        }
        call()?;
        for t in &timers {
            t.stop()?;
        }
        let mut slowest = 0f64;
        for t in &timers {
            slowest = slowest.max(t.elapsed_ms()? as f64);
        }
        samples.push(slowest);
    }
    finish()?;
    Ok(Stats::of(&samples).median_ms)
}
