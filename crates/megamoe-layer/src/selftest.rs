//! The GPU checks of the layer (for `megamoe selftest`): the output against megamoe-core's CPU
//! reference (SPEC §3: diff ≤ 1e-4) on fresh generated batches of every SPEC §8 routing, the
//! output bits across runs and across R = 1, 2, 4, 8 (virtual ranks) on the same global batch,
//! bf16 input against the same input quantized on the host, and bad input rejected with nothing
//! written.

use half::bf16;
use megamoe_core::preset::Shape;
use megamoe_core::routing::{generate_world, RoutingKind, RoutingSpec};
use megamoe_core::{diff, fused_layer, LayerOptions, Preset, WeightGen, WorldInputs};

use megamoe_cuda::selftest::Check;

use crate::inputs::{bf16_inputs, fp8_inputs, quantize_inputs, spec_for};
use crate::spec::LayerSpec;
use crate::split::{Activations, RankInput, SplitLayer};

/// The contract's bound on the GPU output's distance to the CPU reference (SPEC §3).
pub const MAX_DIFF: f64 = 1e-4;

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

/// Builds the split layer for `world` (T_max = the world's largest T, at least 1) with the
/// seeded weights, and runs it on bf16 input.
fn run_layer(
    world: &WorldInputs,
    gen: &WeightGen,
    options: &LayerOptions,
) -> Result<Vec<Vec<bf16>>, String> {
    let ranks = world.num_ranks();
    let mut layer =
        SplitLayer::new(spec_for(world, options), |r| gen.rank_fp8(r, ranks)).map_err(err)?;
    layer.forward(&bf16_inputs(world), None).map_err(err)
}

/// The GPU layer against the CPU reference on one generated batch; also the bits of a second
/// run, the all-masked tokens (exactly 0) and, for `ranks > 1`, the bits of the same global
/// batch on one rank.
fn against_reference(
    preset: &'static str,
    experts: Option<usize>,
    ranks: usize,
    tokens: usize,
    kind: &'static str,
    clamp: Option<f32>,
) -> Check {
    let name = format!(
        "layer split {preset}{} R={ranks} T={tokens} {kind}{}",
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
            let got = run_layer(&world, &gen, &options)?;
            let d = diff::diff_bf16(&got, &want);
            if d.is_nan() || d > MAX_DIFF {
                return Err(format!(
                    "diff {d:.3e} against the CPU reference (bound {MAX_DIFF:.0e})"
                ));
            }
            let again = run_layer(&world, &gen, &options)?;
            if diff::output_hash(&again) != diff::output_hash(&got) {
                return Err("a second run gave other bits".into());
            }
            let mut all_masked = 0;
            for (r, inputs) in world.ranks.iter().enumerate() {
                for t in 0..inputs.tokens {
                    let k = shape.topk;
                    if inputs.topk_idx[t * k..][..k].iter().all(|&e| e < 0) {
                        all_masked += 1;
                        if got[r][t * shape.hidden..][..shape.hidden]
                            .iter()
                            .any(|v| v.to_bits() != 0)
                        {
                            return Err(format!(
                                "rank {r} token {t}: every slot masked, output not 0"
                            ));
                        }
                    }
                }
            }
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
                let single = run_layer(&one, &gen, &options)?;
                let flat: Vec<bf16> = got.concat();
                if single[0] != flat {
                    return Err(format!(
                        "R = {ranks} and R = 1 differ on the same global batch"
                    ));
                }
                note += ", bits equal to R = 1";
            }
            Ok(note)
        }),
    }
}

/// bf16 input quantized by the layer against the same input quantized on the host and passed as
/// e4m3 + scales: the same bits; and the cumulative per-expert counts after two calls.
fn fp8_input() -> Check {
    Check {
        name: "layer split tiny R=2 fp8 input".into(),
        run: Box::new(|| {
            let shape = shape("tiny", None);
            let world = generate_world(shape, 2, 96, &routing("uniform", 7)).map_err(err)?;
            let gen = WeightGen::new(shape, 7);
            let options = LayerOptions::for_shape(&shape);
            let from_bf16 = run_layer(&world, &gen, &options)?;
            let quant = quantize_inputs(&world);
            let spec = LayerSpec::new(shape, 2, 96);
            let mut layer = SplitLayer::new(spec, |r| gen.rank_fp8(r, 2)).map_err(err)?;
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
fn bad_inputs() -> Check {
    Check {
        name: "layer split bad input rejected, nothing written".into(),
        run: Box::new(|| {
            let shape = shape("tiny", None);
            let world = generate_world(shape, 2, 32, &routing("uniform", 11)).map_err(err)?;
            let gen = WeightGen::new(shape, 11);
            let mut layer = SplitLayer::new(LayerSpec::new(shape, 2, 32), |r| gen.rank_fp8(r, 2))
                .map_err(err)?;
            let good = bf16_inputs(&world);
            let want = layer.forward(&good, None).map_err(err)?;
            let before = layer.input_bytes().map_err(err)?;
            let k = shape.topk;
            let mut out_of_range = world.ranks[1].topk_idx.clone();
            out_of_range[5] = shape.experts as i32;
            let mut duplicate = world.ranks[1].topk_idx.clone();
            duplicate[k + 1] = duplicate[k];
            let long_x: Vec<bf16> = vec![bf16::ZERO; 33 * shape.hidden];
            let long_idx = vec![0i32; 33 * k];
            let long_w = vec![0f32; 33 * k];
            let short_w = &world.ranks[1].topk_weights[1..];
            let mut nan_w = world.ranks[1].topk_weights.clone();
            nan_w[0] = f32::NAN;
            let cases: Vec<(&str, Vec<RankInput>, Option<usize>)> = vec![
                (
                    "topk_idx",
                    vec![
                        good[0],
                        RankInput {
                            topk_idx: &out_of_range,
                            ..good[1]
                        },
                    ],
                    None,
                ),
                (
                    "topk_idx",
                    vec![
                        good[0],
                        RankInput {
                            topk_idx: &duplicate,
                            ..good[1]
                        },
                    ],
                    None,
                ),
                (
                    "tokens",
                    vec![
                        good[0],
                        RankInput {
                            x: Activations::Bf16(&long_x),
                            topk_idx: &long_idx,
                            topk_weights: &long_w,
                        },
                    ],
                    None,
                ),
                (
                    "topk_weights",
                    vec![
                        good[0],
                        RankInput {
                            topk_weights: short_w,
                            ..good[1]
                        },
                    ],
                    None,
                ),
                (
                    "topk_weights",
                    vec![
                        good[0],
                        RankInput {
                            topk_weights: &nan_w,
                            ..good[1]
                        },
                    ],
                    None,
                ),
                (
                    "x",
                    vec![
                        good[0],
                        RankInput {
                            x: Activations::Bf16(&world.ranks[1].x[1..]),
                            ..good[1]
                        },
                    ],
                    None,
                ),
                ("inputs", vec![good[0]], None),
                ("num_tokens_bound", good.clone(), Some(31)),
                ("num_tokens_bound", good.clone(), Some(33)),
            ];
            for (arg, inputs, bound) in &cases {
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
            if layer.forward(&good, Some(32)).map_err(err)? != want {
                return Err("the good call after the bad ones gave other bits".into());
            }
            Ok(format!("{} bad calls rejected", cases.len()))
        }),
    }
}

/// SPEC §6: a NaN or ±Inf in one token's `x` changes only that token's output; every other
/// token keeps its bits.
fn non_finite_input() -> Check {
    Check {
        name: "layer split tiny R=2 NaN/Inf in one token's x".into(),
        run: Box::new(|| {
            let shape = shape("tiny", None);
            let world = generate_world(shape, 2, 32, &routing("uniform", 13)).map_err(err)?;
            let gen = WeightGen::new(shape, 13);
            let options = LayerOptions::for_shape(&shape);
            let mut layer =
                SplitLayer::new(spec_for(&world, &options), |r| gen.rank_fp8(r, 2)).map_err(err)?;
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

/// Every layer check of the selftest.
pub fn gpu_checks() -> Vec<Check> {
    let mut checks = Vec::new();
    for kind in ["uniform", "zipf", "masked", "uneven"] {
        for ranks in [1, 2, 4, 8] {
            checks.push(against_reference("tiny", None, ranks, 64, kind, None));
        }
    }
    checks.push(against_reference("tiny", None, 2, 64, "uniform", Some(0.5)));
    // The EP8-rank proxies (SPEC §9) and their split over two ranks.
    for kind in ["uniform", "zipf", "masked"] {
        checks.push(against_reference("flash", Some(32), 1, 192, kind, None));
    }
    checks.push(against_reference("flash", Some(32), 2, 96, "uneven", None));
    checks.push(against_reference("flash", Some(32), 4, 48, "uniform", None));
    checks.push(against_reference("pro", Some(48), 1, 96, "uniform", None));
    checks.push(against_reference("pro", Some(48), 2, 48, "zipf", None));
    checks.push(fp8_input());
    checks.push(bad_inputs());
    checks.push(non_finite_input());
    checks
}
