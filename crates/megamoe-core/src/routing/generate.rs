//! Seeded generation of the inputs of an expert-parallel world (SPEC §2, §8 routings).

use half::bf16;
use rayon::prelude::*;
use serde::Serialize;

use crate::batch::{RankInputs, WorldInputs};
use crate::error::{Error, Result};
use crate::preset::{Preset, Shape};
use crate::rng::{SplitMix64, Stream, TokenRng};

/// How tokens choose their experts.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub enum RoutingKind {
    /// Top-k of standard normal scores over all experts: every expert equally popular.
    Uniform,
    /// Skewed popularity: the expert at position p (0-based) of a seeded permutation of the
    /// experts gets the Zipf log-popularity bias −exponent·ln(p + 1) added to its normal score
    /// before the top-k, so position 0 is the most chosen expert.
    Zipf { exponent: f64 },
}

/// Everything that decides a generated world besides its shape and size.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct RoutingSpec {
    pub kind: RoutingKind,
    /// Probability F in [0, 1] that a slot is masked (−1), drawn independently per slot.
    pub masked_ratio: f64,
    /// When set, rank r gets a seeded share of the R·T global tokens (some ranks may get 0);
    /// otherwise every rank gets T.
    pub uneven_tokens: bool,
    pub seed: u64,
}

impl Default for RoutingSpec {
    fn default() -> Self {
        RoutingSpec {
            kind: RoutingKind::Uniform,
            masked_ratio: 0.0,
            uneven_tokens: false,
            seed: 0,
        }
    }
}

impl RoutingSpec {
    /// Checks the masked ratio and the Zipf exponent, naming the argument.
    pub fn validate(&self) -> Result<()> {
        if !(0.0..=1.0).contains(&self.masked_ratio) {
            return Err(Error::Value {
                arg: "masked_ratio",
                value: self.masked_ratio.to_string(),
                reason: "must be in [0, 1]".into(),
            });
        }
        if let RoutingKind::Zipf { exponent } = self.kind {
            if !(exponent.is_finite() && exponent >= 0.0) {
                return Err(Error::Value {
                    arg: "exponent",
                    value: exponent.to_string(),
                    reason: "the Zipf exponent must be finite and non-negative".into(),
                });
            }
        }
        Ok(())
    }
}

/// Generates the inputs of `ranks` ranks holding `ranks · tokens_per_rank` global tokens.
///
/// Every value of global token g (its x row, scores, masks, weights) is a pure function of
/// (seed, g), so the same global batch split over any number of ranks is the same data: the
/// ranks concatenated in order give the same token stream. See [`generate_rank`] for the
/// per-token rules and [`token_counts`] for the split.
pub fn generate_world(
    shape: Shape,
    ranks: usize,
    tokens_per_rank: usize,
    spec: &RoutingSpec,
) -> Result<WorldInputs> {
    shape.validate(ranks)?;
    spec.validate()?;
    let mut first_global_token = 0;
    let mut inputs = Vec::with_capacity(ranks);
    for tokens in token_counts(ranks, tokens_per_rank, spec) {
        inputs.push(generate_rank(shape, first_global_token, tokens, spec)?);
        first_global_token += tokens;
    }
    Ok(WorldInputs {
        shape,
        ranks: inputs,
    })
}

/// The setups `megamoe soak` draws its batches for (name, shape, R, T_max), in its order:
/// tiny-like and small flash-like shapes, R = 1 … 8.
pub fn soak_setups() -> Vec<(&'static str, Shape, usize, usize)> {
    let tiny = Preset::by_name("tiny").expect("the tiny preset").shape;
    let flash_like = Shape {
        hidden: 1024,
        inter: 512,
        experts: 32,
        topk: 6,
    };
    vec![
        ("tiny", tiny, 1, 96),
        ("tiny", tiny, 2, 64),
        ("tiny", tiny, 4, 48),
        ("tiny", tiny, 8, 32),
        ("flash-like H=1024 I=512 E=32", flash_like, 2, 128),
        ("flash-like H=1024 I=512 E=32", flash_like, 4, 64),
    ]
}

/// One random batch of `megamoe soak`, drawn from `rng` in this order: the routing seed; the
/// routing (uniform, Zipf 0.5–1.5, masked 0.2–0.8 or every slot masked, a quarter each); per
/// rank T (0 with probability 1/4, else uniform in 1..=t_max; the rank keeps the first T of
/// its t_max generated tokens); the bound (None, or between the largest T and t_max, half
/// each). Returns the world, the bound and a label naming the routing, its seed, T and the
/// bound.
pub fn soak_batch(
    shape: Shape,
    ranks: usize,
    t_max: usize,
    rng: &mut SplitMix64,
) -> Result<(WorldInputs, Option<usize>, String)> {
    let mut routing = RoutingSpec {
        seed: rng.next_u64(),
        ..RoutingSpec::default()
    };
    let label = match rng.below(4) {
        0 => "uniform".to_string(),
        1 => {
            let exponent = 0.5 + rng.unit();
            routing.kind = RoutingKind::Zipf { exponent };
            format!("zipf {exponent:.2}")
        }
        2 => {
            routing.masked_ratio = 0.2 + 0.6 * rng.unit();
            format!("masked {:.2}", routing.masked_ratio)
        }
        _ => {
            routing.masked_ratio = 1.0;
            "every slot masked".to_string()
        }
    };
    let mut world = generate_world(shape, ranks, t_max, &routing)?;
    let (h, k) = (shape.hidden, shape.topk);
    for r in &mut world.ranks {
        let t = if rng.below(4) == 0 {
            0
        } else {
            1 + rng.below(t_max)
        };
        r.tokens = t;
        r.x.truncate(t * h);
        r.topk_idx.truncate(t * k);
        r.topk_weights.truncate(t * k);
    }
    let largest = world.ranks.iter().map(|r| r.tokens).max().unwrap_or(0);
    let bound = (rng.below(2) == 0).then(|| largest + rng.below(t_max - largest + 1));
    let tokens: Vec<usize> = world.ranks.iter().map(|r| r.tokens).collect();
    let label = format!(
        "{label}, routing seed {:#x}, T {tokens:?}, bound {bound:?}",
        routing.seed
    );
    Ok((world, bound, label))
}

/// Tokens of each rank: `tokens_per_rank` each, or with `uneven_tokens` a seeded split of the
/// same total. The uneven split draws per rank u (uniform in (0, 1), counter (seed, R, rank));
/// its weight is 0 when u < 1/4 (the rank gets no tokens) and u otherwise (rank 0 gets weight
/// 1 if all are 0); rank r gets the tokens between ⌊total·W<r/W⌋ and ⌊total·W≤r/W⌋.
pub fn token_counts(ranks: usize, tokens_per_rank: usize, spec: &RoutingSpec) -> Vec<usize> {
    if !spec.uneven_tokens {
        return vec![tokens_per_rank; ranks];
    }
    let rng = TokenRng::new(spec.seed, ranks as u64, Stream::TokenCounts);
    let mut weights: Vec<f64> = (0..ranks as u64)
        .map(|r| rng.unit(r))
        .map(|u| if u < 0.25 { 0.0 } else { u })
        .collect();
    if weights.iter().all(|&w| w == 0.0) {
        weights[0] = 1.0;
    }
    let total_weight: f64 = weights.iter().sum();
    let total = ranks * tokens_per_rank;
    let mut prefix_weight = 0.0;
    let mut start = 0;
    weights
        .iter()
        .enumerate()
        .map(|(r, w)| {
            prefix_weight += w;
            let end = if r + 1 == ranks {
                total
            } else {
                ((total as f64 * prefix_weight / total_weight).floor() as usize).min(total)
            };
            let count = end - start;
            start = end;
            count
        })
        .collect()
}

/// Generates global tokens `first_global_token ..` `+ tokens` as one rank's inputs.
///
/// Per global token g:
/// - x[g, c] = bf16(z) with z standard normal (stream Activations, pairs of columns share one
///   Box-Muller draw);
/// - `score[e]` = standard normal (stream Scores) plus the Zipf bias of [`RoutingKind::Zipf`];
/// - topk_idx = the K highest scores in descending score order (ties: lower expert first);
/// - topk_weights = softmax over those K scores (computed in f64, rounded to f32), kept also
///   for slots that are masked afterwards (masked weights are never read);
/// - slot k is masked (−1) when the uniform of (seed, g, Masks, k) is below `masked_ratio`.
pub fn generate_rank(
    shape: Shape,
    first_global_token: usize,
    tokens: usize,
    spec: &RoutingSpec,
) -> Result<RankInputs> {
    shape.validate(1)?;
    spec.validate()?;
    let (hidden, topk) = (shape.hidden, shape.topk);
    let bias = popularity_bias(shape.experts, spec);
    let mut x = vec![bf16::ZERO; tokens * hidden];
    let mut topk_idx = vec![0i32; tokens * topk];
    let mut topk_weights = vec![0f32; tokens * topk];
    x.par_chunks_mut(hidden)
        .zip(topk_idx.par_chunks_mut(topk))
        .zip(topk_weights.par_chunks_mut(topk))
        .enumerate()
        .for_each_init(
            || (vec![0.0; hidden], vec![0.0; shape.experts]),
            |(row, scores), (t, ((x_row, idx_row), weight_row))| {
                let token = (first_global_token + t) as u64;
                TokenRng::new(spec.seed, token, Stream::Activations).fill_gaussians(row);
                for (out, z) in x_row.iter_mut().zip(row.iter()) {
                    *out = bf16::from_f32(*z as f32);
                }
                TokenRng::new(spec.seed, token, Stream::Scores).fill_gaussians(scores);
                for (s, b) in scores.iter_mut().zip(&bias) {
                    *s += b;
                }
                route_token(scores, spec, token, idx_row, weight_row);
            },
        );
    Ok(RankInputs {
        tokens,
        first_global_token,
        x,
        topk_idx,
        topk_weights,
    })
}

/// The per-expert score bias of the routing kind (all zero for uniform routing).
fn popularity_bias(experts: usize, spec: &RoutingSpec) -> Vec<f64> {
    let RoutingKind::Zipf { exponent } = spec.kind else {
        return vec![0.0; experts];
    };
    // Fisher-Yates with counter-based draws: order[p] is the expert at popularity position p.
    let rng = TokenRng::new(spec.seed, 0, Stream::Popularity);
    let mut order: Vec<usize> = (0..experts).collect();
    for i in (1..experts).rev() {
        let j = (rng.bits(i as u64) % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    let mut bias = vec![0.0; experts];
    for (position, &expert) in order.iter().enumerate() {
        bias[expert] = -exponent * ((position + 1) as f64).ln();
    }
    bias
}

/// Top-k, softmax weights and masks of one token from its (biased) scores.
fn route_token(
    scores: &[f64],
    spec: &RoutingSpec,
    token: u64,
    idx_row: &mut [i32],
    weight_row: &mut [f32],
) {
    let topk = idx_row.len();
    let mut ranked: Vec<usize> = (0..scores.len()).collect();
    let by_score_desc = |a: &usize, b: &usize| scores[*b].total_cmp(&scores[*a]).then(a.cmp(b));
    if topk < ranked.len() {
        ranked.select_nth_unstable_by(topk - 1, by_score_desc);
    }
    ranked.truncate(topk);
    ranked.sort_by(by_score_desc);

    let max_score = scores[ranked[0]];
    let exps: Vec<f64> = ranked
        .iter()
        .map(|&e| (scores[e] - max_score).exp())
        .collect();
    let sum: f64 = exps.iter().sum();
    let masks = TokenRng::new(spec.seed, token, Stream::Masks);
    for (k, &expert) in ranked.iter().enumerate() {
        let masked = masks.unit(k as u64) < spec.masked_ratio;
        idx_row[k] = if masked { -1 } else { expert as i32 };
        weight_row[k] = (exps[k] / sum) as f32;
    }
}
