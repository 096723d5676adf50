//! megamoe-core's CPU reference of dispatch, combine and both backwards on the bytes of torch
//! tensors: what the GPU calls are checked against.

use half::bf16;
use megamoe_core::permute::{
    combine_backward, combine_with_unpermute_in, dispatch_backward_in, dispatch_with_permute,
    Bf16Rows, CombineOrder as PlanOrder, Fp8Rows, PermuteHandle, PermuteRows, SyncMode as PlanMode,
};
use megamoe_core::preset::Shape;
use megamoe_ep::CombineOrder;

use super::combine_order;
use crate::error::{Error, Result};

/// Inputs of [`reference()`]: one entry per rank, little-endian bytes as torch stores them.
pub struct ReferenceInputs {
    pub hidden: usize,
    pub experts: usize,
    pub topk: usize,
    pub pad_multiple: usize,
    /// bf16 `[T, H]`, or e4m3 codes `[T, H]` with `x_scales` f32 `[T, H/128]`.
    pub x: Vec<Vec<u8>>,
    pub x_scales: Option<Vec<Vec<u8>>>,
    pub topk_idx: Vec<Vec<u8>>,
    pub probs: Vec<Vec<u8>>,
    /// Combine input and dispatch-backward row gradients: bf16 `[rows_r, H]`.
    pub rows: Vec<Vec<u8>>,
    /// Dispatch-backward prob gradients, f32 `[rows_r]`.
    pub prob_grads: Vec<Vec<u8>>,
    /// Combine-backward output gradient, bf16 `[T, H]`.
    pub grad_y: Vec<Vec<u8>>,
    pub order: String,
}

/// megamoe-core's answers for [`ReferenceInputs`], per rank, as bytes.
#[derive(Default)]
pub struct ReferenceOutputs {
    pub rows: Vec<Vec<u8>>,
    pub scales: Vec<Vec<u8>>,
    pub probs: Vec<Vec<u8>>,
    pub tokens_per_expert: Vec<Vec<usize>>,
    /// combine_with_unpermute of `rows` in `order`.
    pub y: Vec<Vec<u8>>,
    /// dispatch's backward of (`rows`, `prob_grads`) in `order`.
    pub grad_x: Vec<Vec<u8>>,
    pub grad_probs: Vec<Vec<u8>>,
    /// combine's backward of `grad_y`.
    pub grad_rows: Vec<Vec<u8>>,
}

fn floats(arg: &str, b: &[u8]) -> Result<Vec<f32>> {
    if b.len() % 4 != 0 {
        return Err(Error::Value(format!(
            "{arg}: {} bytes is not whole f32s",
            b.len()
        )));
    }
    Ok(b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect())
}

fn ints(arg: &str, b: &[u8]) -> Result<Vec<i32>> {
    Ok(floats(arg, b)?
        .into_iter()
        .map(|f| f.to_bits() as i32)
        .collect())
}

fn bf16s(arg: &str, b: &[u8], hidden: usize) -> Result<Bf16Rows> {
    if b.len() % (2 * hidden) != 0 {
        return Err(Error::Value(format!(
            "{arg}: {} bytes is not whole rows of {hidden} bf16",
            b.len()
        )));
    }
    Ok(Bf16Rows {
        rows: b.len() / (2 * hidden),
        hidden,
        values: b
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]))
            .collect(),
    })
}

fn bf16_bytes(r: &Bf16Rows) -> Vec<u8> {
    r.values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Decodes every rank's bytes of `arg` with `decode`.
fn each<T>(
    arg: &str,
    ranks: &[Vec<u8>],
    decode: impl Fn(&str, &[u8]) -> Result<T>,
) -> Result<Vec<T>> {
    ranks.iter().map(|b| decode(arg, b)).collect()
}

/// The reference dispatch of `x` into `out`, each rank's rows stored as the bytes (rows,
/// scales) that `to_bytes` gives; returns the handle the combine and backwards reuse.
fn reference_dispatch<M: PermuteRows>(
    shape: Shape,
    x: &[M],
    (idx, probs): (&[Vec<i32>], &[Vec<f32>]),
    pad_multiple: usize,
    out: &mut ReferenceOutputs,
    to_bytes: impl Fn(M) -> (Vec<u8>, Vec<u8>),
) -> Result<PermuteHandle> {
    let (dispatched, handle) =
        dispatch_with_permute(shape, x, idx, probs, pad_multiple, PlanMode::Blocking)?;
    for o in dispatched {
        let (rows, scales) = to_bytes(o.rows);
        out.rows.push(rows);
        out.scales.push(scales);
        out.probs.push(f32_bytes(&o.probs));
        out.tokens_per_expert.push(o.tokens_per_expert);
    }
    Ok(handle)
}

/// megamoe-core's CPU reference of dispatch, combine (in `order`) and both backwards.
pub fn reference(inp: &ReferenceInputs) -> Result<ReferenceOutputs> {
    let shape = Shape {
        hidden: inp.hidden,
        inter: 128,
        experts: inp.experts,
        topk: inp.topk,
    };
    let order = match combine_order(&inp.order)? {
        CombineOrder::PerRank => PlanOrder::PerRank,
        _ => PlanOrder::Exact,
    };
    let h = inp.hidden;
    let rows_of = |arg: &str, b: &[u8]| bf16s(arg, b, h);
    let idx = each("topk_idx", &inp.topk_idx, ints)?;
    let probs = each("probs", &inp.probs, floats)?;
    let routing = (idx.as_slice(), probs.as_slice());
    let pad = inp.pad_multiple;
    let mut out = ReferenceOutputs::default();
    let handle = match &inp.x_scales {
        None => {
            let x = each("x", &inp.x, rows_of)?;
            reference_dispatch(shape, &x, routing, pad, &mut out, |rows| {
                (bf16_bytes(&rows), vec![])
            })?
        }
        Some(scales) => {
            let x = inp
                .x
                .iter()
                .zip(scales)
                .map(|(codes, s)| {
                    Ok(Fp8Rows {
                        rows: codes.len() / h,
                        hidden: h,
                        codes: codes.clone(),
                        scales: floats("x_scales", s)?,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            reference_dispatch(shape, &x, routing, pad, &mut out, |rows| {
                (rows.codes, f32_bytes(&rows.scales))
            })?
        }
    };
    let rows = each("rows", &inp.rows, rows_of)?;
    let prob_grads = each("prob_grads", &inp.prob_grads, floats)?;
    let grad_y = each("grad_y", &inp.grad_y, rows_of)?;
    out.y = combine_with_unpermute_in(&rows, &handle, order)?
        .iter()
        .map(bf16_bytes)
        .collect();
    let grads = dispatch_backward_in(&rows, &prob_grads, &handle, order)?;
    out.grad_x = grads.x.iter().map(bf16_bytes).collect();
    out.grad_probs = grads.probs.iter().map(|p| f32_bytes(p)).collect();
    out.grad_rows = combine_backward(&grad_y, &handle)?
        .iter()
        .map(bf16_bytes)
        .collect();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_runs_both_orders_and_round_trips_the_bytes() {
        // 2 ranks of 2 tokens, 4 experts (2 per rank), top-2, H = 128.
        let h = 128;
        let x: Vec<Vec<u8>> = (0..2)
            .map(|r| {
                let v: Vec<bf16> = (0..2 * h)
                    .map(|i| bf16::from_f32((i + r) as f32 / 8.0))
                    .collect();
                bf16_bytes(&Bf16Rows {
                    rows: 2,
                    hidden: h,
                    values: v,
                })
            })
            .collect();
        let idx = |v: [i32; 4]| v.iter().flat_map(|i| i.to_le_bytes()).collect::<Vec<u8>>();
        let topk_idx = vec![idx([0, 1, 2, 3]), idx([1, -1, 0, 3])];
        let probs = vec![f32_bytes(&[0.5; 4]); 2];
        let mut inp = ReferenceInputs {
            hidden: h,
            experts: 4,
            topk: 2,
            pad_multiple: 1,
            x,
            x_scales: None,
            topk_idx,
            probs,
            rows: vec![],
            prob_grads: vec![],
            grad_y: vec![vec![0; 2 * h * 2]; 2],
            order: "per_rank".into(),
        };
        // First learn the row counts from a run with no combine rows of the right size.
        let plan_rows: Vec<usize> = {
            let idx = inp
                .topk_idx
                .iter()
                .map(|b| ints("topk_idx", b).unwrap())
                .collect::<Vec<_>>();
            let h = megamoe_core::permute::plan_permute(
                Shape {
                    hidden: h,
                    inter: 128,
                    experts: 4,
                    topk: 2,
                },
                &idx,
                1,
                PlanMode::Blocking,
            )
            .unwrap();
            h.plans.iter().map(|p| p.output_rows()).collect()
        };
        inp.rows = plan_rows.iter().map(|&n| vec![0x3f; n * h * 2]).collect();
        inp.prob_grads = plan_rows
            .iter()
            .map(|&n| f32_bytes(&vec![1.0; n]))
            .collect();
        let out = reference(&inp).unwrap();
        assert_eq!(out.rows.len(), 2);
        assert_eq!(out.y[0].len(), 2 * h * 2);
        assert_eq!(out.grad_probs[1], f32_bytes(&[1.0, 0.0, 1.0, 1.0]));
        inp.order = "exact".into();
        assert!(reference(&inp).is_ok());
    }
}
