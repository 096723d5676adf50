//! The CPU reference of dispatch and combine with permute (SPEC §5), built on [`PermutePlan`].
//! The GPU results are compared with these bit for bit.

use half::bf16;

use crate::plan::PermutePlan;

/// One rank's dispatch input: `rows` is `[T, row_bytes]` (bf16 or e4m3 bytes), `scales`
/// `[T, scales_per_row]` (empty for bf16), `probs` `[T, K]`.
pub struct SourceRows<'a> {
    pub topk_idx: &'a [i32],
    pub rows: &'a [u8],
    pub scales: &'a [f32],
    pub probs: &'a [f32],
}

/// What one rank receives: rows in their permuted positions, zero padding included.
#[derive(Clone, Debug, PartialEq)]
pub struct Dispatched {
    pub rows: Vec<u8>,
    pub scales: Vec<f32>,
    pub probs: Vec<f32>,
    pub tokens_per_expert: Vec<u32>,
}

/// Dispatch with permute: every (token, expert) row lands at its plan position on the owner.
pub fn dispatch(
    plan: &PermutePlan,
    row_bytes: usize,
    scales_per_row: usize,
    src: &[SourceRows],
) -> Vec<Dispatched> {
    let mut out: Vec<Dispatched> = (0..plan.ranks)
        .map(|d| Dispatched {
            rows: vec![0; plan.rows_per_rank[d] * row_bytes],
            scales: vec![0.0; plan.rows_per_rank[d] * scales_per_row],
            probs: vec![0.0; plan.rows_per_rank[d]],
            tokens_per_expert: plan.tokens_per_expert(d),
        })
        .collect();
    for (s, input) in src.iter().enumerate() {
        for t in 0..plan.tokens[s] {
            for k in 0..plan.topk {
                let Some((d, row)) = plan.dest(s, input.topk_idx, t, k) else {
                    continue;
                };
                let o = &mut out[d];
                o.rows[row * row_bytes..(row + 1) * row_bytes]
                    .copy_from_slice(&input.rows[t * row_bytes..(t + 1) * row_bytes]);
                o.scales[row * scales_per_row..(row + 1) * scales_per_row]
                    .copy_from_slice(&input.scales[t * scales_per_row..(t + 1) * scales_per_row]);
                o.probs[row] = input.probs[t * plan.topk + k];
            }
        }
    }
    out
}

/// Combine with unpermute: for each token of each rank, the f32 sum of its rows on their owners in
/// ascending global expert id, rounded to bf16 once. `rows[d]` is rank d's `[rows, hidden]`.
pub fn combine(
    plan: &PermutePlan,
    topk_idx: &[&[i32]],
    rows: &[&[bf16]],
    hidden: usize,
) -> Vec<Vec<bf16>> {
    (0..plan.ranks)
        .map(|s| {
            let mut y = vec![bf16::ZERO; plan.tokens[s] * hidden];
            let mut acc = vec![0f32; hidden];
            for t in 0..plan.tokens[s] {
                let mut slots: Vec<usize> = (0..plan.topk)
                    .filter(|&k| topk_idx[s][t * plan.topk + k] >= 0)
                    .collect();
                slots.sort_by_key(|&k| topk_idx[s][t * plan.topk + k]);
                acc.fill(0.0);
                for k in slots {
                    let (d, row) = plan.dest(s, topk_idx[s], t, k).expect("valid slot");
                    for (a, v) in acc
                        .iter_mut()
                        .zip(&rows[d][row * hidden..(row + 1) * hidden])
                    {
                        *a += v.to_f32();
                    }
                }
                for (o, a) in y[t * hidden..(t + 1) * hidden].iter_mut().zip(&acc) {
                    *o = bf16::from_f32(*a);
                }
            }
            y
        })
        .collect()
}

/// Dispatch's backward for probs: the gradient of each row's prob, read back to `[T, K]` on the
/// token's rank (0 for masked slots).
pub fn scatter_prob_grads(
    plan: &PermutePlan,
    topk_idx: &[&[i32]],
    row_grads: &[&[f32]],
) -> Vec<Vec<f32>> {
    (0..plan.ranks)
        .map(|s| {
            (0..plan.tokens[s] * plan.topk)
                .map(
                    |i| match plan.dest(s, topk_idx[s], i / plan.topk, i % plan.topk) {
                        Some((d, row)) => row_grads[d][row],
                        None => 0.0,
                    },
                )
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combine_of_dispatch_sums_each_token_once_per_valid_slot() {
        let idx = [vec![0, 3, 2, -1], vec![1, 2, 3, 0]];
        let refs: Vec<&[i32]> = idx.iter().map(|v| v.as_slice()).collect();
        let plan = PermutePlan::build(&refs, &[2, 2], 4, 2, 4).unwrap();
        let hidden = 2;
        let x: Vec<Vec<bf16>> = (0..2)
            .map(|s| {
                (0..4)
                    .map(|i| bf16::from_f32((s * 4 + i) as f32 + 0.5))
                    .collect()
            })
            .collect();
        let bytes: Vec<Vec<u8>> = x
            .iter()
            .map(|v| v.iter().flat_map(|b| b.to_bits().to_le_bytes()).collect())
            .collect();
        let probs = vec![1.0f32; 4];
        let src: Vec<SourceRows> = (0..2)
            .map(|s| SourceRows {
                topk_idx: &idx[s],
                rows: &bytes[s],
                scales: &[],
                probs: &probs,
            })
            .collect();
        let out = dispatch(&plan, hidden * 2, 0, &src);
        let rows: Vec<Vec<bf16>> = out
            .iter()
            .map(|o| {
                o.rows
                    .chunks_exact(2)
                    .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                    .collect()
            })
            .collect();
        let row_refs: Vec<&[bf16]> = rows.iter().map(|v| v.as_slice()).collect();
        let y = combine(&plan, &refs, &row_refs, hidden);
        // Rank 0 token 1 has one valid slot, every other token two.
        assert_eq!(y[0][2].to_f32(), x[0][2].to_f32());
        assert_eq!(y[0][0].to_f32(), 2.0 * x[0][0].to_f32());
        assert_eq!(y[1][3].to_f32(), 2.0 * x[1][3].to_f32());
        // Padding rows carry probability 0; real rows carry theirs.
        assert_eq!(out[0].probs.iter().filter(|&&p| p == 1.0).count(), 3);
    }
}
