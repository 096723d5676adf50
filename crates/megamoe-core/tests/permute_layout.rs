//! The dispatch layout of SPEC §5: grouping, ordering, padding, sizes, FP8 rows.

mod common;

use common::{bits, narrow, on_rank, tiny, topk_idx, topk_weights, x_rows};
use megamoe_core::permute::{
    combine_with_unpermute, dispatch_rows_per_rank, dispatch_with_permute, plan_permute, Bf16Rows,
    Dispatched, Fp8Rows, PermuteRows, RowDestination, RowSource, SyncMode, SCALE_BLOCK,
};
use megamoe_core::routing::{generate_world, RoutingKind, RoutingSpec};
use megamoe_core::Error;

fn source(rank: usize, token: usize, slot: usize) -> Option<RowSource> {
    Some(RowSource { rank, token, slot })
}

#[test]
fn hand_routed_world_has_the_documented_plan() {
    // 2 ranks, 4 experts (2 per rank), K = 2.
    let shape = narrow(4, 2);
    let rank0 = [3, 0, -1, 2, 0, 3];
    let rank1 = [0, -1, 2, 3, -1, -1];
    let handle = plan_permute(shape, &[&rank0[..], &rank1[..]], 2, SyncMode::Blocking).unwrap();
    assert_eq!(handle.tokens, vec![3, 3]);

    let p0 = &handle.plans[0];
    assert_eq!(p0.first_expert, 0);
    assert_eq!(p0.rows_per_expert, vec![3, 0]);
    assert_eq!(p0.tokens_per_expert, vec![4, 0]);
    assert_eq!(p0.expert_offsets, vec![0, 4, 4]);
    assert_eq!(
        p0.sources,
        vec![source(0, 0, 1), source(0, 2, 0), source(1, 0, 0), None]
    );

    let p1 = &handle.plans[1];
    assert_eq!(p1.first_expert, 2);
    assert_eq!(p1.rows_per_expert, vec![2, 3]);
    assert_eq!(p1.tokens_per_expert, vec![2, 4]);
    assert_eq!(p1.expert_offsets, vec![0, 2, 6]);
    assert_eq!(
        p1.sources,
        vec![
            source(0, 1, 1),
            source(1, 1, 0),
            source(0, 0, 0),
            source(0, 2, 1),
            source(1, 1, 1),
            None
        ]
    );
    let d = |expert, rank, row| Some(RowDestination { expert, rank, row });
    assert_eq!(
        handle.destinations[0],
        vec![
            d(3, 1, 2),
            d(0, 0, 0),
            None,
            d(2, 1, 0),
            d(0, 0, 1),
            d(3, 1, 3)
        ]
    );
    assert_eq!(
        handle.destinations[1],
        vec![d(0, 0, 2), None, d(2, 1, 1), d(3, 1, 4), None, None]
    );
}

/// Checks every layout rule of one dispatch against the world it came from.
fn check_layout(
    world: &megamoe_core::WorldInputs,
    x: &[Bf16Rows],
    out: &[Dispatched<Bf16Rows>],
    pad: usize,
) {
    let shape = world.shape;
    let local = shape.local_experts(world.num_ranks());
    let mut seen = vec![Vec::new(); world.num_ranks()];
    for (d, o) in out.iter().enumerate() {
        let mut row = 0;
        for j in 0..local {
            let expert = (d * local + j) as i32;
            let padded = o.tokens_per_expert[j];
            assert_eq!(padded % pad, 0);
            let mut previous: Option<(usize, usize)> = None;
            let mut valid = 0;
            for i in row..row + padded {
                let found = world.ranks.iter().enumerate().find_map(|(r, inputs)| {
                    (0..inputs.tokens).find_map(|t| {
                        let slot = inputs.topk_idx[t * shape.topk..][..shape.topk]
                            .iter()
                            .position(|&e| e == expert)?;
                        (bits(o.rows.row(i)) == bits(x[r].row(t))
                            && o.probs[i] == inputs.topk_weights[t * shape.topk + slot]
                            && previous.is_none_or(|p| p < (r, t)))
                        .then_some((r, t))
                    })
                });
                match found {
                    Some(rt) if valid == i - row => {
                        previous = Some(rt);
                        valid += 1;
                        seen[rt.0].push((rt.1, expert));
                    }
                    _ => {
                        assert!(o.rows.row(i).iter().all(|v| v.to_bits() == 0), "row {i}");
                        assert_eq!(o.probs[i], 0.0);
                    }
                }
            }
            assert!(padded >= valid && padded - valid < pad, "expert {expert}");
            row += padded;
        }
        assert_eq!(row, o.rows.rows);
    }
    // Every valid (token, expert) pair arrived exactly once.
    for (r, inputs) in world.ranks.iter().enumerate() {
        let mut expected: Vec<(usize, i32)> = inputs
            .topk_idx
            .iter()
            .enumerate()
            .filter(|(_, &e)| e >= 0)
            .map(|(i, &e)| (i / shape.topk, e))
            .collect();
        expected.sort();
        seen[r].sort();
        assert_eq!(seen[r], expected, "rank {r}");
    }
}

#[test]
fn dispatch_groups_orders_and_pads_as_specified() {
    let spec = RoutingSpec {
        kind: RoutingKind::Zipf { exponent: 0.7 },
        masked_ratio: 0.2,
        uneven_tokens: true,
        seed: 21,
    };
    for ranks in [1, 2, 4] {
        let world = generate_world(tiny(), ranks, 12, &spec).unwrap();
        let x = x_rows(&world);
        for pad in [1, 16, 64, 128] {
            let (out, handle) = dispatch_with_permute(
                tiny(),
                &x,
                &topk_idx(&world),
                &topk_weights(&world),
                pad,
                SyncMode::Blocking,
            )
            .unwrap();
            check_layout(&world, &x, &out, pad);
            let sizes = dispatch_rows_per_rank(tiny(), &topk_idx(&world), pad).unwrap();
            for ((o, size), plan) in out.iter().zip(sizes).zip(&handle.plans) {
                assert_eq!(o.rows.rows, size);
                assert_eq!(o.tokens_per_expert.iter().sum::<usize>(), size);
                assert_eq!(plan.output_rows(), size);
            }
        }
    }
}

#[test]
fn non_blocking_mode_fills_the_bound_and_reports_overflow_naming_the_rank() {
    let spec = RoutingSpec {
        kind: RoutingKind::Zipf { exponent: 1.5 },
        ..RoutingSpec::default()
    };
    let world = generate_world(tiny(), 4, 16, &spec).unwrap();
    let (idx, probs, x) = (topk_idx(&world), topk_weights(&world), x_rows(&world));
    let sizes = dispatch_rows_per_rank(tiny(), &idx, 16).unwrap();
    let (blocking, blocking_handle) =
        dispatch_with_permute(tiny(), &x, &idx, &probs, 16, SyncMode::Blocking).unwrap();

    let bound = *sizes.iter().max().unwrap();
    let mode = SyncMode::NonBlocking { max_rows: bound };
    let (bounded, handle) = dispatch_with_permute(tiny(), &x, &idx, &probs, 16, mode).unwrap();
    for ((b, e), plan) in bounded.iter().zip(&blocking).zip(&handle.plans) {
        assert_eq!(b.rows.rows, bound);
        assert_eq!(plan.output_rows(), bound);
        let used = e.rows.values.len();
        assert_eq!(bits(&b.rows.values[..used]), bits(&e.rows.values));
        assert!(b.rows.values[used..].iter().all(|v| v.to_bits() == 0));
        assert_eq!(&b.probs[..e.probs.len()], &e.probs[..]);
        assert_eq!(b.tokens_per_expert, e.tokens_per_expert);
    }
    // Combine reads the bounded layout to the same result.
    let rows =
        |out: &[Dispatched<Bf16Rows>]| out.iter().map(|o| o.rows.clone()).collect::<Vec<_>>();
    let y_bounded = combine_with_unpermute(&rows(&bounded), &handle).unwrap();
    let y_blocking = combine_with_unpermute(&rows(&blocking), &blocking_handle).unwrap();
    assert_eq!(y_bounded, y_blocking);
    assert_eq!(y_bounded.len(), 4);

    let busiest = (0..4)
        .max_by_key(|&r| (sizes[r], std::cmp::Reverse(r)))
        .unwrap();
    let mode = SyncMode::NonBlocking {
        max_rows: bound - 1,
    };
    let err = dispatch_with_permute(tiny(), &x, &idx, &probs, 16, mode).unwrap_err();
    assert_eq!(
        err,
        Error::Overflow {
            arg: "max_rows",
            rank: busiest,
            needed: bound,
            bound: bound - 1
        }
    );
}

#[test]
fn fp8_rows_travel_with_their_scales() {
    let world = generate_world(tiny(), 2, 9, &RoutingSpec::default()).unwrap();
    let hidden = tiny().hidden;
    let blocks = hidden / SCALE_BLOCK;
    let x: Vec<Fp8Rows> = world
        .ranks
        .iter()
        .map(|r| Fp8Rows {
            rows: r.tokens,
            hidden,
            codes: (0..r.tokens * hidden)
                .map(|i| (r.first_global_token * 31 + i * 7) as u8)
                .collect(),
            scales: (0..r.tokens * blocks)
                .map(|i| 1.0 + (r.first_global_token * blocks + i) as f32)
                .collect(),
        })
        .collect();
    let (out, handle) = dispatch_with_permute(
        tiny(),
        &x,
        &topk_idx(&world),
        &topk_weights(&world),
        16,
        SyncMode::Blocking,
    )
    .unwrap();
    for (o, plan) in out.iter().zip(&handle.plans) {
        o.rows.check("rows").unwrap();
        assert_eq!(o.rows.rows, plan.output_rows());
        for (i, s) in plan.sources.iter().enumerate() {
            match s {
                Some(s) => {
                    assert_eq!(o.rows.row_codes(i), x[s.rank].row_codes(s.token));
                    assert_eq!(o.rows.row_scales(i), x[s.rank].row_scales(s.token));
                }
                None => {
                    assert!(o.rows.row_codes(i).iter().all(|&c| c == 0));
                    assert!(o.rows.row_scales(i).iter().all(|&s| s.to_bits() == 0));
                }
            }
        }
    }
}

#[test]
fn zero_tokens_dispatch_to_empty_outputs() {
    let world = generate_world(tiny(), 4, 0, &RoutingSpec::default()).unwrap();
    for mode in [SyncMode::Blocking, SyncMode::NonBlocking { max_rows: 0 }] {
        let (out, handle) = dispatch_with_permute(
            tiny(),
            &x_rows(&world),
            &topk_idx(&world),
            &topk_weights(&world),
            64,
            mode,
        )
        .unwrap();
        for o in &out {
            assert_eq!(o.rows.rows, 0);
            assert!(o.probs.is_empty());
            assert_eq!(o.tokens_per_expert, vec![0; 4]);
        }
        assert_eq!(handle.tokens, vec![0; 4]);
    }
}

#[test]
fn invalid_dispatch_inputs_are_rejected_naming_the_argument() {
    let world = generate_world(tiny(), 2, 5, &RoutingSpec::default()).unwrap();
    let x = x_rows(&world);
    let idx: Vec<Vec<i32>> = topk_idx(&world).iter().map(|s| s.to_vec()).collect();
    let probs: Vec<Vec<f32>> = topk_weights(&world).iter().map(|s| s.to_vec()).collect();
    let run = |x: &[Bf16Rows], idx: &[Vec<i32>], probs: &[Vec<f32>], pad| {
        dispatch_with_permute(tiny(), x, idx, probs, pad, SyncMode::Blocking).unwrap_err()
    };

    let err = run(&x, &idx, &probs, 0);
    assert!(
        matches!(
            err,
            Error::Value {
                arg: "pad_multiple",
                ..
            }
        ),
        "{err}"
    );

    let err = run(&x, &idx[..1], &probs, 1);
    assert!(
        matches!(
            err,
            Error::Length {
                arg: "topk_idx",
                got: 1,
                expected: 2
            }
        ),
        "{err}"
    );
    let err = run(&x, &idx, &probs[..1], 1);
    assert!(
        matches!(
            err,
            Error::Length {
                arg: "probs",
                got: 1,
                expected: 2
            }
        ),
        "{err}"
    );

    let mut narrow_x = x.clone();
    narrow_x[1] = Bf16Rows::zeros(5, 128);
    let (rank, err) = on_rank(run(&narrow_x, &idx, &probs, 1));
    assert!(
        rank == 1 && matches!(err, Error::Shape { arg: "x", .. }),
        "{err}"
    );

    let mut short_x = x.clone();
    short_x[0].values.pop();
    let (rank, err) = on_rank(run(&short_x, &idx, &probs, 1));
    assert!(
        rank == 0 && matches!(err, Error::Length { arg: "x", .. }),
        "{err}"
    );

    let mut long_idx = idx.clone();
    long_idx[1].push(-1);
    let (rank, err) = on_rank(run(&x, &long_idx, &probs, 1));
    assert!(
        rank == 1
            && matches!(
                err,
                Error::Length {
                    arg: "topk_idx",
                    ..
                }
            ),
        "{err}"
    );

    let mut short_probs = probs.clone();
    short_probs[0].pop();
    let (rank, err) = on_rank(run(&x, &idx, &short_probs, 1));
    assert!(
        rank == 0 && matches!(err, Error::Length { arg: "probs", .. }),
        "{err}"
    );

    let mut bad_idx = idx.clone();
    bad_idx[1][6] = 16;
    let (rank, err) = on_rank(run(&x, &bad_idx, &probs, 1));
    assert_eq!(rank, 1);
    assert!(
        matches!(
            err,
            Error::ExpertOutOfRange {
                arg: "topk_idx",
                row: 1,
                slot: 2,
                value: 16,
                ..
            }
        ),
        "{err}"
    );

    let mut dup_idx = idx.clone();
    dup_idx[0][4..8].copy_from_slice(&[5, 6, 5, -1]);
    let (rank, err) = on_rank(run(&x, &dup_idx, &probs, 1));
    assert_eq!(rank, 0);
    assert!(
        matches!(
            err,
            Error::DuplicateExpert {
                arg: "topk_idx",
                row: 1,
                expert: 5,
                first: 0,
                second: 2
            }
        ),
        "{err}"
    );

    let mut nan_probs = probs.clone();
    nan_probs[1][3] = f32::NAN;
    let (rank, err) = on_rank(run(&x, &idx, &nan_probs, 1));
    assert!(
        rank == 1 && matches!(err, Error::Value { arg: "probs", .. }),
        "{err}"
    );

    let err = dispatch_with_permute(
        tiny(),
        &x[..0],
        &idx[..0],
        &probs[..0],
        1,
        SyncMode::Blocking,
    )
    .unwrap_err();
    assert!(matches!(err, Error::Shape { arg: "ranks", .. }), "{err}");

    let mut fp8 = Fp8Rows {
        rows: 5,
        hidden: 256,
        codes: vec![0; 5 * 256],
        scales: vec![1.0; 5 * 2],
    };
    fp8.scales.pop();
    let fp8_x = vec![fp8.clone(), fp8];
    let err = dispatch_with_permute(tiny(), &fp8_x, &idx, &probs, 1, SyncMode::Blocking);
    let (rank, err) = on_rank(err.unwrap_err());
    assert!(
        rank == 0
            && matches!(
                err,
                Error::Length {
                    arg: "scales",
                    got: 9,
                    expected: 10
                }
            ),
        "{err}"
    );
}
