//! Where every dispatched row lands (SPEC §5), as pure Rust.
//!
//! On the rank that owns expert e, the rows of e form one segment; segments follow each other in
//! ascending local expert order, each padded to a multiple of `pad_multiple`. Inside a segment the
//! rows are ordered by (source rank, token index). So the row of (source s, token t, expert e) is
//!
//! `seg_base[e] + Σ_{s' < s} counts[s'][e] + pos_s[t, k]`
//!
//! where `pos_s[t, k]` is the number of tokens before t on rank s that are routed to e. The GPU
//! computes exactly these quantities: each rank derives `counts[s][·]` and `pos_s` from its own
//! `topk_idx` (a stable per-expert scan), the count rows are exchanged, and every rank then
//! derives `seg_base` and the source prefixes from the same count matrix, so all ranks agree on
//! every offset without another round trip.

use megamoe_core::{Error, Result};

/// Checks one rank's `topk_idx` (`[tokens, topk]`): every entry in `[0, experts)` or −1, no
/// expert named twice by one token.
pub fn validate_topk(
    arg: &'static str,
    topk_idx: &[i32],
    tokens: usize,
    topk: usize,
    experts: usize,
) -> Result<()> {
    if topk_idx.len() != tokens * topk {
        return Err(Error::Length {
            arg,
            got: topk_idx.len(),
            expected: tokens * topk,
        });
    }
    for (row, slots) in topk_idx.chunks_exact(topk.max(1)).enumerate() {
        for (slot, &e) in slots.iter().enumerate() {
            if e < -1 || e >= experts as i32 {
                return Err(Error::ExpertOutOfRange {
                    arg,
                    row,
                    slot,
                    value: e as i64,
                    experts,
                });
            }
            if e >= 0 {
                if let Some(first) = slots[..slot].iter().position(|&f| f == e) {
                    return Err(Error::DuplicateExpert {
                        arg,
                        row,
                        expert: e as usize,
                        first,
                        second: slot,
                    });
                }
            }
        }
    }
    Ok(())
}

/// Rounds `n` up to a multiple of `m` (m ≥ 1).
pub fn pad_to(n: usize, m: usize) -> usize {
    n.div_ceil(m) * m
}

/// The permuted layout of one dispatch over every rank of the world.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PermutePlan {
    pub ranks: usize,
    pub experts: usize,
    pub topk: usize,
    pub pad_multiple: usize,
    /// Tokens on each rank, `[R]`.
    pub tokens: Vec<usize>,
    /// Tokens of source rank s routed to expert e, `[R][E]`.
    pub counts: Vec<u32>,
    /// Per source rank, `[T_s][K]`: index of token t among rank s's tokens routed to the expert
    /// of slot k (−1 for a masked slot).
    pub pos: Vec<Vec<i32>>,
    /// Padded rows of each expert's segment, `[E]`.
    pub padded: Vec<u32>,
    /// First row of source s's run inside expert e's segment on e's owner, `[R][E]`.
    pub src_base: Vec<u32>,
    /// Rows (padding included) each rank receives, `[R]`.
    pub rows_per_rank: Vec<usize>,
}

impl PermutePlan {
    /// Builds the plan from every rank's `topk_idx` (rank 0 first); validates each first.
    pub fn build(
        topk_idx: &[&[i32]],
        tokens: &[usize],
        experts: usize,
        topk: usize,
        pad_multiple: usize,
    ) -> Result<Self> {
        let ranks = topk_idx.len();
        if ranks == 0 || experts % ranks != 0 {
            return Err(Error::Shape {
                arg: "ranks",
                reason: format!("{experts} experts do not split evenly over {ranks} ranks"),
            });
        }
        if pad_multiple == 0 {
            return Err(Error::Value {
                arg: "pad_multiple",
                value: "0".into(),
                reason: "must be at least 1".into(),
            });
        }
        for (idx, &t) in topk_idx.iter().zip(tokens) {
            validate_topk("topk_idx", idx, t, topk, experts)?;
        }
        let mut counts = vec![0u32; ranks * experts];
        let mut pos = Vec::with_capacity(ranks);
        for (s, idx) in topk_idx.iter().enumerate() {
            let row = &mut counts[s * experts..(s + 1) * experts];
            pos.push(
                idx.iter()
                    .map(|&e| {
                        if e < 0 {
                            return -1;
                        }
                        let p = row[e as usize];
                        row[e as usize] += 1;
                        p as i32
                    })
                    .collect(),
            );
        }
        let local = experts / ranks;
        let mut padded = vec![0u32; experts];
        let mut src_base = vec![0u32; ranks * experts];
        let mut rows_per_rank = vec![0usize; ranks];
        for (owner, rows) in rows_per_rank.iter_mut().enumerate() {
            for e in owner * local..(owner + 1) * local {
                let mut base = *rows as u32;
                for s in 0..ranks {
                    src_base[s * experts + e] = base;
                    base += counts[s * experts + e];
                }
                let total = base as usize - *rows;
                padded[e] = pad_to(total, pad_multiple) as u32;
                *rows += padded[e] as usize;
            }
        }
        Ok(PermutePlan {
            ranks,
            experts,
            topk,
            pad_multiple,
            tokens: tokens.to_vec(),
            counts,
            pos,
            padded,
            src_base,
            rows_per_rank,
        })
    }

    pub fn local_experts(&self) -> usize {
        self.experts / self.ranks
    }

    /// Tokens of every source routed to expert e (before padding).
    pub fn expert_rows(&self, e: usize) -> u32 {
        (0..self.ranks)
            .map(|s| self.counts[s * self.experts + e])
            .sum()
    }

    /// First row of expert e's segment on its owner.
    pub fn seg_base(&self, e: usize) -> u32 {
        self.src_base[e]
    }

    /// (owner rank, row on the owner) of source s's slot (t, k), or None for a masked slot.
    pub fn dest(&self, s: usize, topk_idx: &[i32], t: usize, k: usize) -> Option<(usize, usize)> {
        let e = topk_idx[t * self.topk + k];
        if e < 0 {
            return None;
        }
        let e = e as usize;
        let row =
            self.src_base[s * self.experts + e] as usize + self.pos[s][t * self.topk + k] as usize;
        Some((e / self.local_experts(), row))
    }

    /// Padded rows of each local expert of `rank`, ascending.
    pub fn tokens_per_expert(&self, rank: usize) -> Vec<u32> {
        let l = self.local_experts();
        self.padded[rank * l..(rank + 1) * l].to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(idx: &[Vec<i32>], experts: usize, topk: usize, pad: usize) -> PermutePlan {
        let refs: Vec<&[i32]> = idx.iter().map(|v| v.as_slice()).collect();
        let tokens: Vec<usize> = idx.iter().map(|v| v.len() / topk).collect();
        PermutePlan::build(&refs, &tokens, experts, topk, pad).unwrap()
    }

    #[test]
    fn rows_are_grouped_by_expert_then_source_then_token_and_padded() {
        // 2 ranks, 4 experts (2 per rank), top-2.
        let r0 = vec![0, 2, 3, 0, -1, -1];
        let r1 = vec![1, 0, 2, 3];
        let p = plan(&[r0.clone(), r1.clone()], 4, 2, 4);
        // Rank 0 owns experts 0 and 1: expert 0 gets (r0,t0), (r0,t1), (r1,t0); padded to 4.
        assert_eq!(p.dest(0, &r0, 0, 0), Some((0, 0)));
        assert_eq!(p.dest(0, &r0, 1, 1), Some((0, 1)));
        assert_eq!(p.dest(1, &r1, 0, 1), Some((0, 2)));
        // Expert 1 starts after expert 0's padded segment.
        assert_eq!(p.dest(1, &r1, 0, 0), Some((0, 4)));
        // Rank 1: expert 2 gets (r0,t0), (r1,t1); expert 3 gets (r0,t1), (r1,t1).
        assert_eq!(p.dest(0, &r0, 0, 1), Some((1, 0)));
        assert_eq!(p.dest(1, &r1, 1, 0), Some((1, 1)));
        assert_eq!(p.dest(0, &r0, 1, 0), Some((1, 4)));
        assert_eq!(p.dest(1, &r1, 1, 1), Some((1, 5)));
        assert_eq!(p.dest(0, &r0, 2, 0), None);
        assert_eq!(p.tokens_per_expert(0), vec![4, 4]);
        assert_eq!(p.rows_per_rank, vec![8, 8]);
    }

    #[test]
    fn every_row_of_a_rank_is_used_once_and_the_rest_is_padding() {
        let idx = vec![
            vec![3, 1, 0, 2, 5, 7, 6, 4, -1, -1],
            vec![7, 6, 0, 1, 2, 3],
            vec![],
            vec![4, 5, 5, 4, 1, -1],
        ];
        for pad in [1, 3, 16] {
            let p = plan(&idx, 8, 2, pad);
            let mut used: Vec<Vec<bool>> =
                p.rows_per_rank.iter().map(|&n| vec![false; n]).collect();
            for (s, v) in idx.iter().enumerate() {
                for t in 0..v.len() / 2 {
                    for k in 0..2 {
                        if let Some((d, row)) = p.dest(s, v, t, k) {
                            assert!(!used[d][row], "row {row} on rank {d} used twice");
                            used[d][row] = true;
                        }
                    }
                }
            }
            let valid: usize = idx.iter().flatten().filter(|&&e| e >= 0).count();
            let used_rows: usize = used.iter().flatten().filter(|&&u| u).count();
            assert_eq!(used_rows, valid);
            for e in 0..8 {
                assert_eq!(p.padded[e] as usize, pad_to(p.expert_rows(e) as usize, pad));
            }
        }
    }

    #[test]
    fn out_of_range_and_duplicate_experts_are_rejected_naming_the_argument() {
        let err = validate_topk("topk_idx", &[0, 8], 1, 2, 8).unwrap_err();
        assert!(matches!(
            err,
            Error::ExpertOutOfRange {
                arg: "topk_idx",
                row: 0,
                slot: 1,
                ..
            }
        ));
        let err = validate_topk("topk_idx", &[0, -2], 1, 2, 8).unwrap_err();
        assert!(matches!(err, Error::ExpertOutOfRange { slot: 1, .. }));
        let err = validate_topk("topk_idx", &[1, 2, 3, 3], 2, 2, 8).unwrap_err();
        assert!(matches!(
            err,
            Error::DuplicateExpert {
                row: 1,
                expert: 3,
                ..
            }
        ));
        validate_topk("topk_idx", &[-1, -1], 1, 2, 8).unwrap();
    }
}
