//! Property tests of dispatch / combine on random small worlds with arbitrary routing.

mod common;

use half::bf16;
use megamoe_core::permute::{
    combine_backward, combine_with_unpermute, dispatch_backward, dispatch_rows_per_rank,
    dispatch_with_permute, Bf16Rows, SyncMode,
};
use megamoe_core::{Error, Shape};
use proptest::prelude::*;

use common::{bits, narrow};

/// A world: shape, pad_multiple, and per rank per token its K slots (−1 = masked).
#[derive(Clone, Debug)]
struct World {
    shape: Shape,
    pad: usize,
    topk_idx: Vec<Vec<i32>>,
}

fn world() -> impl Strategy<Value = World> {
    let dims = (
        prop::sample::select(vec![1usize, 2, 4]),
        1usize..=3,
        1usize..=4,
        prop::sample::select(vec![1usize, 2, 3, 16]),
    );
    dims.prop_flat_map(|(ranks, local_experts, topk, pad)| {
        let experts = ranks * local_experts;
        let topk = topk.min(experts);
        let token = (
            Just((0..experts as i32).collect::<Vec<_>>()).prop_shuffle(),
            prop::collection::vec(prop::bool::weighted(0.25), topk),
        )
            .prop_map(move |(order, masked)| {
                order[..topk]
                    .iter()
                    .zip(masked)
                    .map(|(&e, m)| if m { -1 } else { e })
                    .collect::<Vec<i32>>()
            });
        let rank = prop::collection::vec(token, 0..6).prop_map(|t| t.concat());
        prop::collection::vec(rank, ranks).prop_map(move |topk_idx| World {
            shape: narrow(experts, topk),
            pad,
            topk_idx,
        })
    })
}

impl World {
    fn tokens(&self, rank: usize) -> usize {
        self.topk_idx[rank].len() / self.shape.topk
    }

    /// Small integers in [-4, 4]: every sum of up to K copies is exact.
    fn x(&self) -> Vec<Bf16Rows> {
        (0..self.topk_idx.len())
            .map(|r| Bf16Rows {
                rows: self.tokens(r),
                hidden: self.shape.hidden,
                values: (0..self.tokens(r) * self.shape.hidden)
                    .map(|i| bf16::from_f32(((i * 5 + r * 3) % 9) as f32 - 4.0))
                    .collect(),
            })
            .collect()
    }

    /// Distinct probs per slot (never read on masked slots).
    fn probs(&self) -> Vec<Vec<f32>> {
        self.topk_idx
            .iter()
            .enumerate()
            .map(|(r, idx)| {
                (0..idx.len())
                    .map(|i| (r * 1000 + i) as f32 + 0.5)
                    .collect()
            })
            .collect()
    }
}

fn dot(a: &[Bf16Rows], b: &[Bf16Rows]) -> f64 {
    a.iter()
        .zip(b)
        .flat_map(|(a, b)| a.values.iter().zip(&b.values))
        .map(|(x, y)| x.to_f64() * y.to_f64())
        .sum()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn every_valid_slot_lands_once_in_order_and_padded(w in world()) {
        let (out, handle) = dispatch_with_permute(
            w.shape, &w.x(), &w.topk_idx, &w.probs(), w.pad, SyncMode::Blocking).unwrap();
        let sizes = dispatch_rows_per_rank(w.shape, &w.topk_idx, w.pad).unwrap();
        let mut landed = 0;
        for (d, (plan, o)) in handle.plans.iter().zip(&out).enumerate() {
            prop_assert_eq!(plan.output_rows(), sizes[d]);
            prop_assert_eq!(o.rows.rows, sizes[d]);
            for j in 0..plan.tokens_per_expert.len() {
                let (start, padded) = (plan.expert_offsets[j], plan.tokens_per_expert[j]);
                let valid = plan.rows_per_expert[j];
                prop_assert_eq!(plan.expert_offsets[j + 1], start + padded);
                prop_assert_eq!(padded % w.pad, 0);
                prop_assert!(padded >= valid && padded - valid < w.pad);
                let segment = &plan.sources[start..start + padded];
                prop_assert!(segment[valid..].iter().all(Option::is_none));
                let pairs: Vec<_> = segment[..valid].iter().map(|s| s.unwrap()).collect();
                prop_assert!(pairs.windows(2).all(|p| (p[0].rank, p[0].token) < (p[1].rank, p[1].token)));
                for (i, s) in pairs.iter().enumerate() {
                    let e = w.topk_idx[s.rank][s.token * w.shape.topk + s.slot];
                    prop_assert_eq!(e as usize, plan.first_expert + j);
                    let dest = handle.destinations[s.rank][s.token * w.shape.topk + s.slot].unwrap();
                    prop_assert_eq!((dest.rank, dest.row, dest.expert), (d, start + i, e as usize));
                    prop_assert_eq!(o.probs[start + i], w.probs()[s.rank][s.token * w.shape.topk + s.slot]);
                }
                landed += valid;
            }
        }
        let valid_slots = w.topk_idx.iter().flatten().filter(|&&e| e >= 0).count();
        prop_assert_eq!(landed, valid_slots);
    }

    #[test]
    fn identity_round_trip_multiplies_by_valid_slots(w in world()) {
        let x = w.x();
        let (out, handle) = dispatch_with_permute(
            w.shape, &x, &w.topk_idx, &w.probs(), w.pad, SyncMode::Blocking).unwrap();
        let rows: Vec<Bf16Rows> = out.into_iter().map(|o| o.rows).collect();
        let y = combine_with_unpermute(&rows, &handle).unwrap();
        for (r, y) in y.iter().enumerate() {
            for t in 0..w.tokens(r) {
                let slots = &w.topk_idx[r][t * w.shape.topk..][..w.shape.topk];
                let copies = slots.iter().filter(|&&e| e >= 0).count() as f32;
                let expected: Vec<bf16> =
                    x[r].row(t).iter().map(|v| bf16::from_f32(v.to_f32() * copies + 0.0)).collect();
                prop_assert_eq!(bits(y.row(t)), bits(&expected));
            }
        }
    }

    #[test]
    fn combine_is_the_adjoint_of_dispatch(w in world()) {
        // <dispatch(x), g> = <x, combine(g)>, exact with small integers.
        let x = w.x();
        let (out, handle) = dispatch_with_permute(
            w.shape, &x, &w.topk_idx, &w.probs(), w.pad, SyncMode::Blocking).unwrap();
        let dispatched: Vec<Bf16Rows> = out.into_iter().map(|o| o.rows).collect();
        let g: Vec<Bf16Rows> = dispatched
            .iter()
            .map(|d| Bf16Rows {
                values: (0..d.values.len()).map(|i| bf16::from_f32((i % 5) as f32 - 2.0)).collect(),
                ..d.clone()
            })
            .collect();
        let prob_grads: Vec<Vec<f32>> = dispatched.iter().map(|d| vec![1.0; d.rows]).collect();
        let grads = dispatch_backward(&g, &prob_grads, &handle).unwrap();
        prop_assert_eq!(dot(&dispatched, &g), dot(&x, &grads.x));
        // Prob gradients of 1 come back as the valid-slot mask.
        for (r, idx) in w.topk_idx.iter().enumerate() {
            let mask: Vec<f32> = idx.iter().map(|&e| if e >= 0 { 1.0 } else { 0.0 }).collect();
            prop_assert_eq!(&grads.probs[r], &mask);
        }
        // And combine's backward is dispatch: <combine(g), x> = <g, combine_backward(x)>.
        let back = combine_backward(&x, &handle).unwrap();
        prop_assert_eq!(dot(&g, &back), dot(&grads.x, &x));
    }

    #[test]
    fn non_blocking_bound_either_fits_exactly_or_names_the_overflowing_rank(w in world(), slack in 0usize..3) {
        let sizes = dispatch_rows_per_rank(w.shape, &w.topk_idx, w.pad).unwrap();
        let needed = *sizes.iter().max().unwrap();
        let (x, probs) = (w.x(), w.probs());
        let mode = SyncMode::NonBlocking { max_rows: needed + slack };
        let (out, _) = dispatch_with_permute(w.shape, &x, &w.topk_idx, &probs, w.pad, mode).unwrap();
        prop_assert!(out.iter().all(|o| o.rows.rows == needed + slack && o.probs.len() == needed + slack));
        if needed > 0 {
            let mode = SyncMode::NonBlocking { max_rows: needed - 1 };
            let err = dispatch_with_permute(w.shape, &x, &w.topk_idx, &probs, w.pad, mode).unwrap_err();
            let first = sizes.iter().position(|&s| s == needed).unwrap();
            prop_assert_eq!(err, Error::Overflow { arg: "max_rows", rank: first, needed, bound: needed - 1 });
        }
    }
}
