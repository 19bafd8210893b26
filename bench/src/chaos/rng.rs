//! The harness's one source of randomness: SplitMix64, seeded by `--seed`,
//! so that the same seed draws the same fault schedule; slow answers are a
//! [`hash`] of the seed and the request (the processes' timing, and the
//! run ids the engines mint, still vary from run to run).

/// A SplitMix64 generator (Steele, Lea and Flood, 2014): small, fast and
/// good enough to pick faults; not for anything secret.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator starting at `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.state)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        // Multiply-shift: unbiased enough for n far below 2^64.
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// A number in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        if high <= low {
            return low;
        }
        low + self.below(high - low + 1)
    }

    /// True with probability `p` (0.0..=1.0).
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1_u64 << 53) as f64 <= p && p > 0.0
    }

    /// An index drawn with the given weights (the last index when they are
    /// all zero).
    pub fn weighted(&mut self, weights: &[u64]) -> usize {
        let total: u64 = weights.iter().sum();
        let mut pick = self.below(total);
        for (i, w) in weights.iter().enumerate() {
            if pick < *w {
                return i;
            }
            pick -= w;
        }
        weights.len().saturating_sub(1)
    }
}

/// SplitMix64's finaliser: a well-mixed hash of one word, also used to
/// derive per-request decisions from the seed without shared state.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A hash of `seed` and `text` (FNV-1a, then [`mix`]): the same inputs give
/// the same value in every process and on every run.
pub fn hash(seed: u64, text: &str) -> u64 {
    let mut h = 0xCBF2_9CE4_8422_2325_u64 ^ seed;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    mix(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_draws_the_same_numbers_and_another_seed_others() {
        let draw = |seed| {
            let mut rng = Rng::new(seed);
            (0..8).map(|_| rng.below(1000)).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }

    #[test]
    fn draws_stay_in_their_ranges_and_weights_are_followed() {
        let mut rng = Rng::new(1);
        let mut seen = [0_u32; 3];
        for _ in 0..3000 {
            let n = rng.between(5, 7);
            assert!((5..=7).contains(&n), "{n}");
            seen[rng.weighted(&[0, 1, 3])] += 1;
        }
        assert_eq!(seen[0], 0, "a zero weight is never drawn");
        assert!(seen[2] > 2 * seen[1], "{seen:?}");
        assert!(!rng.chance(0.0));
        assert!(rng.chance(1.0));
        assert_eq!(hash(3, "a/b"), hash(3, "a/b"));
        assert_ne!(hash(3, "a/b"), hash(4, "a/b"));
    }
}
