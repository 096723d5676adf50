//! The GPU checks of the layer (for `megamoe selftest`), for both kinds: the output against
//! megamoe-core's CPU reference (SPEC §3: diff ≤ 1e-4) on fresh generated batches of every SPEC
//! §8 routing, the output bits across runs and across R = 1, 2, 4, 8 (virtual ranks) on the same
//! global batch, bf16 input against the same input quantized on the host, bad input rejected with
//! nothing written, non-finite input kept to its token. The fused kind besides: its bits equal
//! to the split kind's on every batch, four calls on one buffer whose ring wraps with skewed
//! routing in between, bounds that differ between ranks or fall below a rank's T rejected on
//! every rank, a captured graph replayed on new inputs. The fault checks of both kinds (a rank
//! that never arrives, stops mid-dispatch, mid-GEMM or mid-combine, publishes a corrupt count,
//! or sleeps past the deadline and goes on): every other rank reports it within the deadline,
//! naming itself, the wait and the faulty rank (or every rank rejects the call), and a new layer
//! in the same process is correct. Both accumulations' error on the proxies of flash, pro and
//! glm, with the two kinds bit-equal in each.

use half::bf16;
use megamoe_core::plan::{Loads, Stream};
use megamoe_core::preset::Shape;
use megamoe_core::routing::{generate_world, RoutingKind, RoutingSpec};
use megamoe_core::{diff, fused_layer, Accumulation, LayerOptions, Preset, WeightGen, WorldInputs};

use megamoe_cuda::selftest::{every_other_rank_names, Check};
use megamoe_cuda::AllGather;
use megamoe_ep::{FaultKind, InjectedFault};

use crate::call::{Activations, RankInput};
use crate::fused::{Fault, FusedLayer, FusedOptions, FusedStaged};
use crate::inputs::{bf16_inputs, fp8_inputs, quantize_inputs, spec_for};
use crate::layer::MoeLayer;
use crate::spec::{Kind, LayerSpec};
use crate::split::SplitLayer;

/// The contract's bound on the GPU output's distance to the CPU reference (SPEC §3).
pub const MAX_DIFF: f64 = 1e-4;

/// The bound of the rescaled accumulation's checks: SPEC §3's bound for any batch (the mode
/// trades accuracy for speed; the `layer accuracy` checks measure it).
pub const MAX_DIFF_RESCALED: f64 = 1e-3;

fn shape(preset: &str, experts: Option<usize>) -> Shape {
    let mut s = Preset::by_name(preset).expect("a preset").shape;
    if let Some(e) = experts {
        s.experts = e;
    }
    s
}

fn routing(kind: &str, seed: u64) -> RoutingSpec {
    let mut spec = RoutingSpec {
        seed,
        ..RoutingSpec::default()
    };
    match kind {
        "zipf" => spec.kind = RoutingKind::Zipf { exponent: 1.0 },
        "masked" => spec.masked_ratio = 0.5,
        "uneven" => spec.uneven_tokens = true,
        _ => {}
    }
    spec
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Builds the layer of `kind` for `world` (T_max = the world's largest T, at least 1) with the
/// seeded weights, and runs it on bf16 input.
fn run_layer(
    kind: Kind,
    world: &WorldInputs,
    gen: &WeightGen,
    options: &LayerOptions,
) -> Result<Vec<Vec<bf16>>, String> {
    run_layer_in(kind, Accumulation::PerBlock, world, gen, options)
}

/// [`run_layer`] with the GEMMs' `accumulation`.
fn run_layer_in(
    kind: Kind,
    accumulation: Accumulation,
    world: &WorldInputs,
    gen: &WeightGen,
    options: &LayerOptions,
) -> Result<Vec<Vec<bf16>>, String> {
    let ranks = world.num_ranks();
    let spec = LayerSpec {
        kind,
        accumulation,
        ..spec_for(world, options)
    };
    let mut layer = MoeLayer::new(spec, |r| gen.rank_fp8(r, ranks)).map_err(err)?;
    layer.forward(&bf16_inputs(world), None).map_err(err)
}

/// The GPU layer against the CPU reference on one generated batch; also the bits of a second
/// run, the all-masked tokens (exactly 0) and, for `ranks > 1`, the bits of the same global
/// batch on one rank.
fn against_reference(
    layer_kind: Kind,
    preset: &'static str,
    experts: Option<usize>,
    ranks: usize,
    tokens: usize,
    kind: &'static str,
    clamp: Option<f32>,
) -> Check {
    let name = format!(
        "layer {} {preset}{} R={ranks} T={tokens} {kind}{}",
        layer_kind.name(),
        experts.map_or(String::new(), |e| format!("/{e}")),
        clamp.map_or(String::new(), |c| format!(" clamp {c}"))
    );
    Check {
        name,
        run: Box::new(move || {
            let shape = shape(preset, experts);
            let seed = 0x5EED ^ tokens as u64 ^ (ranks as u64) << 20;
            let spec = routing(kind, seed);
            let world = generate_world(shape, ranks, tokens, &spec).map_err(err)?;
            let gen = WeightGen::new(shape, seed);
            let mut options = LayerOptions::for_shape(&shape);
            options.clamp = clamp;
            let want = fused_layer(&world, &gen, &options, &|_, _| {}).map_err(err)?;
            let got = run_layer(layer_kind, &world, &gen, &options)?;
            let d = diff::diff_bf16(&got, &want);
            if d.is_nan() || d > MAX_DIFF {
                return Err(format!(
                    "diff {d:.3e} against the CPU reference (bound {MAX_DIFF:.0e})"
                ));
            }
            let again = run_layer(layer_kind, &world, &gen, &options)?;
            if diff::output_hash(&again) != diff::output_hash(&got) {
                return Err("a second run gave other bits".into());
            }
            let all_masked = all_masked_tokens(&world, &got)?;
            if kind == "masked" && all_masked == 0 {
                return Err("the masked batch has no token with every slot masked".into());
            }
            let zero_ranks = world.ranks.iter().filter(|r| r.tokens == 0).count();
            let mut note = format!(
                "diff {d:.2e}, hash {:016x}, {all_masked} all-masked tokens, {zero_ranks} ranks with T = 0",
                diff::output_hash(&got)
            );
            if ranks > 1 && kind != "uneven" {
                let one = generate_world(shape, 1, tokens * ranks, &spec).map_err(err)?;
                let single = run_layer(layer_kind, &one, &gen, &options)?;
                let flat: Vec<bf16> = got.concat();
                if single[0] != flat {
                    return Err(format!(
                        "R = {ranks} and R = 1 differ on the same global batch"
                    ));
                }
                note += ", bits equal to R = 1";
            }
            if layer_kind == Kind::Fused {
                if run_layer(Kind::Split, &world, &gen, &options)? != got {
                    return Err("the fused and the split layer differ".into());
                }
                note += ", bits equal to split";
            }
            Ok(note)
        }),
    }
}

/// The tokens of `world` with every slot masked, after checking that their rows of `got` are
/// exactly 0.
fn all_masked_tokens(world: &WorldInputs, got: &[Vec<bf16>]) -> Result<usize, String> {
    let (h, k) = (world.shape.hidden, world.shape.topk);
    let mut all_masked = 0;
    for (r, inputs) in world.ranks.iter().enumerate() {
        for t in 0..inputs.tokens {
            if inputs.topk_idx[t * k..][..k].iter().all(|&e| e < 0) {
                all_masked += 1;
                if got[r][t * h..][..h].iter().any(|v| v.to_bits() != 0) {
                    return Err(format!(
                        "rank {r} token {t}: every slot masked, output not 0"
                    ));
                }
            }
        }
    }
    Ok(all_masked)
}

/// The error of both accumulations on one generated batch (the table in docs/PYTHON.md,
/// "Accumulation"): the CPU reference once, then the fused and the split layer in each mode.
/// Each mode's two kinds give the same bits; per-block is within [`MAX_DIFF`], rescaled within
/// [`MAX_DIFF_RESCALED`]; the note gives each mode's diff, largest absolute and relative error
/// (relative to the reference's largest magnitude) and hash.
fn accuracy(preset: &'static str, experts: Option<usize>, tokens: usize) -> Check {
    let name = format!(
        "layer accuracy {preset}{} R=1 T={tokens}",
        experts.map_or(String::new(), |e| format!("/{e}"))
    );
    Check {
        name,
        run: Box::new(move || {
            let shape = shape(preset, experts);
            let seed = 0xACC ^ tokens as u64;
            let world = generate_world(shape, 1, tokens, &routing("uniform", seed)).map_err(err)?;
            let gen = WeightGen::new(shape, seed);
            let options = LayerOptions::for_shape(&shape);
            let want = fused_layer(&world, &gen, &options, &|_, _| {}).map_err(err)?;
            let mut notes = Vec::new();
            for accumulation in Accumulation::ALL {
                let fused = run_layer_in(Kind::Fused, accumulation, &world, &gen, &options)?;
                let split = run_layer_in(Kind::Split, accumulation, &world, &gen, &options)?;
                let mode = accumulation.name();
                if fused != split {
                    return Err(format!("{mode}: the fused and the split layer differ"));
                }
                let d = diff::diff_bf16(&fused, &want);
                let (abs, rel) = diff::max_error_bf16(&fused, &want);
                let bound = match accumulation {
                    Accumulation::PerBlock => MAX_DIFF,
                    Accumulation::Rescaled => MAX_DIFF_RESCALED,
                };
                let note = format!(
                    "{mode}: diff {d:.2e}, max abs {abs:.2e}, max rel {rel:.2e}, hash {:016x}",
                    diff::output_hash(&fused)
                );
                if d.is_nan() || d > bound {
                    return Err(format!("{note} (bound {bound:.0e})"));
                }
                notes.push(note);
            }
            Ok(notes.join("; ") + "; fused = split in each")
        }),
    }
}

/// The shape of [`layer_rank_check`].
const RANK_CHECK_PRESET: &str = "tiny";

/// The fused kernel [`layer_rank_check`] runs (a driver compiles it once before starting the processes).
pub fn fused_rank_kernel() -> megamoe_cuda::KernelSpec {
    let spec = LayerSpec::new(shape(RANK_CHECK_PRESET, None), 2, 1);
    crate::kernel::fused_spec(spec.group, spec.accumulation, false)
}

/// One process's part of the layer of `kind` with one rank per process (`megamoe ep-procs`):
/// rank `rank` of `ranks` builds its layer with [`FusedLayer::for_rank`] (every device wait
/// bounded by `deadline`) or [`crate::SplitLayer::for_rank`] on GPU `device` and runs a seeded
/// tiny batch, the same in every process. Its output must be bit-equal to the same rank's output
/// of a layer of the same kind holding every rank in this process (virtual ranks) and within
/// [`MAX_DIFF`] of the CPU reference. `idle`: build the layer, then make no call for two
/// deadlines (the peers' waits must expire naming this rank).
pub fn layer_rank_check(
    kind: Kind,
    rank: usize,
    ranks: usize,
    device: usize,
    deadline: std::time::Duration,
    exchange: Box<dyn AllGather>,
    idle: bool,
) -> Result<String, String> {
    let shape = shape(RANK_CHECK_PRESET, None);
    let seed = 0x9E0C ^ ranks as u64;
    let world = generate_world(shape, ranks, 96, &routing("masked", seed)).map_err(err)?;
    let gen = WeightGen::new(shape, seed);
    let options = LayerOptions::for_shape(&shape);
    let spec = LayerSpec {
        kind,
        ..spec_for(&world, &options)
    };
    let weights = |r| gen.rank_fp8(r, ranks);
    let mut layer = match kind {
        Kind::Fused => {
            let fused = FusedOptions {
                deadline,
                ..FusedOptions::default()
            };
            let layer = FusedLayer::for_rank(spec, weights, fused, rank, device, exchange);
            MoeLayer::Fused(Box::new(layer.map_err(err)?))
        }
        Kind::Split => MoeLayer::for_rank(spec, weights, rank, device, exchange).map_err(err)?,
    };
    if idle {
        std::thread::sleep(2 * deadline);
        return Ok(format!("rank {rank}: built its layer and made no call"));
    }
    let inputs = bf16_inputs(&world);
    let got = layer.forward(&inputs[rank..=rank], None).map_err(err)?;
    let want = fused_layer(&world, &gen, &options, &|_, _| {}).map_err(err)?;
    let d = diff::diff_bf16(&got, &want[rank..=rank]);
    if d.is_nan() || d > MAX_DIFF {
        return Err(format!(
            "rank {rank}: diff {d:.3e} against the CPU reference (bound {MAX_DIFF:.0e})"
        ));
    }
    let every = run_layer(kind, &world, &gen, &options)?;
    if every[rank] != got[0] {
        return Err(format!(
            "rank {rank}: the output differs from the virtual-rank layer's on the same batch"
        ));
    }
    Ok(format!(
        "rank {rank}: T {}, diff {d:.2e} to the CPU reference, bits equal to the virtual-rank layer",
        world.ranks[rank].tokens
    ))
}

/// bf16 input quantized by the layer against the same input quantized on the host and passed as
/// e4m3 + scales: the same bits; and the cumulative per-expert counts after two calls.
fn fp8_input(kind: Kind) -> Check {
    Check {
        name: format!("layer {} tiny R=2 fp8 input", kind.name()),
        run: Box::new(move || {
            let shape = shape("tiny", None);
            let world = generate_world(shape, 2, 96, &routing("uniform", 7)).map_err(err)?;
            let gen = WeightGen::new(shape, 7);
            let options = LayerOptions::for_shape(&shape);
            let from_bf16 = run_layer(kind, &world, &gen, &options)?;
            let quant = quantize_inputs(&world);
            let spec = LayerSpec {
                kind,
                ..LayerSpec::new(shape, 2, 96)
            };
            let mut layer = MoeLayer::new(spec, |r| gen.rank_fp8(r, 2)).map_err(err)?;
            let inputs = fp8_inputs(&world, &quant);
            let got = layer.forward(&inputs, Some(96)).map_err(err)?;
            if got != from_bf16 {
                return Err("FP8 input and bf16 input give other bits".into());
            }
            // A second call: the counts add up over calls.
            layer.forward(&inputs, None).map_err(err)?;
            let el = shape.experts / 2;
            let mut want = vec![vec![0u64; el]; 2];
            for r in &world.ranks {
                for &e in r.topk_idx.iter().filter(|&&e| e >= 0) {
                    want[e as usize / el][e as usize % el] += 2;
                }
            }
            if layer.expert_counts() != want.as_slice() {
                return Err(format!(
                    "received-row counts {:?} after two calls, expected {want:?}",
                    layer.expert_counts()
                ));
            }
            Ok("same bits; cumulative per-expert counts right".into())
        }),
    }
}

/// Bad inputs are errors naming the argument, with nothing written: the symmetric input rows
/// and routing keep their bytes, and the next good call gives the reference bits.
fn bad_inputs(kind: Kind) -> Check {
    Check {
        name: format!("layer {} bad input rejected, nothing written", kind.name()),
        run: Box::new(move || {
            let shape = shape("tiny", None);
            let world = generate_world(shape, 2, 32, &routing("uniform", 11)).map_err(err)?;
            let gen = WeightGen::new(shape, 11);
            let spec = LayerSpec {
                kind,
                ..LayerSpec::new(shape, 2, 32)
            };
            let mut layer = MoeLayer::new(spec, |r| gen.rank_fp8(r, 2)).map_err(err)?;
            let good = bf16_inputs(&world);
            let want = layer.forward(&good, None).map_err(err)?;
            let before = layer.input_bytes().map_err(err)?;
            let bad = BadRank1::of(&world);
            let cases = bad.cases(&world, &good);
            reject_each(&mut layer, &cases, &before)?;
            if layer.forward(&good, Some(32)).map_err(err)? != want {
                return Err("the good call after the bad ones gave other bits".into());
            }
            Ok(format!("{} bad calls rejected", cases.len()))
        }),
    }
}

/// Rank 1's bad inputs of [`bad_inputs`]: an expert out of range, an expert twice, more tokens
/// than T_max, a NaN weight.
struct BadRank1 {
    out_of_range: Vec<i32>,
    duplicate: Vec<i32>,
    long_x: Vec<bf16>,
    long_idx: Vec<i32>,
    long_w: Vec<f32>,
    nan_w: Vec<f32>,
}

impl BadRank1 {
    fn of(world: &WorldInputs) -> BadRank1 {
        let (shape, rank1) = (world.shape, &world.ranks[1]);
        let k = shape.topk;
        let mut out_of_range = rank1.topk_idx.clone();
        out_of_range[5] = shape.experts as i32;
        let mut duplicate = rank1.topk_idx.clone();
        duplicate[k + 1] = duplicate[k];
        let mut nan_w = rank1.topk_weights.clone();
        nan_w[0] = f32::NAN;
        BadRank1 {
            out_of_range,
            duplicate,
            long_x: vec![bf16::ZERO; 33 * shape.hidden],
            long_idx: vec![0i32; 33 * k],
            long_w: vec![0f32; 33 * k],
            nan_w,
        }
    }

    /// Every bad call of a layer of T_max 32 on `world` (inputs `good`): the argument it
    /// breaks, the inputs, the bound.
    fn cases<'a>(
        &'a self,
        world: &'a WorldInputs,
        good: &[RankInput<'a>],
    ) -> Vec<(&'static str, Vec<RankInput<'a>>, Option<usize>)> {
        // Rank 0's good input beside a bad one of rank 1.
        let rank1 = |bad| vec![good[0], bad];
        vec![
            (
                "topk_idx",
                rank1(RankInput {
                    topk_idx: &self.out_of_range,
                    ..good[1]
                }),
                None,
            ),
            (
                "topk_idx",
                rank1(RankInput {
                    topk_idx: &self.duplicate,
                    ..good[1]
                }),
                None,
            ),
            (
                "tokens",
                rank1(RankInput {
                    x: Activations::Bf16(&self.long_x),
                    topk_idx: &self.long_idx,
                    topk_weights: &self.long_w,
                }),
                None,
            ),
            (
                "topk_weights",
                rank1(RankInput {
                    topk_weights: &world.ranks[1].topk_weights[1..],
                    ..good[1]
                }),
                None,
            ),
            (
                "topk_weights",
                rank1(RankInput {
                    topk_weights: &self.nan_w,
                    ..good[1]
                }),
                None,
            ),
            (
                "x",
                rank1(RankInput {
                    x: Activations::Bf16(&world.ranks[1].x[1..]),
                    ..good[1]
                }),
                None,
            ),
            ("inputs", vec![good[0]], None),
            ("num_tokens_bound", good.to_vec(), Some(31)),
            ("num_tokens_bound", good.to_vec(), Some(33)),
        ]
    }
}

/// Every call of `cases` (the argument it breaks, the inputs, the bound) is an error naming
/// that argument, and leaves the layer's staged inputs as `before`.
fn reject_each(
    layer: &mut MoeLayer,
    cases: &[(&str, Vec<RankInput>, Option<usize>)],
    before: &[u8],
) -> Result<(), String> {
    for (arg, inputs, bound) in cases {
        match layer.forward(inputs, *bound) {
            Ok(_) => return Err(format!("a bad `{arg}` was accepted")),
            Err(e) if !e.to_string().contains(arg) => {
                return Err(format!(
                    "a bad `{arg}` gave an error that does not name it: {e}"
                ))
            }
            Err(_) => {}
        }
        if layer.input_bytes().map_err(err)? != before {
            return Err(format!("a bad `{arg}` wrote to the inputs"));
        }
    }
    Ok(())
}

/// SPEC §6: a NaN or ±Inf in one token's `x` changes only that token's output; every other
/// token keeps its bits.
fn non_finite_input(kind: Kind) -> Check {
    Check {
        name: format!("layer {} tiny R=2 NaN/Inf in one token's x", kind.name()),
        run: Box::new(move || {
            let shape = shape("tiny", None);
            let world = generate_world(shape, 2, 32, &routing("uniform", 13)).map_err(err)?;
            let gen = WeightGen::new(shape, 13);
            let options = LayerOptions::for_shape(&shape);
            let spec = LayerSpec {
                kind,
                ..spec_for(&world, &options)
            };
            let mut layer = MoeLayer::new(spec, |r| gen.rank_fp8(r, 2)).map_err(err)?;
            let base = layer.forward(&bf16_inputs(&world), None).map_err(err)?;
            let (rank, token, h) = (1, 5, shape.hidden);
            for v in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                let mut bad = world.clone();
                bad.ranks[rank].x[token * h + 7] = bf16::from_f32(v);
                let got = layer.forward(&bf16_inputs(&bad), None).map_err(err)?;
                for (r, (g, b)) in got.iter().zip(&base).enumerate() {
                    for t in 0..g.len() / h {
                        let same = g[t * h..][..h]
                            .iter()
                            .zip(&b[t * h..][..h])
                            .all(|(x, y)| x.to_bits() == y.to_bits());
                        if (r, t) == (rank, token) && same {
                            return Err(format!("{v} in token {token}: its output did not change"));
                        }
                        if (r, t) != (rank, token) && !same {
                            return Err(format!(
                                "{v} in rank {rank} token {token} changed rank {r} token {t}"
                            ));
                        }
                    }
                }
            }
            Ok("NaN, +Inf, -Inf: only that token's output changed".into())
        }),
    }
}

/// Four calls on one fused buffer whose ring is smaller than the pool (lagged order, slots
/// reused), uniform and skewed routing alternating: each call's bits equal the split layer's
/// and those of a fused layer whose ring is the full pool (a single wave) on the same batch.
fn ring_wraps(ranks: usize, tokens: usize) -> Check {
    Check {
        name: format!("layer fused tiny R={ranks} T={tokens} ring wraps over 4 calls"),
        run: Box::new(move || {
            let shape = shape("tiny", None);
            let gen = WeightGen::new(shape, 17);
            let options = LayerOptions::for_shape(&shape);
            let spec = LayerSpec::new(shape, ranks, tokens);
            let mut fused = FusedLayer::new(spec, |r| gen.rank_fp8(r, ranks)).map_err(err)?;
            let mut full_pool =
                FusedLayer::full_pool(spec, |r| gen.rank_fp8(r, ranks)).map_err(err)?;
            let mut split = MoeLayer::new(
                LayerSpec {
                    kind: Kind::Split,
                    ..spec
                },
                |r| gen.rank_fp8(r, ranks),
            )
            .map_err(err)?;
            let mut notes = Vec::new();
            for (call, kind) in ["uniform", "zipf", "uniform", "zipf"]
                .into_iter()
                .enumerate()
            {
                let world = generate_world(shape, ranks, tokens, &routing(kind, 100 + call as u64))
                    .map_err(err)?;
                let inputs = bf16_inputs(&world);
                let staged = fused.stage(&inputs, None).map_err(err)?;
                let Some(lag) = staged.lag_units() else {
                    return Err(format!(
                        "call {call} runs a single wave: the ring of this buffer never wraps"
                    ));
                };
                fused.launch(&staged).map_err(err)?;
                fused.finish().map_err(err)?;
                plan_matches(&fused, &staged, &world)?;
                let got = fused.outputs(&staged).map_err(err)?;
                let want = split.forward(&inputs, None).map_err(err)?;
                if got != want {
                    return Err(format!("call {call} ({kind}): fused and split bits differ"));
                }
                if full_pool_outputs(&mut full_pool, &inputs, &world)? != got {
                    return Err(format!(
                        "call {call} ({kind}): the ring and the full pool give other bits"
                    ));
                }
                let blocks = (0..ranks)
                    .map(|r| fused.plan_header(r).map(|h| h.n_blocks as usize))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(err)?;
                if blocks.iter().all(|&b| b <= staged.ring_slots()) {
                    return Err(format!(
                        "call {call}: m-blocks {blocks:?} fit the ring of {}: it never wraps",
                        staged.ring_slots()
                    ));
                }
                notes.push(format!(
                    "{kind}: lag {lag}, {blocks:?} blocks in {} slots",
                    staged.ring_slots()
                ));
            }
            let world = generate_world(shape, ranks, tokens, &routing("zipf", 1)).map_err(err)?;
            let got = fused.forward(&bf16_inputs(&world), None).map_err(err)?;
            let want = fused_layer(&world, &gen, &options, &|_, _| {}).map_err(err)?;
            let d = diff::diff_bf16(&got, &want);
            if d.is_nan() || d > MAX_DIFF {
                return Err(format!("diff {d:.3e} against the CPU reference"));
            }
            Ok(format!(
                "{}; bits equal to split and to the full pool; every plan the planner's; diff {d:.2e}",
                notes.join(", ")
            ))
        }),
    }
}

/// The outputs of `full_pool` (a layer whose ring never wraps) on `inputs` (of `world`), after
/// checking that it runs the call in a single wave and that its plans are the planner's.
fn full_pool_outputs(
    full_pool: &mut FusedLayer,
    inputs: &[RankInput],
    world: &WorldInputs,
) -> Result<Vec<Vec<bf16>>, String> {
    let staged = full_pool.stage(inputs, None).map_err(err)?;
    if staged.lag_units().is_some() {
        return Err("the full-pool layer lags".into());
    }
    full_pool.launch(&staged).map_err(err)?;
    full_pool.finish().map_err(err)?;
    plan_matches(full_pool, &staged, world)?;
    full_pool.outputs(&staged).map_err(err)
}

/// The plan the kernel built on every rank for `layer`'s last call (m-blocks and task stream)
/// equals megamoe-core's `Stream::build` for the call's rows.
fn plan_matches(
    layer: &FusedLayer,
    staged: &FusedStaged,
    world: &WorldInputs,
) -> Result<(), String> {
    let loads = Loads::from_world(world).map_err(err)?;
    for r in layer.local_ranks() {
        let (params, blocks, tasks) = layer.device_stream(r, staged).map_err(err)?;
        let want = Stream::build(params, &loads.expert_rows(r));
        let want_blocks: Vec<[u32; 3]> = want
            .blocks
            .iter()
            .map(|b| [b.expert as u32, b.first_row as u32, b.rows as u32])
            .collect();
        if blocks != want_blocks {
            return Err(format!(
                "rank {r}: the kernel's {} m-blocks are not the planner's {}",
                blocks.len(),
                want_blocks.len()
            ));
        }
        if tasks != want.tasks {
            let at = tasks.iter().zip(&want.tasks).position(|(a, b)| a != b);
            return Err(format!(
                "rank {r}: the kernel's stream of {} tasks is not the planner's {} (first difference at {at:?})",
                tasks.len(),
                want.tasks.len()
            ));
        }
    }
    Ok(())
}

/// Bounds that differ between ranks, or one below a rank's T, reach the device (as from
/// processes that each checked only their own): every rank's call is rejected, no rank hangs,
/// and the next good call gives the split layer's bits.
fn bound_mismatch() -> Check {
    Check {
        name: "layer fused tiny R=4 bound mismatch rejected on every rank".into(),
        run: Box::new(|| {
            let shape = shape("tiny", None);
            let ranks = 4;
            let world = generate_world(shape, ranks, 48, &routing("uniform", 19)).map_err(err)?;
            let gen = WeightGen::new(shape, 19);
            let spec = LayerSpec::new(shape, ranks, 64);
            let mut layer = FusedLayer::new(spec, |r| gen.rank_fp8(r, ranks)).map_err(err)?;
            let inputs = bf16_inputs(&world);
            let want = layer.forward(&inputs, Some(48)).map_err(err)?;
            // Unequal; below a rank's T (48); above the buffer's capacity (T_max 64 → 128).
            for bounds in [[48, 48, 64, 48], [32; 4], [256; 4]] {
                let staged = layer.stage_with_bounds(&inputs, &bounds).map_err(err)?;
                layer.launch(&staged).map_err(err)?;
                match layer.finish() {
                    Ok(()) => return Err(format!("bounds {bounds:?} were accepted")),
                    Err(e)
                        if !e.to_string().contains("num_tokens_bound")
                            || !e.to_string().contains("4 of 4 ranks") =>
                    {
                        return Err(format!("bounds {bounds:?}: {e}"))
                    }
                    Err(_) => {}
                }
            }
            if layer.forward(&inputs, Some(48)).map_err(err)? != want {
                return Err("the good call after the rejected ones gave other bits".into());
            }
            Ok("unequal bounds, a bound below T and one above the capacity rejected on every rank; the layer stays usable".into())
        }),
    }
}

/// A rank that never launches: the others report it (rank and wait) within the deadline, the
/// layer refuses further calls, and a new layer runs correctly.
fn missing_rank() -> Check {
    Check {
        name: "layer fused tiny R=2 fault: a rank that never arrives".into(),
        run: Box::new(|| {
            let shape = shape("tiny", None);
            let world = generate_world(shape, 2, 32, &routing("uniform", 23)).map_err(err)?;
            let gen = WeightGen::new(shape, 23);
            let spec = LayerSpec::new(shape, 2, 32);
            let deadline = FAULT_DEADLINE;
            let mut layer =
                FusedLayer::with_deadline(spec, |r| gen.rank_fp8(r, 2), deadline).map_err(err)?;
            let inputs = bf16_inputs(&world);
            let staged = layer.stage(&inputs, None).map_err(err)?;
            let start = std::time::Instant::now();
            layer.launch_ranks(&staged, &[true, false]).map_err(err)?;
            let e = match layer.finish() {
                Ok(()) => return Err("the call succeeded without rank 1".into()),
                Err(e) => e.to_string(),
            };
            let took = start.elapsed();
            if !e.contains("rank 0") || !e.contains("routing") {
                return Err(format!("the error does not name rank 0's wait: {e}"));
            }
            if layer.forward(&inputs, None).is_ok() {
                return Err("a broken layer accepted another call".into());
            }
            drop(layer);
            reported_then_recovered(&world, &gen, spec, e, took, deadline)
        }),
    }
}

/// The end of a fault check: the error `e` came within ten deadlines (the waits of the call's
/// kernels one after another, and the host's share), and a new layer of `spec` (its kind) in the
/// same process is within the contract's bound of the CPU reference.
fn reported_then_recovered(
    world: &WorldInputs,
    gen: &WeightGen,
    spec: LayerSpec,
    e: String,
    took: std::time::Duration,
    deadline: std::time::Duration,
) -> Result<String, String> {
    if took > 10 * deadline {
        return Err(format!("reported after {took:?}, deadline {deadline:?}"));
    }
    let ranks = world.num_ranks();
    let mut fresh = MoeLayer::new(spec, |r| gen.rank_fp8(r, ranks)).map_err(err)?;
    let got = fresh.forward(&bf16_inputs(world), None).map_err(err)?;
    let options = LayerOptions::for_shape(&world.shape);
    let want = fused_layer(world, gen, &options, &|_, _| {}).map_err(err)?;
    let d = diff::diff_bf16(&got, &want);
    if d.is_nan() || d > MAX_DIFF {
        return Err(format!(
            "the new layer: diff {d:.3e} against the CPU reference"
        ));
    }
    Ok(format!(
        "reported in {:.0} ms: {e}; a new layer is correct (diff {d:.2e})",
        took.as_secs_f64() * 1e3
    ))
}

/// The budget of every wait in the fault checks.
const FAULT_DEADLINE: std::time::Duration = std::time::Duration::from_millis(200);

/// The verdict on a call that `faulty`'s fault made fail with `e`: for a corrupt count, every
/// rank rejected it naming `faulty`; else every other rank reported a wait of its own that names
/// `faulty`.
fn fault_verdict(
    e: String,
    faulty: usize,
    ranks: usize,
    corrupt_count: bool,
    waits: impl FnOnce() -> Result<Vec<Option<megamoe_cuda::Error>>, String>,
) -> Result<String, String> {
    if corrupt_count {
        if !e.contains(&format!("rank {faulty} published"))
            || !e.contains(&format!("{ranks} of {ranks} ranks"))
        {
            return Err(format!(
                "the error does not name rank {faulty} on every rank: {e}"
            ));
        }
        return Ok(e);
    }
    every_other_rank_names(&waits()?, faulty)
}

/// A fault of the fused kernel's probe instantiation on rank 2 of four (a rank that stops after
/// publishing its routing, after half of its tasks, or before signalling its L2 rows; a corrupt
/// published T; a peer that sleeps past the deadline, then goes on): every other rank reports it
/// within the deadline (its rank, the wait, rank 2), or every rank rejects the call naming rank
/// 2; and a new layer in the same process is correct.
fn fused_fault(fault: Fault) -> Check {
    faulty_rank_check(
        Kind::Fused,
        41,
        fault == Fault::CorruptCount,
        format!("{fault:?}"),
        move |spec, gen| {
            let layer = FusedLayer::with_fault(
                spec,
                |r| gen.rank_fp8(r, spec.ranks),
                FAULT_DEADLINE,
                FAULTY_RANK,
                fault,
            )?;
            Ok(MoeLayer::Fused(Box::new(layer)))
        },
    )
}

/// A fault of dispatch's and combine's probe instantiations on rank 2 of four inside the split
/// layer: as [`fused_fault`].
fn split_fault(fault: FaultKind) -> Check {
    faulty_rank_check(
        Kind::Split,
        43,
        fault == FaultKind::CorruptCount,
        format!("{fault:?}"),
        move |spec, gen| {
            let injected = InjectedFault {
                rank: FAULTY_RANK,
                kind: fault,
            };
            let layer = SplitLayer::with_fault(
                spec,
                |r| gen.rank_fp8(r, spec.ranks),
                FAULT_DEADLINE,
                injected,
            )?;
            Ok(MoeLayer::Split(Box::new(layer)))
        },
    )
}

/// The rank the fault checks of both layer kinds inject their fault into, of four.
const FAULTY_RANK: usize = 2;

/// The body of both kinds' fault checks: `build` makes the tiny R=4 layer of `kind` with its
/// fault on rank 2 (seeded by `seed`); its call must fail as [`fault_verdict`] says (a rejection
/// on every rank when `corrupt_count`), and a new layer must then be correct.
fn faulty_rank_check(
    kind: Kind,
    seed: u64,
    corrupt_count: bool,
    fault: String,
    build: impl Fn(LayerSpec, &WeightGen) -> crate::Result<MoeLayer> + 'static,
) -> Check {
    Check {
        name: format!("layer {} tiny R=4 fault on rank 2: {fault}", kind.name()),
        run: Box::new(move || {
            let shape = shape("tiny", None);
            let (ranks, faulty) = (4, FAULTY_RANK);
            let world = generate_world(shape, ranks, 48, &routing("uniform", seed)).map_err(err)?;
            let gen = WeightGen::new(shape, seed);
            let spec = LayerSpec {
                kind,
                ..LayerSpec::new(shape, ranks, 48)
            };
            let mut layer = build(spec, &gen).map_err(err)?;
            let start = std::time::Instant::now();
            let e = match layer.forward(&bf16_inputs(&world), None) {
                Ok(_) => return Err(format!("the call succeeded with rank {faulty} faulty")),
                Err(e) => e.to_string(),
            };
            let took = start.elapsed();
            let verdict = fault_verdict(e, faulty, ranks, corrupt_count, || {
                layer.expired_waits().map_err(err)
            })?;
            drop(layer);
            reported_then_recovered(&world, &gen, spec, verdict, took, FAULT_DEADLINE)
        }),
    }
}

/// A call captured as CUDA graphs and replayed on new inputs of the same sizes gives the bits
/// of a plain forward of those inputs.
fn graph_replay() -> Check {
    Check {
        name: "layer fused tiny R=2 graph replay with new inputs".into(),
        run: Box::new(|| {
            let shape = shape("tiny", None);
            let gen = WeightGen::new(shape, 29);
            let spec = LayerSpec::new(shape, 2, 64);
            let mut layer = FusedLayer::new(spec, |r| gen.rank_fp8(r, 2)).map_err(err)?;
            let first = generate_world(shape, 2, 64, &routing("uniform", 31)).map_err(err)?;
            let second = generate_world(shape, 2, 64, &routing("zipf", 37)).map_err(err)?;
            let want = layer.forward(&bf16_inputs(&second), None).map_err(err)?;
            let staged = layer.stage(&bf16_inputs(&first), None).map_err(err)?;
            let graph = layer.capture(&staged).map_err(err)?;
            layer.replay(&graph, &staged).map_err(err)?;
            layer.finish().map_err(err)?;
            let staged2 = layer.stage(&bf16_inputs(&second), None).map_err(err)?;
            layer.replay(&graph, &staged2).map_err(err)?;
            layer.finish().map_err(err)?;
            if layer.outputs(&staged2).map_err(err)? != want {
                return Err("the replay on new inputs gave other bits".into());
            }
            Ok("replayed twice; the second replay's bits equal a forward of its inputs".into())
        }),
    }
}

/// Every layer check of the selftest.
pub fn gpu_checks() -> Vec<Check> {
    let mut checks = Vec::new();
    for layer in Kind::ALL {
        for kind in ["uniform", "zipf", "masked", "uneven"] {
            for ranks in [1, 2, 4, 8] {
                checks.push(against_reference(
                    layer, "tiny", None, ranks, 64, kind, None,
                ));
            }
        }
        checks.push(against_reference(
            layer,
            "tiny",
            None,
            2,
            64,
            "uniform",
            Some(0.5),
        ));
        // The EP8-rank proxies (SPEC §9) and their split over 2, 4 and 8 ranks.
        for (preset, experts, ranks, tokens, kind) in [
            ("flash", 32, 1, 192, "uniform"),
            ("flash", 32, 1, 192, "zipf"),
            ("flash", 32, 1, 192, "masked"),
            ("flash", 32, 2, 96, "uneven"),
            ("flash", 32, 4, 48, "uniform"),
            ("flash", 32, 8, 24, "uniform"),
            ("pro", 48, 1, 96, "uniform"),
            ("pro", 48, 2, 48, "zipf"),
            ("pro", 48, 4, 24, "zipf"),
            ("pro", 48, 8, 12, "uniform"),
        ] {
            checks.push(against_reference(
                layer,
                preset,
                Some(experts),
                ranks,
                tokens,
                kind,
                None,
            ));
        }
        checks.push(fp8_input(layer));
        checks.push(bad_inputs(layer));
        checks.push(non_finite_input(layer));
    }
    // Both accumulations on SPEC §9's proxies of flash, pro and glm (EP8: a rank's experts).
    for (preset, experts, tokens) in [
        ("tiny", None, 64),
        ("flash", Some(32), 256),
        ("pro", Some(48), 256),
        ("glm", Some(36), 256),
    ] {
        checks.push(accuracy(preset, experts, tokens));
    }
    checks.push(ring_wraps(1, 4096));
    checks.push(ring_wraps(2, 4096));
    checks.push(bound_mismatch());
    checks.push(missing_rank());
    for fault in [
        Fault::StopAfterRouting,
        Fault::StopMidTasks,
        Fault::StopMidCombine,
        Fault::CorruptCount,
        Fault::SlowPeer(2 * FAULT_DEADLINE),
    ] {
        checks.push(fused_fault(fault));
    }
    for fault in megamoe_ep::selftest::fault_kinds(FAULT_DEADLINE) {
        checks.push(split_fault(fault));
    }
    checks.push(graph_replay());
    checks
}
