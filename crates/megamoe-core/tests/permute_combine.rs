//! Combine with unpermute and the backward passes of dispatch and combine.

mod common;

use half::bf16;
use megamoe_core::permute::{
    combine_backward, combine_with_unpermute, dispatch_backward, dispatch_rows,
    dispatch_with_permute, Bf16Rows, PermuteHandle, SyncMode,
};
use megamoe_core::routing::{generate_world, RoutingKind, RoutingSpec};
use megamoe_core::{Error, WorldInputs};

use common::{bits, on_rank, small_integer_rows, tiny, topk_idx, topk_weights, x_rows};

fn masked_zipf(seed: u64) -> RoutingSpec {
    RoutingSpec {
        kind: RoutingKind::Zipf { exponent: 1.0 },
        masked_ratio: 0.3,
        uneven_tokens: true,
        seed,
    }
}

fn dispatch(world: &WorldInputs, x: &[Bf16Rows], pad: usize) -> (Vec<Bf16Rows>, PermuteHandle) {
    let (out, handle) = dispatch_with_permute(
        world.shape,
        x,
        &topk_idx(world),
        &topk_weights(world),
        pad,
        SyncMode::Blocking,
    )
    .unwrap();
    (out.into_iter().map(|o| o.rows).collect(), handle)
}

/// A stand-in expert whose outputs make the f32 sum order visible: experts scale the row by
/// +2^30, −2^30 or 1 (e mod 3), all exact in bf16, so large copies cancel and a small copy
/// survives or is absorbed depending on where it sits in the order.
fn expert_output(row: &[bf16], expert: usize) -> Vec<bf16> {
    let factor = [2f32.powi(30), -(2f32.powi(30)), 1.0][expert % 3];
    row.iter()
        .map(|v| bf16::from_f32(v.to_f32() * factor))
        .collect()
}

#[test]
fn identity_experts_return_each_token_times_its_valid_slots_bitwise() {
    for ranks in [1, 2, 4, 8] {
        let spec = RoutingSpec {
            masked_ratio: 0.5,
            ..masked_zipf(3)
        };
        let world = generate_world(tiny(), ranks, 64 / ranks, &spec).unwrap();
        let x = small_integer_rows(&world);
        for pad in [1, 16] {
            let (rows, handle) = dispatch(&world, &x, pad);
            let y = combine_with_unpermute(&rows, &handle).unwrap();
            let mut saw_fully_masked = false;
            for (r, inputs) in world.ranks.iter().enumerate() {
                assert_eq!(y[r].rows, inputs.tokens);
                for t in 0..inputs.tokens {
                    let slots = &inputs.topk_idx[t * 4..][..4];
                    let copies = slots.iter().filter(|&&e| e >= 0).count() as f32;
                    saw_fully_masked |= copies == 0.0;
                    let expected: Vec<bf16> = x[r]
                        .row(t)
                        .iter()
                        // + 0.0: the sum starts from +0, so no copy gives +0, never −0.
                        .map(|v| bf16::from_f32(v.to_f32() * copies + 0.0))
                        .collect();
                    assert_eq!(
                        bits(y[r].row(t)),
                        bits(&expected),
                        "R={ranks} rank {r} token {t}"
                    );
                }
            }
            assert!(
                saw_fully_masked,
                "the data should hold a token without valid slot"
            );
        }
    }
}

#[test]
fn a_token_without_valid_slot_combines_to_positive_zero() {
    let mut world = generate_world(tiny(), 2, 3, &RoutingSpec::default()).unwrap();
    world.ranks[1].topk_idx[4..8].fill(-1);
    let (rows, handle) = dispatch(&world, &x_rows(&world), 1);
    let y = combine_with_unpermute(&rows, &handle).unwrap();
    assert!(y[1].row(1).iter().all(|v| v.to_bits() == 0));
    assert!(y[1].row(0).iter().any(|v| v.to_bits() != 0));
}

#[test]
fn combine_sums_in_f32_in_ascending_expert_order_with_one_rounding() {
    let world = generate_world(tiny(), 4, 40, &masked_zipf(8)).unwrap();
    let x = x_rows(&world);
    let (rows, handle) = dispatch(&world, &x, 16);
    // Replace every dispatched row by its expert's output; padding rows get garbage that
    // combine must not read.
    let outputs: Vec<Bf16Rows> = rows
        .iter()
        .zip(&handle.plans)
        .map(|(rows, plan)| {
            let mut out = rows.clone();
            for (i, chunk) in out.values.chunks_mut(rows.hidden).enumerate() {
                let expert =
                    plan.first_expert + (0..4).rfind(|&j| plan.expert_offsets[j] <= i).unwrap();
                match plan.sources[i] {
                    Some(_) => chunk.copy_from_slice(&expert_output(rows.row(i), expert)),
                    None => chunk.fill(bf16::from_f32(1000.0)),
                }
            }
            out
        })
        .collect();
    let y = combine_with_unpermute(&outputs, &handle).unwrap();
    for (r, inputs) in world.ranks.iter().enumerate() {
        for t in 0..inputs.tokens {
            let mut experts: Vec<usize> = inputs.topk_idx[t * 4..][..4]
                .iter()
                .filter(|&&e| e >= 0)
                .map(|&e| e as usize)
                .collect();
            experts.sort();
            let mut sum = vec![0f32; tiny().hidden];
            for e in experts {
                for (s, v) in sum.iter_mut().zip(expert_output(x[r].row(t), e)) {
                    *s += v.to_f32();
                }
            }
            let expected: Vec<bf16> = sum.iter().map(|&s| bf16::from_f32(s)).collect();
            assert_eq!(bits(y[r].row(t)), bits(&expected), "rank {r} token {t}");
        }
    }
}

#[test]
fn combined_output_is_the_same_for_every_world_size() {
    let global = |ranks: usize| {
        let world = generate_world(tiny(), ranks, 64 / ranks, &masked_zipf(5)).unwrap();
        let (rows, handle) = dispatch(&world, &x_rows(&world), 64);
        let y = combine_with_unpermute(&rows, &handle).unwrap();
        y.iter().flat_map(|y| bits(&y.values)).collect::<Vec<u16>>()
    };
    let single = global(1);
    assert_eq!(single.len(), 64 * tiny().hidden);
    for ranks in [2, 4, 8] {
        assert_eq!(global(ranks), single, "R={ranks}");
    }
}

#[test]
fn combine_backward_is_the_forward_dispatch_layout_of_the_gradient() {
    let world = generate_world(tiny(), 2, 17, &masked_zipf(6)).unwrap();
    let (forward_rows, handle) = dispatch(&world, &x_rows(&world), 16);
    // The gradient of y shares x's shape; take x itself to compare with the forward rows.
    let grads = combine_backward(&x_rows(&world), &handle).unwrap();
    assert_eq!(grads.len(), 2);
    for (g, f) in grads.iter().zip(&forward_rows) {
        assert_eq!(g.rows, f.rows);
        assert_eq!(bits(&g.values), bits(&f.values));
    }
    let again = dispatch_rows(&x_rows(&world), &handle).unwrap();
    assert_eq!(again, grads);
}

#[test]
fn dispatch_backward_combines_row_grads_and_scatters_prob_grads() {
    let world = generate_world(tiny(), 4, 9, &masked_zipf(7)).unwrap();
    let (out, handle) = dispatch_with_permute(
        tiny(),
        &small_integer_rows(&world),
        &topk_idx(&world),
        &topk_weights(&world),
        16,
        SyncMode::Blocking,
    )
    .unwrap();
    let row_grads: Vec<Bf16Rows> = out.iter().map(|o| o.rows.clone()).collect();
    let prob_grads: Vec<Vec<f32>> = out
        .iter()
        .zip(&handle.plans)
        .map(|(o, plan)| {
            (0..plan.output_rows())
                .map(|i| match plan.sources[i] {
                    Some(_) => 2.0 * o.probs[i] + 1.0,
                    None => f32::NAN, // padding gradients are never read
                })
                .collect()
        })
        .collect();
    let grads = dispatch_backward(&row_grads, &prob_grads, &handle).unwrap();

    let combined = combine_with_unpermute(&row_grads, &handle).unwrap();
    assert_eq!(grads.x, combined);
    for (r, inputs) in world.ranks.iter().enumerate() {
        assert_eq!(grads.x[r].rows, inputs.tokens);
        assert_eq!(grads.probs[r].len(), inputs.tokens * 4);
        for (i, (&e, &w)) in inputs.topk_idx.iter().zip(&inputs.topk_weights).enumerate() {
            let expected = if e >= 0 { 2.0 * w + 1.0 } else { 0.0 };
            assert_eq!(
                grads.probs[r][i].to_bits(),
                expected.to_bits(),
                "rank {r} slot {i}"
            );
        }
    }
}

#[test]
fn combine_and_backward_reject_inputs_that_do_not_fit_the_handle() {
    let world = generate_world(tiny(), 2, 6, &RoutingSpec::default()).unwrap();
    let (rows, handle) = dispatch(&world, &x_rows(&world), 16);

    let err = combine_with_unpermute(&rows[..1], &handle).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Length {
                arg: "rows",
                got: 1,
                expected: 2
            }
        ),
        "{err}"
    );

    let mut short = rows.clone();
    short[1] = Bf16Rows::zeros(rows[1].rows + 1, rows[1].hidden);
    let (rank, err) = on_rank(combine_with_unpermute(&short, &handle).unwrap_err());
    assert!(
        rank == 1 && matches!(err, Error::Length { arg: "rows", .. }),
        "{err}"
    );

    let mut torn = rows.clone();
    torn[0].values.pop();
    let (rank, err) = on_rank(combine_with_unpermute(&torn, &handle).unwrap_err());
    assert!(
        rank == 0 && matches!(err, Error::Length { arg: "rows", .. }),
        "{err}"
    );

    let mut mixed = rows.clone();
    mixed[1] = Bf16Rows::zeros(rows[1].rows, 128);
    let (rank, err) = on_rank(combine_with_unpermute(&mixed, &handle).unwrap_err());
    assert!(
        rank == 1 && matches!(err, Error::Shape { arg: "rows", .. }),
        "{err}"
    );

    let prob_grads: Vec<Vec<f32>> = rows.iter().map(|r| vec![0.0; r.rows]).collect();
    let err = dispatch_backward(&rows, &prob_grads[..1], &handle).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Length {
                arg: "prob_grads",
                ..
            }
        ),
        "{err}"
    );
    let mut long = prob_grads.clone();
    long[0].push(0.0);
    let (rank, err) = on_rank(dispatch_backward(&rows, &long, &handle).unwrap_err());
    assert!(
        rank == 0
            && matches!(
                err,
                Error::Length {
                    arg: "prob_grads",
                    ..
                }
            ),
        "{err}"
    );
    let (rank, err) = on_rank(dispatch_backward(&torn, &prob_grads, &handle).unwrap_err());
    assert!(
        rank == 0
            && matches!(
                err,
                Error::Length {
                    arg: "row_grads",
                    ..
                }
            ),
        "{err}"
    );

    let mut y_grad = x_rows(&world);
    y_grad[1] = Bf16Rows::zeros(5, tiny().hidden);
    let (rank, err) = on_rank(combine_backward(&y_grad, &handle).unwrap_err());
    assert!(
        rank == 1
            && matches!(
                err,
                Error::Length {
                    arg: "y_grad",
                    got: 5,
                    expected: 6
                }
            ),
        "{err}"
    );
}

#[test]
fn zero_tokens_combine_and_backward_are_legal() {
    let world = generate_world(tiny(), 2, 0, &RoutingSpec::default()).unwrap();
    let (rows, handle) = dispatch(&world, &x_rows(&world), 16);
    let y = combine_with_unpermute(&rows, &handle).unwrap();
    assert!(y.iter().all(|y| y.rows == 0 && y.values.is_empty()));
    let grads = dispatch_backward(&rows, &[vec![], vec![]], &handle).unwrap();
    assert!(grads.probs.iter().all(Vec::is_empty));
    let g = combine_backward(&y, &handle).unwrap();
    assert!(g.iter().all(|g| g.rows == 0));
}

/// The per-rank order (SPEC §5): with one rank, or with one expert per rank, every expert rank
/// holds at most one run of a token's copies whose partial sum needs no extra rounding beyond
/// exact's, so both orders give the same bits; in general it rounds once per (token, rank).
#[test]
fn the_per_rank_order_rounds_once_per_rank() {
    use megamoe_core::permute::{combine_with_unpermute_in, CombineOrder};
    let shape = tiny(); // 16 experts, top-4
                        // One rank: the per-rank sum is exact's sum rounded twice to bf16, which is exact's bits.
                        // Sixteen ranks: one expert per rank, each partial is one bf16 row, taken exactly.
    for ranks in [1, 16] {
        let world = generate_world(shape, ranks, 8, &masked_zipf(5)).unwrap();
        let x = x_rows(&world);
        let (rows, handle) = dispatch(&world, &x, 1);
        let exact = combine_with_unpermute(&rows, &handle).unwrap();
        let per_rank = combine_with_unpermute_in(&rows, &handle, CombineOrder::PerRank).unwrap();
        for (e, p) in exact.iter().zip(&per_rank) {
            assert_eq!(bits(&e.values), bits(&p.values), "R {ranks}");
        }
    }
    // Two ranks, token 0 of rank 0 routed to experts 0 and 1 (rank 0) and 8 (rank 1), with rows
    // 1, 2^-8 and 2^-8: exact sums 1 + 2^-8 + 2^-8 = 1 + 2^-7 (a bf16 value); per rank, rank
    // 0's partial 1 + 2^-8 rounds to 1 (ties to even), then 1 + 2^-8 rounds to 1 again.
    let h = shape.hidden;
    let k = shape.topk;
    let mut idx = vec![vec![-1i32; k]; 2];
    idx[0][..3].copy_from_slice(&[0, 1, 8]);
    let x: Vec<Bf16Rows> = (0..2)
        .map(|_| Bf16Rows {
            rows: 1,
            hidden: h,
            values: vec![bf16::ONE; h],
        })
        .collect();
    let probs = vec![vec![1.0f32; k]; 2];
    let (out, handle) =
        dispatch_with_permute(shape, &x, &idx, &probs, 1, SyncMode::Blocking).unwrap();
    // The experts' outputs: expert 0 keeps 1, experts 1 and 8 give 2^-8.
    let mut rows: Vec<Bf16Rows> = out.into_iter().map(|o| o.rows).collect();
    let small = bf16::from_f32(2f32.powi(-8));
    for d in handle.destinations[0][..3].iter().flatten() {
        if d.expert != 0 {
            rows[d.rank].values[d.row * h..(d.row + 1) * h].fill(small);
        }
    }
    let exact = combine_with_unpermute(&rows, &handle).unwrap();
    let per_rank = combine_with_unpermute_in(&rows, &handle, CombineOrder::PerRank).unwrap();
    assert_eq!(exact[0].values[0].to_f32(), 1.0 + 2f32.powi(-7));
    assert_eq!(per_rank[0].values[0].to_f32(), 1.0);
}
