//! The seeded random numbers: every generated input, weight, test datum and simulated jitter is
//! a pure function of its seed through the functions here.
//!
//! Generated inputs use counter-based numbers ([`TokenRng`]): a value is a pure function of
//! (seed, token, stream, index), no generator state is carried from one token to the next, so
//! any subset of tokens (one rank's share of a global batch) is generated identically wherever
//! and in whatever order it is generated. Test data and benchmark inputs, made in one place in
//! one order, use the sequential [`SplitMix64`].

/// One independent use of the counter-based numbers; each has its own value space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum Stream {
    /// Activation values of a token, index = column.
    Activations = 0,
    /// Router scores of a token, index = expert.
    Scores = 1,
    /// Slot masks of a token, index = slot.
    Masks = 2,
    /// The expert popularity order of Zipf routing (not per token; token = 0).
    Popularity = 3,
    /// Uneven token counts (token = number of ranks, index = rank).
    TokenCounts = 4,
}

const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// The splitmix64 finalizer: a bijection of u64 with good avalanche.
pub fn splitmix64(z: u64) -> u64 {
    let mut z = z.wrapping_add(GOLDEN_GAMMA);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The "lowbias32" finalizer: a bijection of u32 with good avalanche, cheap enough for the
/// weights' per-element bits.
#[inline(always)]
pub fn mix32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^ (x >> 16)
}

/// A uniform number in [0, 1) from the top 53 of `bits`.
pub fn unit(bits: u64) -> f64 {
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// The sequential splitmix64 generator: the n-th number (from 0) is
/// splitmix64(seed + n·golden gamma).
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        let z = splitmix64(self.0);
        self.0 = self.0.wrapping_add(GOLDEN_GAMMA);
        z
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        unit(self.next_u64())
    }

    /// Uniform in 0..n.
    pub fn below(&mut self, n: usize) -> usize {
        (self.unit() * n as f64) as usize
    }
}

/// A xorshift64 generator (shifts 13, 7, 17); the runtime's quantization check draws its
/// input from it, so that check runs on the same data as always.
pub struct XorShift64(pub u64);

impl XorShift64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// The counter-based random numbers of one (seed, token, stream); `at(index)` is
/// splitmix64(splitmix64(splitmix64(splitmix64(seed) ^ token) ^ stream) ^ index).
/// Every step is a bijection, so distinct counters never share a value before the last mix.
#[derive(Clone, Copy, Debug)]
pub struct TokenRng {
    prefix: u64,
}

impl TokenRng {
    pub fn new(seed: u64, token: u64, stream: Stream) -> Self {
        TokenRng {
            prefix: splitmix64(splitmix64(splitmix64(seed) ^ token) ^ stream as u64),
        }
    }

    /// The 64 random bits of `index`.
    pub fn bits(&self, index: u64) -> u64 {
        splitmix64(self.prefix ^ index)
    }

    /// A uniform number in the open interval (0, 1) from the top 53 bits of `index`.
    pub fn unit(&self, index: u64) -> f64 {
        ((self.bits(index) >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64)
    }

    /// Fills `out` with standard normal numbers: Box-Muller on the uniforms of indices
    /// 2j and 2j+1 gives `out[2j]` (cosine branch) and `out[2j+1]` (sine branch).
    pub fn fill_gaussians(&self, out: &mut [f64]) {
        for (pair, chunk) in out.chunks_mut(2).enumerate() {
            let radius = (-2.0 * self.unit(2 * pair as u64).ln()).sqrt();
            let angle = std::f64::consts::TAU * self.unit(2 * pair as u64 + 1);
            chunk[0] = radius * angle.cos();
            if let Some(second) = chunk.get_mut(1) {
                *second = radius * angle.sin();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_and_tokens_give_different_numbers() {
        let a = TokenRng::new(7, 3, Stream::Scores).bits(0);
        assert_ne!(a, TokenRng::new(7, 4, Stream::Scores).bits(0));
        assert_ne!(a, TokenRng::new(7, 3, Stream::Masks).bits(0));
        assert_ne!(a, TokenRng::new(8, 3, Stream::Scores).bits(0));
        assert_eq!(a, TokenRng::new(7, 3, Stream::Scores).bits(0));
    }

    #[test]
    fn the_sequential_generator_is_splitmix64_of_the_counter() {
        let mut rng = SplitMix64::new(5);
        for n in 0..4u64 {
            assert_eq!(
                rng.next_u64(),
                splitmix64(5u64.wrapping_add(n.wrapping_mul(GOLDEN_GAMMA)))
            );
        }
        // The reference splitmix64 stream of seed 0 starts with this number.
        assert_eq!(SplitMix64::new(0).next_u64(), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn gaussians_have_unit_moments() {
        let mut values = vec![0.0; 100_001];
        TokenRng::new(1, 0, Stream::Activations).fill_gaussians(&mut values);
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n;
        let var = values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
        assert!(mean.abs() < 0.02, "mean {mean}");
        assert!((var - 1.0).abs() < 0.02, "variance {var}");
    }
}
