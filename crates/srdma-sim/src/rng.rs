//! The simulator's pseudo-random generator: xoshiro256** seeded through SplitMix64.
//!
//! Written here rather than taken from `rand` so that the stream of every seed is fixed by
//! this file alone: a failing seed printed by a test today reproduces after any dependency
//! upgrade. Not cryptographic.

/// One SplitMix64 step (Steele, Lea, Flood, OOPSLA 2014): advances `state` and returns 64
/// mixed bits. Used to expand a seed, never as the main generator.
pub(crate) fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// xoshiro256** (Blackman and Vigna, 2018): small, fast, and good enough for fault injection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// A generator whose state is four SplitMix64 outputs from `seed` (the authors'
    /// recommendation; it never yields the forbidden all-zero state in practice).
    pub fn new(seed: u64) -> Rng {
        let mut sm = seed;
        Rng {
            s: core::array::from_fn(|_| splitmix64(&mut sm)),
        }
    }

    /// A generator with a raw state, for checking against the reference implementation.
    pub const fn from_state(s: [u64; 4]) -> Rng {
        Rng { s }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// A uniform value in `0..n` (0 when `n` is 0), by Lemire's multiply-shift; the bias is at
    /// most `n / 2^64`, far below anything a test can observe.
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// A uniform value in `[0, 1)` with 53 bits of precision.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// True with probability `p`. Draws nothing when `p` is 0 or 1, so an impairment that is
    /// switched off does not shift the stream the other impairments see.
    pub fn chance(&mut self, p: f64) -> bool {
        if p <= 0.0 {
            false
        } else if p >= 1.0 {
            true
        } else {
            self.unit() < p
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_reference() {
        // First output of SplitMix64 from state 0 (reference C implementation).
        assert_eq!(splitmix64(&mut 0), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn xoshiro256starstar_reference() {
        // Reference C implementation from state {1, 2, 3, 4}.
        let mut r = Rng::from_state([1, 2, 3, 4]);
        let got: [u64; 4] = core::array::from_fn(|_| r.next_u64());
        assert_eq!(got, [11520, 0, 1_509_978_240, 1_215_971_899_390_074_240]);
    }

    #[test]
    fn below_and_chance_stay_in_range() {
        let mut r = Rng::new(7);
        assert_eq!(r.below(0), 0);
        assert!((0..1000).all(|_| r.below(10) < 10));
        assert!((0..1000).all(|_| (0.0..1.0).contains(&r.unit())));
        assert!(!r.chance(0.0) && r.chance(1.0) && !r.chance(f64::NAN));
    }
}
