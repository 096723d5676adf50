//! The GPU checks compare against this crate's plan-based reference; this test holds that
//! reference to megamoe-core's reference of SPEC §5 bit for bit (forward, both backwards, BF16
//! and FP8 rows), over world sizes, routings and pad multiples.

use half::bf16;
use megamoe_core::permute::{self, Bf16Rows, Fp8Rows, SyncMode};
use megamoe_core::Preset;
use megamoe_ep::plan::PermutePlan;
use megamoe_ep::reference::{self, SourceRows};
use megamoe_ep::routing::{tokens_per_rank, topk_idx, Rng, Routing};

fn bytes(v: &[bf16]) -> Vec<u8> {
    v.iter().flat_map(|b| b.to_bits().to_le_bytes()).collect()
}

#[test]
fn plan_reference_matches_core_reference_bit_for_bit() {
    let shape = Preset::by_name("tiny").unwrap().shape;
    let (h, k, e) = (shape.hidden, shape.topk, shape.experts);
    for ranks in [1usize, 2, 4, 8] {
        for routing in Routing::ALL {
            for pad in [1usize, 16, 128] {
                let seed = (ranks * 1000 + pad) as u64;
                let tokens = tokens_per_rank(routing, ranks, 40, seed);
                let idx: Vec<Vec<i32>> = (0..ranks)
                    .map(|r| topk_idx(routing, tokens[r], e, k, seed + r as u64))
                    .collect();
                let mut rng = Rng::new(seed);
                let rand_bf16 = |rng: &mut Rng, n: usize| -> Vec<bf16> {
                    (0..n)
                        .map(|_| bf16::from_f32((rng.unit() * 8.0 - 4.0) as f32))
                        .collect()
                };
                let x: Vec<Bf16Rows> = tokens
                    .iter()
                    .map(|&t| Bf16Rows {
                        rows: t,
                        hidden: h,
                        values: rand_bf16(&mut rng, t * h),
                    })
                    .collect();
                let fp8: Vec<Fp8Rows> = tokens
                    .iter()
                    .map(|&t| Fp8Rows {
                        rows: t,
                        hidden: h,
                        codes: (0..t * h).map(|_| rng.next_u64() as u8).collect(),
                        scales: (0..t * h / 128).map(|_| rng.unit() as f32).collect(),
                    })
                    .collect();
                let probs: Vec<Vec<f32>> = tokens
                    .iter()
                    .map(|&t| (0..t * k).map(|_| rng.unit() as f32).collect())
                    .collect();

                let (core_out, handle) = permute::dispatch_with_permute(
                    shape,
                    &x,
                    &idx,
                    &probs,
                    pad,
                    SyncMode::Blocking,
                )
                .unwrap();
                let (core_fp8, _) = permute::dispatch_with_permute(
                    shape,
                    &fp8,
                    &idx,
                    &probs,
                    pad,
                    SyncMode::Blocking,
                )
                .unwrap();
                let idx_refs: Vec<&[i32]> = idx.iter().map(|v| v.as_slice()).collect();
                let plan = PermutePlan::build(&idx_refs, &tokens, e, k, pad).unwrap();
                let xb: Vec<Vec<u8>> = x.iter().map(|r| bytes(&r.values)).collect();
                let src: Vec<SourceRows> = (0..ranks)
                    .map(|r| SourceRows {
                        topk_idx: &idx[r],
                        rows: &xb[r],
                        scales: &[],
                        probs: &probs[r],
                    })
                    .collect();
                let ours = reference::dispatch(&plan, h * 2, 0, &src);
                let src8: Vec<SourceRows> = (0..ranks)
                    .map(|r| SourceRows {
                        topk_idx: &idx[r],
                        rows: &fp8[r].codes,
                        scales: &fp8[r].scales,
                        probs: &probs[r],
                    })
                    .collect();
                let ours8 = reference::dispatch(&plan, h, h / 128, &src8);
                let case = format!("R={ranks} {} pad {pad}", routing.name());
                for r in 0..ranks {
                    assert_eq!(
                        ours[r].rows,
                        bytes(&core_out[r].rows.values),
                        "{case}: rows of rank {r}"
                    );
                    assert_eq!(
                        ours[r].probs, core_out[r].probs,
                        "{case}: probs of rank {r}"
                    );
                    let tpe: Vec<usize> = ours[r]
                        .tokens_per_expert
                        .iter()
                        .map(|&v| v as usize)
                        .collect();
                    assert_eq!(
                        tpe, core_out[r].tokens_per_expert,
                        "{case}: tokens_per_expert of rank {r}"
                    );
                    assert_eq!(
                        ours8[r].rows, core_fp8[r].rows.codes,
                        "{case}: fp8 codes of rank {r}"
                    );
                    assert_eq!(
                        ours8[r].scales, core_fp8[r].rows.scales,
                        "{case}: fp8 scales of rank {r}"
                    );
                }

                // Combine and dispatch's backward on random rows and prob gradients.
                let rows: Vec<Bf16Rows> = plan
                    .rows_per_rank
                    .iter()
                    .map(|&n| Bf16Rows {
                        rows: n,
                        hidden: h,
                        values: rand_bf16(&mut rng, n * h),
                    })
                    .collect();
                let pgrad: Vec<Vec<f32>> = plan
                    .rows_per_rank
                    .iter()
                    .map(|&n| (0..n).map(|_| rng.unit() as f32).collect())
                    .collect();
                let core_grads = permute::dispatch_backward(&rows, &pgrad, &handle).unwrap();
                let row_refs: Vec<&[bf16]> = rows.iter().map(|r| r.values.as_slice()).collect();
                let y = reference::combine(&plan, &idx_refs, &row_refs, h);
                let pg_refs: Vec<&[f32]> = pgrad.iter().map(|v| v.as_slice()).collect();
                let pg = reference::scatter_prob_grads(&plan, &idx_refs, &pg_refs);
                for r in 0..ranks {
                    assert_eq!(
                        bytes(&y[r]),
                        bytes(&core_grads.x[r].values),
                        "{case}: combine of rank {r}"
                    );
                    assert_eq!(
                        pg[r], core_grads.probs[r],
                        "{case}: prob gradients of rank {r}"
                    );
                }

                // Combine's backward is the dispatch of the output gradient.
                let core_cb = permute::combine_backward(&x, &handle).unwrap();
                for r in 0..ranks {
                    assert_eq!(
                        ours[r].rows,
                        bytes(&core_cb[r].values),
                        "{case}: combine backward of rank {r}"
                    );
                }
            }
        }
    }
}
