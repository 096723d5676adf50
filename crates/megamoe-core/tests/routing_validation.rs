//! Every invalid per-rank input is rejected with the right error naming the argument and rank.

use megamoe_core::routing::{generate_world, validate_rank, validate_world, RoutingSpec};
use megamoe_core::{Error, Preset, RankInputs, Shape, WorldInputs};

fn tiny() -> Shape {
    Preset::by_name("tiny").unwrap().shape
}

fn world() -> WorldInputs {
    generate_world(tiny(), 2, 6, &RoutingSpec::default()).unwrap()
}

/// Validates rank 1 after `edit`, expecting an error on rank 1; returns the inner error.
fn rank1_error(edit: impl FnOnce(&mut RankInputs)) -> Error {
    let mut world = world();
    edit(&mut world.ranks[1]);
    let err = validate_world(&world, Some(6)).unwrap_err();
    match err {
        Error::OnRank { rank: 1, source } => *source,
        other => panic!("expected an error on rank 1, got {other}"),
    }
}

#[test]
fn generated_inputs_are_valid() {
    let world = world();
    validate_world(&world, Some(6)).unwrap();
    validate_world(&world, None).unwrap();
    validate_rank(tiny(), 0, &world.ranks[0], Some(6)).unwrap();
}

#[test]
fn wrong_lengths_name_the_argument() {
    let err = rank1_error(|r| {
        r.x.pop();
    });
    assert_eq!(
        err,
        Error::Length {
            arg: "x",
            got: 6 * 256 - 1,
            expected: 6 * 256
        }
    );
    let err = rank1_error(|r| r.topk_idx.push(0));
    assert!(
        matches!(
            err,
            Error::Length {
                arg: "topk_idx",
                got: 25,
                expected: 24
            }
        ),
        "{err}"
    );
    let err = rank1_error(|r| r.topk_weights.truncate(3));
    assert!(
        matches!(
            err,
            Error::Length {
                arg: "topk_weights",
                got: 3,
                expected: 24
            }
        ),
        "{err}"
    );
}

#[test]
fn tokens_over_capacity_are_rejected() {
    let world = world();
    let err = validate_rank(tiny(), 3, &world.ranks[0], Some(5)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "rank 3: `tokens`: 6 tokens exceed the capacity of 5"
    );
    match err {
        Error::OnRank { rank: 3, source } => assert_eq!(
            *source,
            Error::Capacity {
                arg: "tokens",
                got: 6,
                capacity: 5
            }
        ),
        other => panic!("{other}"),
    }
}

#[test]
fn out_of_range_experts_give_row_slot_and_value() {
    for bad in [16, -2, i32::MAX, i32::MIN] {
        let err = rank1_error(|r| r.topk_idx[2 * 4 + 3] = bad);
        assert_eq!(
            err,
            Error::ExpertOutOfRange {
                arg: "topk_idx",
                row: 2,
                slot: 3,
                value: bad as i64,
                experts: 16
            }
        );
    }
}

#[test]
fn duplicate_experts_in_a_row_are_rejected() {
    let err = rank1_error(|r| {
        r.topk_idx[4..8].copy_from_slice(&[3, -1, 7, 3]);
    });
    assert_eq!(
        err,
        Error::DuplicateExpert {
            arg: "topk_idx",
            row: 1,
            expert: 3,
            first: 0,
            second: 3
        }
    );
    // Several masked slots in one row are not duplicates.
    let mut world = world();
    world.ranks[1].topk_idx[4..8].copy_from_slice(&[-1, 5, -1, -1]);
    validate_world(&world, None).unwrap();
}

#[test]
fn non_finite_weights_on_valid_slots_are_rejected_and_masked_ones_ignored() {
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let err = rank1_error(|r| {
            r.topk_idx[4..8].copy_from_slice(&[0, 9, 1, 2]);
            r.topk_weights[5] = bad;
        });
        match err {
            Error::Value { arg, reason, .. } => {
                assert_eq!(arg, "topk_weights");
                assert!(reason.contains("row 1 slot 1"), "{reason}");
            }
            other => panic!("{other}"),
        }
    }
    let mut world = world();
    world.ranks[1].topk_idx[5] = -1;
    world.ranks[1].topk_weights[5] = f32::NAN;
    validate_world(&world, None).unwrap();
}

#[test]
fn negative_weights_are_legal() {
    let mut world = world();
    world.ranks[0]
        .topk_weights
        .iter_mut()
        .for_each(|w| *w = -*w);
    validate_world(&world, None).unwrap();
}

#[test]
fn world_shape_must_split_over_its_ranks() {
    let mut world = world();
    world.ranks.push(world.ranks[0].clone());
    let err = validate_world(&world, None).unwrap_err();
    assert!(matches!(err, Error::Shape { arg: "ranks", .. }), "{err}");
}
