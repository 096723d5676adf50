//! Emulates the GPU layer's arithmetic on the CPU and measures how far it lands from the
//! reference (docs/RELIABILITY.md, Open):
//! `cargo run --release -p megamoe-core --example accuracy_emulation -- [tiny batches] [flash-like batches]`.
//!
//! SPEC §3's pipeline (the reference's quantizer, e4m3 rounding, SwiGLU, weights and routing;
//! no clamp, as in the soak) with two knobs, both off in the exact model, which must give the
//! reference's bits on every batch:
//! - accumulation ([`Acc`]): inside each scale group of K (G columns, G/32 tensor-core steps of
//!   k = 32, each into the same accumulator) the partial sum after each step keeps 13–15
//!   mantissa bits, truncated or rounded, either of the exact step sum or of addends first
//!   aligned to the largest one's exponent and truncated there; the group's sum is then
//!   promoted into the f32 running sum as in the reference (or, one model, after every step);
//! - fast SwiGLU: e^-g = 2^(f32(−g·log2 e)) times (1 + ε₁), g/(1+e) = g · f32((1/(1+e))·(1 + ε₂)),
//!   ε uniform in ±2^-22 (ex2.approx, div.approx), drawn per element from a hash of its place.
//!
//! Batches: the one the soak failed on (its draws replayed from the routing seed), then random
//! ones drawn as the soak draws them on its setups.

use half::bf16;
use megamoe_core::diff::diff_bf16;
use megamoe_core::numerics::{e4m3_to_f32, INPUT_SCALE_FLOOR, INTERMEDIATE_SCALE_FLOOR};
use megamoe_core::quant::{quantize_rows, INPUT_GROUP, WEIGHT_BLOCK};
use megamoe_core::reference::swiglu;
use megamoe_core::rng::{splitmix64, unit, SplitMix64};
use megamoe_core::routing::{soak_batch, soak_setups};
use megamoe_core::{fused_layer, LayerOptions, Shape, WeightGen, WorldInputs};
use rayon::prelude::*;

/// K columns per tensor-core step.
const STEP: usize = 32;

/// How a tensor-core step of k = 32 adds its products into the in-group partial sum.
#[derive(Clone, Copy, PartialEq)]
enum Acc {
    /// Exactly (SPEC §3).
    Exact,
    /// The partial sum after the step rounded to nearest even to this many mantissa bits.
    Round(u32),
    /// The partial sum after the step truncated toward zero to this many mantissa bits.
    Truncate(u32),
    /// Every addend (the partial sum and the 32 products) first truncated toward zero to a
    /// multiple of 2^(e − bits), e the largest addend's exponent, then the sum truncated too.
    AlignTruncate(u32),
}

/// What the emulation changes against SPEC §3.
#[derive(Clone, Copy)]
struct Model {
    name: &'static str,
    acc: Acc,
    /// Promote into the f32 running sum after every k32 step instead of every scale group.
    promote_each_step: bool,
    fast_swiglu: bool,
}

const fn model(name: &'static str, acc: Acc, fast_swiglu: bool) -> Model {
    Model {
        name,
        acc,
        promote_each_step: false,
        fast_swiglu,
    }
}

/// The exact model first, the full one last.
const MODELS: [Model; 9] = [
    model("exact", Acc::Exact, false),
    model("fast SwiGLU", Acc::Exact, true),
    model("acc 15 bits rounded", Acc::Round(15), false),
    model("acc 14 bits rounded", Acc::Round(14), false),
    model("acc 13 bits truncated", Acc::Truncate(13), false),
    model("acc 13 bits aligned", Acc::AlignTruncate(13), false),
    Model {
        promote_each_step: true,
        ..model(
            "acc 13 aligned, promoted per k32",
            Acc::AlignTruncate(13),
            false,
        )
    },
    model("acc 13 truncated + fast SwiGLU", Acc::Truncate(13), true),
    model("acc 13 aligned + fast SwiGLU", Acc::AlignTruncate(13), true),
];

/// `x` kept to `bits` mantissa bits, truncated toward zero or rounded to nearest even.
fn keep_bits(x: f64, bits: u32, truncate: bool) -> f64 {
    let drop = 52 - bits;
    let b = x.to_bits();
    let b = if truncate {
        b
    } else {
        b + (1 << (drop - 1)) - 1 + ((b >> drop) & 1)
    };
    f64::from_bits(b & !((1u64 << drop) - 1))
}

/// The partial sum after one k32 step of products `w · x` under `acc`.
fn step(partial: f64, w: &[f32], x: &[f64], acc: Acc) -> f64 {
    let products = w.iter().zip(x).map(|(&w, &x)| f64::from(w) * x);
    match acc {
        Acc::Exact => partial + products.sum::<f64>(),
        Acc::Round(bits) => keep_bits(partial + products.sum::<f64>(), bits, false),
        Acc::Truncate(bits) => keep_bits(partial + products.sum::<f64>(), bits, true),
        Acc::AlignTruncate(bits) => {
            let exponent = |v: f64| ((v.to_bits() >> 52) & 0x7ff) as i32;
            let largest = products
                .clone()
                .fold(exponent(partial), |e, p| e.max(exponent(p)));
            // 2^(e − bits) (e biased; a tiny unit when every addend is 0, each quotient 0).
            let unit = f64::from_bits(((largest - bits as i32).max(1) as u64) << 52);
            let align = |v: f64| (v / unit).trunc() * unit;
            let sum = products.fold(align(partial), |s, p| s + align(p));
            keep_bits(sum, bits, true)
        }
    }
}

/// One expert's weights: e4m3 values as f32 and block scales, W1 `[2I, H]` and W2 `[H, I]`.
struct Weights {
    w1: (Vec<f32>, Vec<f32>),
    w2: (Vec<f32>, Vec<f32>),
}

fn experts(gen: &WeightGen) -> Vec<Weights> {
    let decode = |q: &megamoe_core::quant::QuantBlocks| {
        (
            q.codes.iter().map(|&c| e4m3_to_f32(c)).collect(),
            q.scales.clone(),
        )
    };
    (0..gen.shape.experts)
        .into_par_iter()
        .map(|e| {
            let q = gen.expert_fp8(e);
            Weights {
                w1: decode(&q.w1),
                w2: decode(&q.w2),
            }
        })
        .collect()
}

/// out[n] = Σ over scale groups j of K (ascending) of fma(f32(group sum), sa[j]·sb, running),
/// the group sum accumulated per k32 step as `model` says.
fn gemm_row(
    x: &[f64],
    xs: &[f32],
    group: usize,
    w: &(Vec<f32>, Vec<f32>),
    model: Model,
) -> Vec<f32> {
    let cols = x.len();
    let rows = w.0.len() / cols;
    (0..rows)
        .map(|n| {
            let (row, scales) = (&w.0[n * cols..][..cols], &w.1);
            let mut running = 0f32;
            for (j, (w, x)) in row
                .chunks_exact(group)
                .zip(x.chunks_exact(group))
                .enumerate()
            {
                let sb =
                    scales[(n / WEIGHT_BLOCK) * (cols / WEIGHT_BLOCK) + j * group / WEIGHT_BLOCK];
                let mut partial = 0f64;
                for (w, x) in w.chunks_exact(STEP).zip(x.chunks_exact(STEP)) {
                    partial = step(partial, w, x, model.acc);
                    if model.promote_each_step {
                        running = (partial as f32).mul_add(xs[j] * sb, running);
                        partial = 0.0;
                    }
                }
                if !model.promote_each_step {
                    running = (partial as f32).mul_add(xs[j] * sb, running);
                }
            }
            running
        })
        .collect()
}

/// silu(g)·u·weight with ex2.approx and div.approx (module comment); `place` seeds ε.
fn fast_swiglu(g: f32, u: f32, weight: f32, place: u64) -> f32 {
    let eps = |bits: u64| (2.0 * unit(bits) - 1.0) * (-22f64).exp2();
    let h = splitmix64(place);
    let t = -g * std::f32::consts::LOG2_E;
    let e = (f64::from(t).exp2() * (1.0 + eps(h))) as f32;
    let r = ((1.0 / f64::from(1.0 + e)) * (1.0 + eps(splitmix64(h)))) as f32;
    g * r * u * weight
}

/// The layer on `world` under `model`: one bf16 `[T, H]` output per rank.
fn layer(world: &WorldInputs, weights: &[Weights], group: usize, model: Model) -> Vec<Vec<bf16>> {
    let Shape {
        hidden,
        inter,
        topk,
        ..
    } = world.shape;
    let decode = |c: &[u8]| -> Vec<f64> { c.iter().map(|&c| f64::from(e4m3_to_f32(c))).collect() };
    let mut outputs = Vec::new();
    for (rank, r) in world.ranks.iter().enumerate() {
        let x: Vec<f32> = r.x.iter().map(|v| v.to_f32()).collect();
        let q = quantize_rows(&x, r.tokens, hidden, INPUT_GROUP, INPUT_SCALE_FLOOR).unwrap();
        let groups = hidden / INPUT_GROUP;
        let mut y = vec![bf16::ZERO; r.tokens * hidden];
        for t in 0..r.tokens {
            let xq = decode(&q.codes[t * hidden..][..hidden]);
            let mut sum = vec![0f32; hidden];
            for k in 0..topk {
                let Ok(e) = usize::try_from(r.topk_idx[t * topk + k]) else {
                    continue;
                };
                let weight = r.topk_weights[t * topk + k];
                let h = gemm_row(
                    &xq,
                    &q.scales[t * groups..][..groups],
                    INPUT_GROUP,
                    &weights[e].w1,
                    model,
                );
                let a: Vec<f32> = (0..inter)
                    .map(|i| {
                        let (g, u) = (h[i], h[inter + i]);
                        if model.fast_swiglu {
                            let place = ((rank * 4096 + t) * topk + k) as u64 * 65536 + i as u64;
                            fast_swiglu(g, u, weight, place)
                        } else {
                            swiglu(g, u, None, weight)
                        }
                    })
                    .collect();
                let aq = quantize_rows(&a, 1, inter, group, INTERMEDIATE_SCALE_FLOOR).unwrap();
                let o = gemm_row(&decode(&aq.codes), &aq.scales, group, &weights[e].w2, model);
                for (s, o) in sum.iter_mut().zip(o) {
                    *s += bf16::from_f32(o).to_f32();
                }
            }
            for (y, s) in y[t * hidden..].iter_mut().zip(sum) {
                *y = bf16::from_f32(s);
            }
        }
        outputs.push(y);
    }
    outputs
}

/// The diff of every model against the reference on `world`; panics unless the exact model
/// gives the reference's bits.
fn diffs(world: &WorldInputs, gen: &WeightGen, weights: &[Weights]) -> Vec<f64> {
    let options = LayerOptions::for_shape(&world.shape);
    let want = fused_layer(world, gen, &options, &|_, _| {}).unwrap();
    MODELS
        .iter()
        .map(|&m| {
            let got = layer(world, weights, options.group, m);
            if m.name == "exact" {
                assert!(got == want, "the exact model differs from the reference");
            }
            diff_bf16(&got, &want)
        })
        .collect()
}

/// The inverse of [`splitmix64`]: the state whose next number is `out`.
fn splitmix64_state(out: u64) -> u64 {
    let unshift = |x: u64, s: u32| (0..64 / s).fold(x, |y, _| x ^ (y >> s));
    let inverse = |c: u64| {
        (0..6).fold(c, |i: u64, _| {
            i.wrapping_mul(2u64.wrapping_sub(c.wrapping_mul(i)))
        })
    };
    let mut z = unshift(out, 31);
    z = unshift(z.wrapping_mul(inverse(0x94D0_49BB_1331_11EB)), 27);
    z = unshift(z.wrapping_mul(inverse(0xBF58_476D_1CE4_E5B9)), 30);
    z.wrapping_sub(0x9E37_79B9_7F4A_7C15)
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// Per model: median, 99th percentile, max and the fraction over 1e-4 of `runs` (valid slots,
/// diffs), those with at least one valid slot.
fn report(what: &str, runs: &[(usize, Vec<f64>)]) {
    let runs: Vec<_> = runs.iter().filter(|r| r.0 > 0).collect();
    println!("{what}: {} batches with a valid slot", runs.len());
    if runs.is_empty() {
        return;
    }
    for (i, m) in MODELS.iter().enumerate().skip(1) {
        let mut d: Vec<f64> = runs.iter().map(|r| r.1[i]).collect();
        d.sort_by(f64::total_cmp);
        let over = d.iter().filter(|&&v| v > 1e-4).count();
        println!(
            "  {:32} median {:.2e}  p99 {:.2e}  max {:.2e}  over 1e-4: {over} ({:.2} %)",
            m.name,
            quantile(&d, 0.5),
            quantile(&d, 0.99),
            d[d.len() - 1],
            100.0 * over as f64 / d.len() as f64
        );
    }
}

/// Median diff and share over 1e-4 of the full model by number of valid slots.
fn by_valid_slots(runs: &[(usize, Vec<f64>)]) {
    let full = MODELS.len() - 1;
    println!("  {} by valid (token, slot) rows:", MODELS[full].name);
    for (lo, hi) in [
        (1, 16),
        (17, 32),
        (33, 64),
        (65, 128),
        (129, 256),
        (257, 512),
        (513, 2048),
    ] {
        let mut d: Vec<f64> = runs
            .iter()
            .filter(|r| (lo..=hi).contains(&r.0))
            .map(|r| r.1[full])
            .collect();
        if d.is_empty() {
            continue;
        }
        d.sort_by(f64::total_cmp);
        let over = d.iter().filter(|&&v| v > 1e-4).count();
        println!(
            "    {lo:4}-{hi:4}: {:5} batches, median {:.2e}, p99 {:.2e}, max {:.2e}, over 1e-4 {:.2} %",
            d.len(),
            quantile(&d, 0.5),
            quantile(&d, 0.99),
            d[d.len() - 1],
            100.0 * over as f64 / d.len() as f64
        );
    }
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().unwrap())
        .collect();
    let (tiny_batches, flash_batches) = (
        args.first().copied().unwrap_or(2000),
        args.get(1).copied().unwrap_or(40),
    );
    // Setup i has weight seed i (the soak's seed 0).
    let setups: Vec<_> = soak_setups()
        .into_iter()
        .enumerate()
        .map(|(i, (name, shape, ranks, t_max))| {
            let gen = WeightGen::new(shape, i as u64);
            (name, shape, ranks, t_max, gen, experts(&gen))
        })
        .collect();

    // The soak's failing batch: tiny R=2 T_max=64, its draws replayed from the routing seed.
    let (_, shape, ranks, t_max, gen, weights) = &setups[1];
    let mut rng = SplitMix64::new(splitmix64_state(0xb081_27c9_611d_2504));
    let (world, bound, label) = soak_batch(*shape, *ranks, *t_max, &mut rng).unwrap();
    println!(
        "soak batch: tiny R=2 T_max=64: {label}, {} valid slots",
        world.valid_slots()
    );
    assert!(
        label.contains("T [13, 8]") && bound.is_none(),
        "not the soak's batch"
    );
    for (m, d) in MODELS.iter().zip(diffs(&world, gen, weights)) {
        println!("  {:32} diff {d:.3e}", m.name);
    }

    for (what, range, batches) in [
        ("tiny", 0..4, tiny_batches),
        ("flash-like", 4..6, flash_batches),
    ] {
        let runs: Vec<(usize, Vec<f64>)> = (0..batches)
            .into_par_iter()
            .map(|b| {
                let mut rng = SplitMix64::new(splitmix64(b as u64 ^ (range.start as u64) << 32));
                let (_, shape, ranks, t_max, gen, weights) =
                    &setups[range.start + rng.below(range.len())];
                let (world, _, _) = soak_batch(*shape, *ranks, *t_max, &mut rng).unwrap();
                (world.valid_slots(), diffs(&world, gen, weights))
            })
            .collect();
        report(&format!("{what}, {batches} soak-like batches"), &runs);
        by_valid_slots(&runs);
    }
}
