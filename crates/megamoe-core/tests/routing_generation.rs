//! Seeded routing generation: one global token stream whatever the rank split, skew, masks,
//! uneven counts.

use megamoe_core::routing::{
    generate_rank, generate_world, token_counts, validate_world, RoutingKind, RoutingSpec,
};
use megamoe_core::{Error, Preset, Shape, WorldInputs};

fn tiny() -> Shape {
    Preset::by_name("tiny").unwrap().shape
}

/// 64 experts, narrow rows: cheap enough for statistics over thousands of tokens.
fn wide_router() -> Shape {
    Shape {
        hidden: 128,
        inter: 128,
        experts: 64,
        topk: 4,
    }
}

fn spec(kind: RoutingKind, masked_ratio: f64, uneven_tokens: bool, seed: u64) -> RoutingSpec {
    RoutingSpec {
        kind,
        masked_ratio,
        uneven_tokens,
        seed,
    }
}

/// The ranks' inputs concatenated in rank order: (x bits, topk_idx, topk_weights bits).
fn concatenated(world: &WorldInputs) -> (Vec<u16>, Vec<i32>, Vec<u32>) {
    let mut out = (Vec::new(), Vec::new(), Vec::new());
    for r in &world.ranks {
        out.0.extend(r.x.iter().map(|v| v.to_bits()));
        out.1.extend_from_slice(&r.topk_idx);
        out.2.extend(r.topk_weights.iter().map(|w| w.to_bits()));
    }
    out
}

#[test]
fn same_global_batch_over_1_2_4_8_ranks_is_the_same_data() {
    let specs = [
        spec(RoutingKind::Uniform, 0.0, false, 11),
        spec(RoutingKind::Zipf { exponent: 1.2 }, 0.3, false, 12),
        spec(RoutingKind::Uniform, 0.1, true, 13),
        spec(RoutingKind::Zipf { exponent: 0.8 }, 0.0, true, 14),
    ];
    let global_tokens = 96;
    for spec in specs {
        let single = generate_world(tiny(), 1, global_tokens, &spec).unwrap();
        let expected = concatenated(&single);
        assert_eq!(expected.1.len(), global_tokens * tiny().topk);
        for ranks in [2, 4, 8] {
            let world = generate_world(tiny(), ranks, global_tokens / ranks, &spec).unwrap();
            assert_eq!(world.global_tokens(), global_tokens, "{spec:?} R={ranks}");
            assert_eq!(concatenated(&world), expected, "{spec:?} R={ranks}");
            let mut first = 0;
            for r in &world.ranks {
                assert_eq!(r.first_global_token, first);
                first += r.tokens;
            }
            validate_world(&world, None).unwrap();
        }
    }
}

#[test]
fn a_rank_alone_is_generated_as_inside_its_world() {
    let spec = spec(RoutingKind::Zipf { exponent: 1.0 }, 0.2, true, 5);
    let world = generate_world(tiny(), 4, 10, &spec).unwrap();
    for r in &world.ranks {
        let alone = generate_rank(tiny(), r.first_global_token, r.tokens, &spec).unwrap();
        assert_eq!(&alone, r);
    }
}

#[test]
fn seed_decides_the_data() {
    let a = generate_world(tiny(), 2, 8, &spec(RoutingKind::Uniform, 0.0, false, 1)).unwrap();
    let b = generate_world(tiny(), 2, 8, &spec(RoutingKind::Uniform, 0.0, false, 1)).unwrap();
    let c = generate_world(tiny(), 2, 8, &spec(RoutingKind::Uniform, 0.0, false, 2)).unwrap();
    assert_eq!(concatenated(&a), concatenated(&b));
    assert_ne!(concatenated(&a).0, concatenated(&c).0);
    assert_ne!(concatenated(&a).1, concatenated(&c).1);
}

#[test]
fn activations_are_roughly_standard_normal() {
    let world = generate_world(tiny(), 1, 256, &RoutingSpec::default()).unwrap();
    let values: Vec<f64> = world.ranks[0].x.iter().map(|v| v.to_f64()).collect();
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    assert!(mean.abs() < 0.02, "mean {mean}");
    assert!((var - 1.0).abs() < 0.03, "variance {var}");
}

#[test]
fn slots_are_distinct_in_descending_score_order_with_softmax_weights() {
    let world = generate_world(tiny(), 2, 200, &RoutingSpec::default()).unwrap();
    let k = tiny().topk;
    for r in &world.ranks {
        for (idx, w) in r.topk_idx.chunks(k).zip(r.topk_weights.chunks(k)) {
            let mut sorted = idx.to_vec();
            sorted.sort();
            sorted.dedup();
            assert_eq!(sorted.len(), k, "{idx:?}");
            assert!(idx.iter().all(|&e| (0..16).contains(&e)), "{idx:?}");
            // softmax over scores in descending order: positive, non-increasing, sum 1.
            assert!(w.windows(2).all(|p| p[0] >= p[1]), "{w:?}");
            assert!(w.iter().all(|&v| v > 0.0), "{w:?}");
            let sum: f32 = w.iter().sum();
            assert!((sum - 1.0).abs() < 1e-5, "{w:?}");
        }
    }
}

/// Share of valid slots taken by the most chosen expert.
fn top_expert_share(world: &WorldInputs) -> f64 {
    let mut counts = vec![0usize; world.shape.experts];
    for r in &world.ranks {
        for &e in r.topk_idx.iter().filter(|&&e| e >= 0) {
            counts[e as usize] += 1;
        }
    }
    *counts.iter().max().unwrap() as f64 / world.valid_slots() as f64
}

#[test]
fn zipf_routing_skews_expert_popularity_and_uniform_does_not() {
    let uniform_share = 1.0 / wide_router().experts as f64;
    let uniform = generate_world(wide_router(), 2, 2048, &RoutingSpec::default()).unwrap();
    let share = top_expert_share(&uniform);
    assert!(share < 1.3 * uniform_share, "uniform top share {share}");

    let zipf = spec(RoutingKind::Zipf { exponent: 1.0 }, 0.0, false, 3);
    let skewed = generate_world(wide_router(), 2, 2048, &zipf).unwrap();
    let share = top_expert_share(&skewed);
    assert!(share > 4.0 * uniform_share, "zipf top share {share}");

    // A different seed makes a different expert the most popular one.
    let most_popular = |w: &WorldInputs| {
        let mut counts = vec![0usize; w.shape.experts];
        for r in &w.ranks {
            for &e in r.topk_idx.iter() {
                counts[e as usize] += 1;
            }
        }
        (0..counts.len()).max_by_key(|&e| counts[e]).unwrap()
    };
    let tops: std::collections::BTreeSet<usize> = (0..6)
        .map(|seed| {
            let s = spec(RoutingKind::Zipf { exponent: 1.0 }, 0.0, false, seed);
            most_popular(&generate_world(wide_router(), 1, 512, &s).unwrap())
        })
        .collect();
    assert!(tops.len() > 1, "every seed picked expert {tops:?}");
}

#[test]
fn masked_ratio_is_respected() {
    for ratio in [0.0, 0.1, 0.5, 0.9, 1.0] {
        let s = spec(RoutingKind::Uniform, ratio, false, 9);
        let world = generate_world(wide_router(), 4, 1024, &s).unwrap();
        let slots = world.global_tokens() * wide_router().topk;
        let masked = slots - world.valid_slots();
        let observed = masked as f64 / slots as f64;
        assert!(
            (observed - ratio).abs() < 0.015,
            "ratio {ratio}: {observed}"
        );
        if ratio == 0.0 || ratio == 1.0 {
            assert_eq!(observed, ratio);
        }
        let masked_entries = world
            .ranks
            .iter()
            .flat_map(|r| &r.topk_idx)
            .filter(|&&e| e < 0);
        assert!(masked_entries.clone().all(|&e| e == -1));
    }
}

#[test]
fn uneven_token_counts_sum_to_the_global_batch_and_allow_empty_ranks() {
    let mut saw_empty_rank = false;
    let mut saw_unequal = false;
    for seed in 0..64 {
        let s = spec(RoutingKind::Uniform, 0.0, true, seed);
        assert_eq!(token_counts(1, 37, &s), vec![37]);
        for ranks in [2, 4, 8] {
            let counts = token_counts(ranks, 37, &s);
            assert_eq!(counts.len(), ranks);
            assert_eq!(counts.iter().sum::<usize>(), ranks * 37, "{counts:?}");
            saw_empty_rank |= counts.contains(&0);
            saw_unequal |= counts.iter().any(|&c| c != 37);
        }
    }
    assert!(saw_empty_rank && saw_unequal);
    let even = spec(RoutingKind::Uniform, 0.0, false, 0);
    assert_eq!(token_counts(4, 37, &even), vec![37; 4]);
}

#[test]
fn a_world_with_an_empty_rank_is_valid() {
    let seed = (0..64)
        .find(|&seed| token_counts(8, 5, &spec(RoutingKind::Uniform, 0.0, true, seed)).contains(&0))
        .expect("some seed leaves a rank empty");
    let s = spec(RoutingKind::Uniform, 0.0, true, seed);
    let world = generate_world(tiny(), 8, 5, &s).unwrap();
    assert!(world.ranks.iter().any(|r| r.tokens == 0 && r.x.is_empty()));
    validate_world(&world, Some(40)).unwrap();
}

#[test]
fn zero_tokens_is_a_legal_world() {
    for s in [
        RoutingSpec::default(),
        spec(RoutingKind::Zipf { exponent: 1.0 }, 0.5, true, 4),
    ] {
        let world = generate_world(tiny(), 4, 0, &s).unwrap();
        assert_eq!(world.num_ranks(), 4);
        assert_eq!(world.global_tokens(), 0);
        assert!(world
            .ranks
            .iter()
            .all(|r| r.x.is_empty() && r.topk_idx.is_empty()));
        validate_world(&world, Some(0)).unwrap();
    }
}

#[test]
fn bad_routing_specs_are_rejected_naming_the_argument() {
    let bad_ratio = spec(RoutingKind::Uniform, 1.5, false, 0);
    let err = generate_world(tiny(), 1, 4, &bad_ratio).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Value {
                arg: "masked_ratio",
                ..
            }
        ),
        "{err}"
    );

    let bad_exponent = spec(RoutingKind::Zipf { exponent: f64::NAN }, 0.0, false, 0);
    let err = generate_world(tiny(), 1, 4, &bad_exponent).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Value {
                arg: "exponent",
                ..
            }
        ),
        "{err}"
    );

    let err = generate_world(tiny(), 3, 4, &RoutingSpec::default()).unwrap_err();
    assert!(matches!(err, Error::Shape { arg: "ranks", .. }), "{err}");
}
