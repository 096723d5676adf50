//! Routings for the checks and the benchmark: uniform, Zipf-skewed, masked and uneven, from a
//! seed (a small xorshift generator: the data only has to be varied and reproducible).

/// Which routing a check or benchmark uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routing {
    /// Top-k of i.i.d. scores: every expert equally likely.
    Uniform,
    /// Expert popularity ∝ 1/(1+i)^1.1 over a seeded shuffle of the experts.
    Zipf,
    /// Uniform with about a quarter of the slots masked (−1), some tokens fully masked.
    Masked,
    /// Uniform with per-rank token counts from 0 to T (rank 0 always empty).
    Uneven,
}

impl Routing {
    pub const ALL: [Routing; 4] = [
        Routing::Uniform,
        Routing::Zipf,
        Routing::Masked,
        Routing::Uneven,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Routing::Uniform => "uniform",
            Routing::Zipf => "zipf",
            Routing::Masked => "masked",
            Routing::Uneven => "uneven",
        }
    }
}

pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Tokens per rank for a routing (T for all ranks except with `Uneven`).
pub fn tokens_per_rank(routing: Routing, ranks: usize, tokens: usize, seed: u64) -> Vec<usize> {
    let mut rng = Rng::new(seed ^ 0x7065);
    (0..ranks)
        .map(|r| match routing {
            Routing::Uneven if r == 0 => 0,
            Routing::Uneven => rng.below(tokens + 1),
            _ => tokens,
        })
        .collect()
}

/// `[tokens, topk]` expert ids for one rank: distinct per token, −1 for masked slots.
pub fn topk_idx(
    routing: Routing,
    tokens: usize,
    experts: usize,
    topk: usize,
    seed: u64,
) -> Vec<i32> {
    let mut rng = Rng::new(seed);
    let weights: Vec<f64> = match routing {
        Routing::Zipf => {
            let mut order: Vec<usize> = (0..experts).collect();
            let mut shuffle = Rng::new(0x5a1f);
            for i in (1..experts).rev() {
                order.swap(i, shuffle.below(i + 1));
            }
            let mut w = vec![0.0; experts];
            for (rank, &e) in order.iter().enumerate() {
                w[e] = 1.0 / (1.0 + rank as f64).powf(1.1);
            }
            w
        }
        _ => vec![1.0; experts],
    };
    let mut out = Vec::with_capacity(tokens * topk);
    for _ in 0..tokens {
        // Weighted sampling without replacement: the k smallest of -ln(u)/w.
        let mut keys: Vec<(f64, usize)> = (0..experts)
            .map(|e| (-(rng.unit().max(1e-300)).ln() / weights[e], e))
            .collect();
        keys.select_nth_unstable_by(topk - 1, |a, b| a.0.total_cmp(&b.0));
        let all_masked = routing == Routing::Masked && rng.below(16) == 0;
        for &(_, e) in &keys[..topk] {
            let masked = routing == Routing::Masked && (all_masked || rng.below(4) == 0);
            out.push(if masked { -1 } else { e as i32 });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::validate_topk;

    #[test]
    fn every_routing_is_valid_and_reproducible() {
        for r in Routing::ALL {
            let a = topk_idx(r, 200, 32, 6, 7);
            validate_topk("topk_idx", &a, 200, 6, 32).unwrap();
            assert_eq!(a, topk_idx(r, 200, 32, 6, 7));
        }
        let masked = topk_idx(Routing::Masked, 400, 32, 6, 1);
        let frac = masked.iter().filter(|&&e| e < 0).count() as f64 / masked.len() as f64;
        assert!(frac > 0.15 && frac < 0.45, "{frac}");
    }

    #[test]
    fn zipf_routing_is_skewed() {
        let idx = topk_idx(Routing::Zipf, 2000, 64, 4, 3);
        let mut counts = vec![0usize; 64];
        for &e in &idx {
            counts[e as usize] += 1;
        }
        counts.sort_unstable();
        assert!(counts[63] > 4 * counts[32].max(1), "{counts:?}");
    }

    #[test]
    fn uneven_routing_leaves_rank_zero_empty() {
        let t = tokens_per_rank(Routing::Uneven, 4, 100, 9);
        assert_eq!(t[0], 0);
        assert!(t.iter().all(|&n| n <= 100));
    }
}
