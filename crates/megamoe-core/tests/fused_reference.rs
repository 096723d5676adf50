//! The CPU reference of the fused layer (SPEC §3): hand-computed values, masking, empty
//! calls, independence of the world size and thread count, the FP8 cost against f64, both
//! intermediate scale groups, the clamp and input errors.

use half::bf16;
use megamoe_core::diff::{diff, diff_bf16, diff_bf16_f64, output_hash};
use megamoe_core::numerics::{e4m3_from_f32, e4m3_to_f32};
use megamoe_core::reference::{fused_layer, fused_layer_and_f64, fused_layer_f64, LayerOptions};
use megamoe_core::routing::{generate_rank, RoutingKind, RoutingSpec};
use megamoe_core::{
    Error, Matrix, Preset, RankInputs, Shape, WeightGen, WeightSource, WorldInputs,
};

/// Weights given element by element: `(expert, matrix, row, col, value)`, zero elsewhere.
struct HandWeights {
    shape: Shape,
    w1: Vec<Vec<f32>>,
    w2: Vec<Vec<f32>>,
}

impl HandWeights {
    fn new(shape: Shape, entries: &[(usize, Matrix, usize, usize, f32)]) -> Self {
        let size = |m: Matrix| m.dims(&shape).0 * m.dims(&shape).1;
        let mut w = HandWeights {
            shape,
            w1: vec![vec![0.0; size(Matrix::W1)]; shape.experts],
            w2: vec![vec![0.0; size(Matrix::W2)]; shape.experts],
        };
        for &(e, m, row, col, v) in entries {
            let cols = m.dims(&shape).1;
            match m {
                Matrix::W1 => w.w1[e][row * cols + col] = v,
                Matrix::W2 => w.w2[e][row * cols + col] = v,
            }
        }
        w
    }
}

impl WeightSource for HandWeights {
    fn shape(&self) -> Shape {
        self.shape
    }
    fn fill_block(
        &self,
        expert: usize,
        matrix: Matrix,
        first_row: usize,
        first_col: usize,
        width: usize,
        out: &mut [f32],
    ) {
        let cols = matrix.dims(&self.shape).1;
        let all = match matrix {
            Matrix::W1 => &self.w1[expert],
            Matrix::W2 => &self.w2[expert],
        };
        for (r, out) in out.chunks_exact_mut(width).enumerate() {
            out.copy_from_slice(&all[(first_row + r) * cols + first_col..][..width]);
        }
    }
}

fn no_progress(_: usize, _: usize) {}

fn silu32(g: f32) -> f32 {
    g / (1.0 + (-f64::from(g)).exp() as f32)
}

fn silu64(g: f64) -> f64 {
    g / (1.0 + (-g).exp())
}

/// L2 output of an intermediate whose only nonzero element `a` sits in column 0, against a W2
/// column-0 entry `w` that is a multiple of 2^-9 in a block whose amax is 0.875 (scale 2^-9).
fn l2_of_single_element(a: f32, w: f32) -> f32 {
    let sa = a.abs() / 448.0;
    let qa = e4m3_to_f32(e4m3_from_f32(a * (1.0 / sa)));
    assert_eq!(qa.abs(), 448.0, "the group's only element maps to ±448");
    let block_sum = qa * (w * 512.0); // exact: |block_sum| ≤ 448² < 2^24
    block_sum * (sa * (1.0 / 512.0))
}

#[test]
fn golden_values_on_a_hand_made_shape() {
    let shape = Shape {
        hidden: 128,
        inter: 128,
        experts: 2,
        topk: 2,
    };
    // Every weight block has amax 0.875 or is all zero, every input group amax 7: all scales
    // are powers of two (2^-9, 2^-6) and the L1 values below are exact.
    let weights = HandWeights::new(
        shape,
        &[
            (0, Matrix::W1, 0, 0, 0.875), // expert 0 gate row 0
            (0, Matrix::W1, 0, 1, 0.5),
            (0, Matrix::W1, 128, 0, 0.125), // expert 0 up row 0
            (0, Matrix::W1, 128, 1, 0.875),
            (0, Matrix::W2, 0, 0, 0.875),
            (0, Matrix::W2, 1, 0, 0.4375),
            (1, Matrix::W1, 0, 0, 0.875),
            (1, Matrix::W1, 128, 0, 0.875),
            (1, Matrix::W2, 2, 0, 0.875),
        ],
    );
    let mut x = vec![bf16::ZERO; 3 * 128];
    for (i, v) in [(0, 7.0), (1, 1.0), (128, 7.0), (256, -7.0), (257, 3.5)] {
        x[i] = bf16::from_f32(v);
    }
    let world = WorldInputs {
        shape,
        ranks: vec![RankInputs {
            tokens: 3,
            first_global_token: 0,
            x,
            topk_idx: vec![0, 1, -1, -1, -1, 1],
            // Masked slots carry NaN: they must never be read.
            topk_weights: vec![1.0, 0.5, f32::NAN, f32::NAN, f32::NAN, 2.0],
        }],
    };
    let options = LayerOptions::for_shape(&shape);
    assert_eq!(options.group, 64);
    let y = fused_layer(&world, &weights, &options, &no_progress).unwrap();
    let y = &y[0];

    // Token 0, expert 0: g = 7·0.875 + 1·0.5 = 6.625, u = 7·0.125 + 1·0.875 = 1.75.
    let a00 = silu32(6.625) * 1.75 * 1.0;
    // Token 0, expert 1: g = u = 7·0.875 = 6.125, slot weight 0.5.
    let a01 = silu32(6.125) * 6.125 * 0.5;
    // Token 2, expert 1 (slot 1): g = u = -7·0.875 = -6.125, slot weight 2.
    let a21 = silu32(-6.125) * -6.125 * 2.0;
    let mut expected = vec![0f32; 3 * 128];
    expected[0] = bf16::from_f32(l2_of_single_element(a00, 0.875)).to_f32();
    expected[1] = bf16::from_f32(l2_of_single_element(a00, 0.4375)).to_f32();
    expected[2] = bf16::from_f32(l2_of_single_element(a01, 0.875)).to_f32();
    expected[256 + 2] = bf16::from_f32(l2_of_single_element(a21, 0.875)).to_f32();
    let got: Vec<f32> = y.iter().map(|v| v.to_f32()).collect();
    assert_eq!(got, expected);
    // The same numbers by hand: silu(6.625)·1.75·0.875 ≈ 10.1317, half of it in column 1.
    assert!((got[0] - 10.1317).abs() < 0.05, "{}", got[0]);
    assert_eq!(got[1], got[0] / 2.0);
    assert!((got[2] - 0.5 * 0.875 * 6.125 * 6.125 / (1.0 + (-6.125f32).exp())).abs() < 0.05);
    assert!(
        y[128..256].iter().all(|v| v.to_bits() == 0),
        "all-masked token is exactly +0"
    );

    // The unquantized path on the same data is the exact formula.
    let y64 = fused_layer_f64(&world, &weights, &options, &no_progress).unwrap();
    let y64 = &y64[0];
    let exact00 = silu64(6.625) * 1.75 * 0.875;
    assert!((y64[0] - exact00).abs() < 1e-12 * exact00);
    assert!((y64[1] - exact00 / 2.0).abs() < 1e-12 * exact00);
    let exact21 = silu64(-6.125) * -6.125 * 2.0 * 0.875;
    assert!((y64[258] - exact21).abs() < 1e-12 * exact21);
    assert!(y64[128..256].iter().all(|&v| v == 0.0));
}

/// A seeded global batch from the routing generator (x standard normal in bf16, uniform top-k,
/// 20 % of slots masked), with every 7th token (3, 10, 17, …) fully masked and every third
/// router weight negated (weights may have any sign).
fn global_batch(shape: Shape, tokens: usize, seed: u64) -> RankInputs {
    let spec = RoutingSpec {
        kind: RoutingKind::Uniform,
        masked_ratio: 0.2,
        uneven_tokens: false,
        seed,
    };
    let mut batch = generate_rank(shape, 0, tokens, &spec).unwrap();
    for (t, idx) in batch.topk_idx.chunks_mut(shape.topk).enumerate() {
        if t % 7 == 3 {
            idx.fill(-1);
        }
    }
    for w in batch.topk_weights.iter_mut().step_by(3) {
        *w = -*w;
    }
    batch
}

/// Splits a global batch over `ranks` ranks as evenly as possible, with unequal counts.
fn split(shape: Shape, global: &RankInputs, ranks: usize) -> WorldInputs {
    let (h, k) = (shape.hidden, shape.topk);
    let mut first = 0;
    let ranks = (0..ranks)
        .map(|r| {
            let tokens = global.tokens / ranks + usize::from(r < global.tokens % ranks);
            let rows = first..first + tokens;
            first += tokens;
            RankInputs {
                tokens,
                first_global_token: rows.start,
                x: global.x[rows.start * h..rows.end * h].to_vec(),
                topk_idx: global.topk_idx[rows.start * k..rows.end * k].to_vec(),
                topk_weights: global.topk_weights[rows.start * k..rows.end * k].to_vec(),
            }
        })
        .collect();
    WorldInputs { shape, ranks }
}

fn tiny() -> Shape {
    Preset::by_name("tiny").unwrap().shape
}

#[test]
fn output_bits_do_not_depend_on_world_size_or_thread_count() {
    let shape = tiny();
    let weights = WeightGen::new(shape, 11);
    let options = LayerOptions::for_shape(&shape);
    let global = global_batch(shape, 61, 1);
    let one = fused_layer(&split(shape, &global, 1), &weights, &options, &no_progress).unwrap();
    assert!(one[0].iter().any(|v| v.to_f32() != 0.0));
    for ranks in [2, 4, 8] {
        let world = split(shape, &global, ranks);
        let y = fused_layer(&world, &weights, &options, &no_progress).unwrap();
        assert_eq!(y.len(), ranks);
        let flat: Vec<u16> = y.iter().flatten().map(|v| v.to_bits()).collect();
        let flat_one: Vec<u16> = one[0].iter().map(|v| v.to_bits()).collect();
        assert_eq!(flat, flat_one, "R = {ranks}");
        assert_eq!(output_hash(&y), output_hash(&one));
    }
    let single_thread = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let world = split(shape, &global, 4);
    let y =
        single_thread.install(|| fused_layer(&world, &weights, &options, &no_progress).unwrap());
    assert_eq!(output_hash(&y), output_hash(&one));
}

#[test]
fn one_pass_over_the_experts_gives_the_bits_of_both_layers() {
    let shape = tiny();
    let weights = WeightGen::new(shape, 5);
    let world = split(shape, &global_batch(shape, 45, 4), 4);
    for (group, clamp) in [(128, None), (64, Some(0.5))] {
        let options = LayerOptions { group, clamp };
        let (y, exact) = fused_layer_and_f64(&world, &weights, &options, &no_progress).unwrap();
        let alone = fused_layer(&world, &weights, &options, &no_progress).unwrap();
        let exact_alone = fused_layer_f64(&world, &weights, &options, &no_progress).unwrap();
        assert!(y.iter().flatten().any(|v| v.to_f32() != 0.0));
        let bits =
            |y: &[Vec<bf16>]| -> Vec<u16> { y.iter().flatten().map(|v| v.to_bits()).collect() };
        assert_eq!(bits(&y), bits(&alone), "G {group}, clamp {clamp:?}");
        let bits64 =
            |y: &[Vec<f64>]| -> Vec<u64> { y.iter().flatten().map(|v| v.to_bits()).collect() };
        assert_eq!(
            bits64(&exact),
            bits64(&exact_alone),
            "G {group}, clamp {clamp:?}"
        );
    }
}

#[test]
fn all_masked_tokens_give_exactly_zero() {
    let shape = tiny();
    let global = global_batch(shape, 20, 2);
    let world = split(shape, &global, 2);
    let y = fused_layer(
        &world,
        &WeightGen::new(shape, 3),
        &LayerOptions::for_shape(&shape),
        &no_progress,
    )
    .unwrap();
    let mut masked_tokens = 0;
    for (inputs, y) in world.ranks.iter().zip(&y) {
        for (t, idx) in inputs.topk_idx.chunks(shape.topk).enumerate() {
            let row = &y[t * shape.hidden..][..shape.hidden];
            if idx.iter().all(|&e| e < 0) {
                masked_tokens += 1;
                assert!(row.iter().all(|v| v.to_bits() == 0), "token {t}");
            } else {
                assert!(row.iter().any(|v| v.to_bits() != 0), "token {t}");
            }
        }
    }
    assert!(masked_tokens >= 3, "tokens 3, 10 and 17 are fully masked");
}

#[test]
fn zero_tokens_are_a_legal_call() {
    let shape = tiny();
    let weights = WeightGen::new(shape, 4);
    let options = LayerOptions::for_shape(&shape);
    let empty = split(shape, &global_batch(shape, 0, 3), 4);
    let y = fused_layer(&empty, &weights, &options, &no_progress).unwrap();
    assert_eq!(y, vec![Vec::<bf16>::new(); 4]);
    let y64 = fused_layer_f64(&empty, &weights, &options, &no_progress).unwrap();
    assert_eq!(y64, vec![Vec::<f64>::new(); 4]);
    // Some ranks empty, others not: 3 tokens over 8 ranks.
    let sparse = split(shape, &global_batch(shape, 3, 4), 8);
    let y = fused_layer(&sparse, &weights, &options, &no_progress).unwrap();
    assert_eq!(y.iter().map(Vec::len).sum::<usize>(), 3 * shape.hidden);
}

#[test]
fn fused_output_is_close_to_but_not_equal_to_the_f64_layer() {
    let shape = tiny();
    let weights = WeightGen::new(shape, 5);
    let options = LayerOptions::for_shape(&shape);
    let world = split(shape, &global_batch(shape, 48, 5), 2);
    let y = fused_layer(&world, &weights, &options, &no_progress).unwrap();
    let y64 = fused_layer_f64(&world, &weights, &options, &no_progress).unwrap();
    let d = diff_bf16_f64(&y, &y64);
    assert!(d > 1e-6 && d < 1e-2, "diff {d}");
}

#[test]
fn both_intermediate_scale_groups_work_and_differ() {
    let shape = tiny();
    let weights = WeightGen::new(shape, 6);
    let world = split(shape, &global_batch(shape, 32, 6), 4);
    let run = |group| {
        let options = LayerOptions { group, clamp: None };
        fused_layer(&world, &weights, &options, &no_progress).unwrap()
    };
    let (y64, y128) = (run(64), run(128));
    let exact = fused_layer_f64(
        &world,
        &weights,
        &LayerOptions::for_shape(&shape),
        &no_progress,
    )
    .unwrap();
    for y in [&y64, &y128] {
        let d = diff_bf16_f64(y, &exact);
        assert!(d > 0.0 && d < 1e-2, "diff {d}");
    }
    let between = diff_bf16(&y64, &y128);
    assert!(between > 0.0 && between < 1e-2, "diff {between}");
}

#[test]
fn the_clamp_limits_gate_and_up() {
    let shape = tiny();
    let weights = WeightGen::new(shape, 7);
    let world = split(shape, &global_batch(shape, 32, 7), 1);
    let clamped = LayerOptions {
        group: 64,
        clamp: Some(0.5),
    };
    let unclamped = LayerOptions {
        clamp: None,
        ..clamped
    };
    let (y, exact) = fused_layer_and_f64(&world, &weights, &clamped, &no_progress).unwrap();
    let (free, exact_free) =
        fused_layer_and_f64(&world, &weights, &unclamped, &no_progress).unwrap();
    assert_ne!(output_hash(&y), output_hash(&free));
    let d = diff_bf16_f64(&y, &exact);
    assert!(d < 1e-2, "diff {d}");
    assert!(
        diff(&exact[0], &exact_free[0]) > 1e-2,
        "the clamp at 0.5 matters"
    );
}

#[test]
fn progress_counts_every_routed_expert() {
    let shape = tiny();
    let world = split(shape, &global_batch(shape, 5, 8), 1);
    let mut routed: Vec<i32> = world.ranks[0]
        .topk_idx
        .iter()
        .copied()
        .filter(|&e| e >= 0)
        .collect();
    routed.sort_unstable();
    routed.dedup();
    let calls = std::sync::Mutex::new(Vec::new());
    let record = |done: usize, total: usize| calls.lock().unwrap().push((done, total));
    fused_layer(
        &world,
        &WeightGen::new(shape, 1),
        &LayerOptions::for_shape(&shape),
        &record,
    )
    .unwrap();
    let mut calls = calls.into_inner().unwrap();
    calls.sort_unstable();
    let expected: Vec<(usize, usize)> = (1..=routed.len()).map(|d| (d, routed.len())).collect();
    assert_eq!(calls, expected);
}

#[test]
fn bad_inputs_are_rejected_naming_the_argument() {
    let shape = tiny();
    let weights = WeightGen::new(shape, 1);
    let options = LayerOptions::for_shape(&shape);
    let good = split(shape, &global_batch(shape, 4, 9), 2);
    let run = |world: &WorldInputs, options: &LayerOptions| {
        fused_layer(world, &weights, options, &no_progress)
    };
    // Input errors name the rank and the argument.
    let on_rank = |result: Result<Vec<Vec<bf16>>, Error>, rank: usize| match result {
        Err(Error::OnRank { rank: r, source }) if r == rank => *source,
        other => panic!("expected an error on rank {rank}, got {other:?}"),
    };

    let mut twice = good.clone();
    twice.ranks[1].topk_idx[0..2].copy_from_slice(&[5, 5]);
    assert!(matches!(
        on_rank(run(&twice, &options), 1),
        Error::DuplicateExpert {
            arg: "topk_idx",
            row: 0,
            expert: 5,
            ..
        }
    ));

    let mut out_of_range = good.clone();
    out_of_range.ranks[0].topk_idx[3] = 16;
    assert!(matches!(
        on_rank(run(&out_of_range, &options), 0),
        Error::ExpertOutOfRange {
            arg: "topk_idx",
            ..
        }
    ));
    out_of_range.ranks[0].topk_idx[3] = -2;
    assert!(matches!(
        on_rank(run(&out_of_range, &options), 0),
        Error::ExpertOutOfRange {
            arg: "topk_idx",
            ..
        }
    ));

    let mut short = good.clone();
    short.ranks[1].x.pop();
    assert!(matches!(
        on_rank(run(&short, &options), 1),
        Error::Length { arg: "x", .. }
    ));
    let mut short = good.clone();
    short.ranks[0].topk_weights.pop();
    assert!(matches!(
        on_rank(run(&short, &options), 0),
        Error::Length {
            arg: "topk_weights",
            ..
        }
    ));

    let bad_group = LayerOptions {
        group: 96,
        clamp: None,
    };
    assert!(matches!(
        run(&good, &bad_group),
        Err(Error::Value { arg: "group", .. })
    ));
    let bad_clamp = LayerOptions {
        group: 64,
        clamp: Some(f32::NAN),
    };
    assert!(matches!(
        run(&good, &bad_clamp),
        Err(Error::Value { arg: "clamp", .. })
    ));

    let mut three_ranks = good.clone();
    three_ranks.ranks.push(good.ranks[0].clone());
    assert!(matches!(
        run(&three_ranks, &options),
        Err(Error::Shape { arg: "ranks", .. })
    ));

    let other = WeightGen::new(Preset::by_name("flash").unwrap().shape, 1);
    assert!(matches!(
        fused_layer(&good, &other, &options, &no_progress),
        Err(Error::Value { arg: "weights", .. })
    ));
}
