//! Arbitrary inputs to every host-side entry point of the core crate: each call either returns
//! a typed error naming the argument the rules below pick, or succeeds exactly when they say
//! so; none panics.

use half::bf16;
use megamoe_core::plan::rules::MAX_TOKENS;
use megamoe_core::plan::{BufferLayout, BufferSpec, CallPlan, Kernel, SymmetricLayout};
use megamoe_core::quant::{quantize_blocks, quantize_rows};
use megamoe_core::routing::{
    check_slot_weights, check_topk_idx, generate_world, validate_rank, validate_world, RoutingKind,
    RoutingSpec,
};
use megamoe_core::{fused_layer, Error, LayerOptions, RankInputs, Shape, WeightGen, WorldInputs};
use proptest::prelude::*;

/// The argument an error names (through `OnRank`).
fn arg_of(error: &Error) -> &'static str {
    match error {
        Error::Shape { arg, .. }
        | Error::Length { arg, .. }
        | Error::ExpertOutOfRange { arg, .. }
        | Error::DuplicateExpert { arg, .. }
        | Error::Value { arg, .. }
        | Error::Capacity { arg, .. }
        | Error::Overflow { arg, .. } => arg,
        Error::OnRank { source, .. } => arg_of(source),
        Error::UnknownPreset { .. } => "preset",
    }
}

/// The first shape rule `shape` breaks over `ranks` ranks (SPEC §2), as the argument named.
fn shape_fault(shape: Shape, ranks: usize) -> Option<&'static str> {
    let multiple = |v: usize| v > 0 && v % 128 == 0;
    if !multiple(shape.hidden) {
        Some("hidden")
    } else if !multiple(shape.inter) {
        Some("inter")
    } else if shape.topk == 0 || shape.topk > shape.experts {
        Some("topk")
    } else if ranks == 0 || shape.experts % ranks != 0 {
        Some("ranks")
    } else {
        None
    }
}

/// The first rule of a row of `topk_idx` it breaks: an id outside [0, E) other than −1, or
/// an expert named twice.
fn idx_fault(topk: usize, experts: usize, idx: &[i32]) -> Option<&'static str> {
    idx.chunks(topk.max(1)).find_map(|row| {
        let bad = row.iter().enumerate().any(|(k, &e)| {
            e < -1 || e as i64 >= experts as i64 || (e >= 0 && row[..k].contains(&e))
        });
        bad.then_some("topk_idx")
    })
}

/// A non-finite weight on a valid slot.
fn weight_fault(idx: &[i32], weights: &[f32]) -> Option<&'static str> {
    let bad = idx
        .iter()
        .zip(weights)
        .any(|(&e, w)| e >= 0 && !w.is_finite());
    bad.then_some("topk_weights")
}

/// Small shapes, some breaking the rules.
fn any_shape() -> impl Strategy<Value = Shape> {
    let dim = prop_oneof![Just(0usize), Just(64), Just(128), Just(200), Just(256)];
    (dim.clone(), dim, 0usize..10, 0usize..6).prop_map(|(hidden, inter, experts, topk)| Shape {
        hidden,
        inter,
        experts,
        topk,
    })
}

/// Weights with NaN and infinities among ordinary values.
fn any_weight() -> impl Strategy<Value = f32> {
    prop_oneof![
        1 => Just(f32::NAN),
        1 => Just(f32::INFINITY),
        1 => Just(f32::NEG_INFINITY),
        6 => -2.0f32..2.0,
    ]
}

/// A small valid shape the reference runs fast on: H 128, I 128, E 4, K 2.
fn small() -> Shape {
    Shape {
        hidden: 128,
        inter: 128,
        experts: 4,
        topk: 2,
    }
}

/// A generated world of `small()` with half its slots masked.
fn small_world(ranks: usize, tokens: usize, seed: u64) -> WorldInputs {
    let spec = RoutingSpec {
        masked_ratio: 0.5,
        seed,
        ..RoutingSpec::default()
    };
    generate_world(small(), ranks, tokens, &spec).unwrap()
}

fn no_progress(_: usize, _: usize) {}

fn run(world: &WorldInputs, options: &LayerOptions) -> megamoe_core::Result<Vec<Vec<bf16>>> {
    let weights = WeightGen::new(world.shape, 7);
    fused_layer(world, &weights, options, &no_progress)
}

fn bits(y: &[bf16]) -> Vec<u16> {
    y.iter().map(|v| v.to_bits()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn shape_validation_names_the_first_broken_rule(
        shape in any_shape(),
        ranks in 0usize..12,
    ) {
        match (shape.validate(ranks), shape_fault(shape, ranks)) {
            (Ok(()), None) => {}
            (Err(e), Some(arg)) => prop_assert_eq!(arg_of(&e), arg, "{}", e),
            (got, want) => prop_assert!(false, "{:?} but expected {:?}", got, want),
        }
    }

    // Any lengths, T (0, above the capacity, or so large that T·H overflows), ids in
    // [−5, E + 5] with duplicates, NaN and infinite weights on valid and masked slots.
    #[test]
    fn rank_validation_follows_the_documented_order(
        shape in any_shape(),
        tokens in prop_oneof![4 => 0usize..5, 1 => Just(usize::MAX / 64)],
        capacity in proptest::option::of(0usize..5),
        x_extra in -1i64..2,
        idx_extra in -1i64..2,
        weights_extra in -1i64..2,
        ids in proptest::collection::vec(-5i32..15, 30),
        weights in proptest::collection::vec(any_weight(), 30),
        rank in 0usize..4,
    ) {
        let (k, e) = (shape.topk, shape.experts);
        let len = |per_token: usize, extra: i64| {
            (tokens.saturating_mul(per_token) as i64 + extra).clamp(0, 30) as usize
        };
        let ids: Vec<i32> = ids.iter().map(|&v| v.min(e as i32 + 5)).collect();
        let inputs = RankInputs {
            tokens,
            first_global_token: 0,
            x: vec![bf16::ONE; len(shape.hidden, x_extra)],
            topk_idx: ids[..len(k, idx_extra)].to_vec(),
            topk_weights: weights[..len(k, weights_extra)].to_vec(),
        };
        let want = if tokens.checked_mul(shape.hidden) != Some(inputs.x.len()) {
            Some("x")
        } else if tokens * k != inputs.topk_idx.len() {
            Some("topk_idx")
        } else if tokens * k != inputs.topk_weights.len() {
            Some("topk_weights")
        } else if capacity.is_some_and(|c| tokens > c) {
            Some("tokens")
        } else if k == 0 {
            Some("topk")
        } else {
            idx_fault(k, e, &inputs.topk_idx)
                .or_else(|| weight_fault(&inputs.topk_idx, &inputs.topk_weights))
        };
        match (validate_rank(shape, rank, &inputs, capacity), want) {
            (Ok(()), None) => {}
            (Err(Error::OnRank { rank: r, source }), Some(arg)) => {
                prop_assert_eq!(r, rank);
                prop_assert_eq!(arg_of(&source), arg, "{}", source);
            }
            (got, want) => prop_assert!(false, "{:?} but expected {:?}", got, want),
        }
    }

    #[test]
    fn row_checks_take_any_k_and_any_lengths(
        topk in 0usize..5,
        experts in 0usize..8,
        ids in proptest::collection::vec(-5i32..13, 0..12),
        weights in proptest::collection::vec(any_weight(), 0..12),
    ) {
        let shape = Shape { hidden: 128, inter: 128, experts, topk };
        let got = check_topk_idx("topk_idx", shape, &ids);
        if topk == 0 {
            prop_assert_eq!(arg_of(&got.unwrap_err()), "topk");
        } else {
            match (got, idx_fault(topk, experts, &ids)) {
                (Ok(()), None) => {}
                (Err(e), Some(arg)) => prop_assert_eq!(arg_of(&e), arg),
                (got, want) => prop_assert!(false, "{:?} but expected {:?}", got, want),
            }
        }
        // Masked slots may hold anything; valid slots (up to the shorter list) must be finite.
        let got = check_slot_weights("topk_weights", topk, &ids, &weights);
        let want = if topk == 0 { Some("topk") } else { weight_fault(&ids, &weights) };
        match (got, want) {
            (Ok(()), None) => {}
            (Err(e), Some(arg)) => prop_assert_eq!(arg_of(&e), arg),
            (got, want) => prop_assert!(false, "{:?} but expected {:?}", got, want),
        }
    }

    #[test]
    fn generation_rejects_bad_specs_and_otherwise_yields_valid_worlds(
        shape in any_shape(),
        ranks in 0usize..5,
        tokens in 0usize..4,
        masked_ratio in prop_oneof![
            Just(f64::NAN), Just(-0.5), Just(1.5), Just(f64::INFINITY), 0.0f64..=1.0],
        exponent in proptest::option::of(prop_oneof![
            Just(f64::NAN), Just(-1.0), Just(f64::INFINITY), 0.0f64..3.0]),
        uneven_tokens in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let spec = RoutingSpec {
            kind: exponent.map_or(RoutingKind::Uniform, |exponent| RoutingKind::Zipf { exponent }),
            masked_ratio,
            uneven_tokens,
            seed,
        };
        let want = shape_fault(shape, ranks).or_else(|| {
            if !(0.0..=1.0).contains(&masked_ratio) {
                Some("masked_ratio")
            } else if exponent.is_some_and(|x| !(x.is_finite() && x >= 0.0)) {
                Some("exponent")
            } else {
                None
            }
        });
        match (generate_world(shape, ranks, tokens, &spec), want) {
            (Ok(world), None) => {
                prop_assert_eq!(world.num_ranks(), ranks);
                prop_assert_eq!(world.global_tokens(), ranks * tokens);
                let capacity = (!uneven_tokens).then_some(tokens);
                prop_assert_eq!(validate_world(&world, capacity), Ok(()));
            }
            (Err(e), Some(arg)) => prop_assert_eq!(arg_of(&e), arg, "{}", e),
            (got, want) => prop_assert!(false, "{:?} but expected {:?}", got.map(|_| ()), want),
        }
    }

    #[test]
    fn quantizers_reject_bad_shapes_naming_them(
        rows in prop_oneof![
            Just(0usize), Just(1), Just(127), Just(128), Just(256), Just(usize::MAX / 2)],
        cols in prop_oneof![Just(0usize), Just(64), Just(128), Just(192), Just(256), Just(2)],
        group in prop_oneof![Just(0usize), Just(1), Just(32), Just(64), Just(100), Just(128)],
        len_extra in -1i64..2,
    ) {
        let len = (rows.saturating_mul(cols) as i64 + len_extra).clamp(0, 256 * 256) as usize;
        let values = vec![0.5f32; len];
        let length_ok = rows.checked_mul(cols) == Some(len);

        let want = if !length_ok {
            Some("values")
        } else if group == 0 || cols % group != 0 {
            Some("cols")
        } else {
            None
        };
        match (quantize_rows(&values, rows, cols, group, 1e-4), want) {
            (Ok(q), None) => {
                prop_assert_eq!(q.codes.len(), len);
                prop_assert_eq!(q.scales.len(), len / group);
            }
            (Err(e), Some(arg)) => prop_assert_eq!(arg_of(&e), arg, "{}", e),
            (got, want) => prop_assert!(false, "{:?} but expected {:?}", got.map(|_| ()), want),
        }

        let want = if !length_ok {
            Some("values")
        } else if rows % 128 != 0 {
            Some("rows")
        } else if cols % 128 != 0 {
            Some("cols")
        } else {
            None
        };
        match (quantize_blocks(&values, rows, cols, 1e-4), want) {
            (Ok(q), None) => {
                prop_assert_eq!(q.codes.len(), len);
                prop_assert_eq!(q.scales.len(), len / (128 * 128));
            }
            (Err(e), Some(arg)) => prop_assert_eq!(arg_of(&e), arg, "{}", e),
            (got, want) => prop_assert!(false, "{:?} but expected {:?}", got.map(|_| ()), want),
        }
    }

    #[test]
    fn buffer_specs_name_the_broken_limit(
        ranks in 0usize..12,
        experts in prop_oneof![0usize..20, 1020usize..1030],
        topk in 0usize..11,
        hidden in prop_oneof![Just(0usize), Just(100), Just(128), Just(256)],
        max_tokens in 0usize..300,
        max_pad_multiple in 0usize..130,
    ) {
        let spec = BufferSpec { ranks, experts, topk, hidden, max_tokens, max_pad_multiple };
        let want = if ranks == 0 || ranks > 8 {
            Some("ranks")
        } else if experts == 0 || experts > 1024 || experts % ranks != 0 {
            Some("experts")
        } else if topk == 0 || topk > 8 || topk > experts {
            Some("topk")
        } else if hidden == 0 || hidden % 128 != 0 {
            Some("hidden")
        } else if max_pad_multiple == 0 {
            Some("max_pad_multiple")
        } else {
            None
        };
        match (spec.validate(), want) {
            (Ok(()), None) => {
                // A valid spec can be laid out: whole pad blocks, regions inside the size.
                let rows = spec.max_rows();
                prop_assert_eq!(rows % max_pad_multiple, 0);
                prop_assert!(rows >= ranks * max_tokens * topk.min(experts / ranks));
                let layout = BufferLayout::new(&spec);
                prop_assert!(layout.error < layout.size);
            }
            (Err(e), Some(arg)) => prop_assert_eq!(arg_of(&e), arg, "{}", e),
            (got, want) => prop_assert!(false, "{:?} but expected {:?}", got, want),
        }
    }

    // What `megamoe plan` and a call's plan take: any (ranks, tokens, gran) on a preset shape.
    #[test]
    fn planner_entry_points_error_or_plan_within_capacity(
        preset in 0usize..megamoe_core::PRESETS.len(),
        ranks in 0usize..17,
        tokens in prop_oneof![
            8 => 0usize..5000, 1 => Just(MAX_TOKENS), 1 => Just(MAX_TOKENS + 1), 1 => Just(usize::MAX)],
        gran in prop_oneof![Just(0usize), Just(32), Just(64), Just(96), Just(128), Just(256)],
        bound_extra in -1i64..2,
    ) {
        let shape = megamoe_core::PRESETS[preset].shape;
        let want = if let Some(arg) = shape_fault(shape, ranks) {
            Some(arg)
        } else if gran != 64 && gran != 128 {
            Some("gran")
        } else if tokens > MAX_TOKENS {
            Some("tokens")
        } else {
            None
        };
        // The buffers also have the kernels' rank limit.
        let layout_want = want.or((ranks > 8).then_some("ranks"));
        for kernel in [Kernel::Split, Kernel::Fused] {
            match (SymmetricLayout::new(kernel, &shape, ranks, tokens, gran), layout_want) {
                (Ok(layout), None) => {
                    prop_assert!(layout.ring.t_cap >= tokens);
                    prop_assert!(layout.ring.ring_rows <= layout.ring.pool_rows);
                    let last = layout.regions.last().unwrap();
                    prop_assert!(last.offset + last.bytes <= layout.total_bytes);
                }
                (Err(e), Some(arg)) => prop_assert_eq!(arg_of(&e), arg, "{}", e),
                (got, want) => prop_assert!(false, "{:?} but expected {:?}", got.map(|_| ()), want),
            }
        }
        let bound = (tokens as i64 + bound_extra).max(0) as usize;
        match CallPlan::new(&shape, ranks, tokens, gran, bound) {
            Ok(plan) => {
                prop_assert!(want.is_none());
                prop_assert!(plan.bound <= plan.ring.t_cap);
                prop_assert_eq!(plan.ring.t_cap % 128, 0);
                prop_assert_eq!(2 * shape.inter % plan.tile.block_n_l1, 0);
                prop_assert_eq!(shape.hidden % plan.tile.block_n_l2, 0);
            }
            Err(e) => {
                let arg = arg_of(&e);
                prop_assert!(
                    want == Some(arg) || want.is_none() && arg == "num_tokens_bound",
                    "{} (expected {:?})", e, want
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn the_reference_rejects_bad_options_and_bad_inputs(
        ranks in 1usize..3,
        tokens in 0usize..3,
        group in prop_oneof![Just(0usize), Just(32), Just(64), Just(96), Just(128), Just(256)],
        clamp in proptest::option::of(prop_oneof![
            Just(f32::NAN), Just(-1.0f32), Just(-0.0), Just(0.0), Just(f32::INFINITY),
            Just(f32::NEG_INFINITY), 0.0f32..10.0]),
        fault in 0usize..6,
        seed in any::<u64>(),
    ) {
        let mut world = small_world(ranks, tokens, seed);
        let mut weights = WeightGen::new(world.shape, 7);
        let last = world.ranks.last_mut().unwrap();
        let input_fault = match fault {
            0 => None,
            1 => { last.x.push(bf16::ONE); Some("x") }
            2 => { last.topk_idx.push(0); Some("topk_idx") }
            3 if tokens > 0 => { last.topk_idx[0] = 4; Some("topk_idx") }
            4 if tokens > 0 => {
                last.topk_idx[..2].copy_from_slice(&[1, 1]);
                last.topk_weights[0] = f32::NAN;
                Some("topk_idx")
            }
            5 => { weights.shape.experts = 8; Some("weights") }
            _ => None,
        };
        let options = LayerOptions { group, clamp };
        let want = input_fault.or_else(|| {
            if group != 64 && group != 128 {
                Some("group")
            } else if clamp.is_some_and(|c| c.is_nan() || c < 0.0) {
                Some("clamp")
            } else {
                None
            }
        });
        let got = fused_layer(&world, &weights, &options, &no_progress);
        match (got, want) {
            (Ok(y), None) => {
                prop_assert_eq!(y.len(), ranks);
                prop_assert!(y.iter().all(|y| y.len() == tokens * 128));
            }
            (Err(e), Some(arg)) => prop_assert_eq!(arg_of(&e), arg, "{}", e),
            (got, want) => prop_assert!(false, "{:?} but expected {:?}", got.map(|_| ()), want),
        }
    }

    // SPEC §6: a non-finite x value reaches only its own token's output.
    #[test]
    fn a_non_finite_x_value_changes_only_its_token(
        ranks in 1usize..3,
        tokens in 1usize..4,
        token in 0usize..8,
        col in 0usize..128,
        value in prop_oneof![Just(f32::NAN), Just(f32::INFINITY), Just(f32::NEG_INFINITY)],
        clamp in proptest::option::of(0.0f32..10.0),
        seed in any::<u64>(),
    ) {
        let world = small_world(ranks, tokens, seed);
        let options = LayerOptions { group: 64, clamp };
        let clean = run(&world, &options).unwrap();
        let (rank, token) = (token % ranks, token % tokens);
        let mut poisoned = world.clone();
        poisoned.ranks[rank].x[token * 128 + col] = bf16::from_f32(value);
        let y = run(&poisoned, &options).unwrap();
        let routed = world.ranks[rank].topk_idx[token * 2..][..2].iter().any(|&e| e >= 0);
        for (r, (clean, y)) in clean.iter().zip(&y).enumerate() {
            for (t, (clean, y)) in clean.chunks(128).zip(y.chunks(128)).enumerate() {
                if (r, t) == (rank, token) && routed {
                    prop_assert_ne!(bits(clean), bits(y));
                } else {
                    prop_assert_eq!(bits(clean), bits(y), "rank {} token {}", r, t);
                }
            }
        }
    }

    // SPEC §2: masked slots' weights are never read, whatever they hold.
    #[test]
    fn a_non_finite_weight_on_a_masked_slot_is_ignored(
        ranks in 1usize..3,
        tokens in 1usize..4,
        slot in 0usize..16,
        value in prop_oneof![Just(f32::NAN), Just(f32::INFINITY), Just(f32::NEG_INFINITY)],
        seed in any::<u64>(),
    ) {
        let mut world = small_world(ranks, tokens, seed);
        let (rank, slot) = (slot % ranks, slot % (tokens * 2));
        world.ranks[rank].topk_idx[slot] = -1;
        let options = LayerOptions::for_shape(&world.shape);
        let clean = run(&world, &options).unwrap();
        world.ranks[rank].topk_weights[slot] = value;
        let y = run(&world, &options).unwrap();
        for (clean, y) in clean.iter().zip(&y) {
            prop_assert_eq!(bits(clean), bits(y));
        }
    }
}
