//! A tiny deterministic PRNG, so the sans-IO crate can draw random key bytes without an OS
//! dependency. The engine seeds it from the OS RNG; tests seed it with a constant.
//!
//! SplitMix64 (Steele, Lea, Flood, "Fast splittable pseudorandom number generators",
//! OOPSLA 2014; the constants are those of `java.util.SplittableRandom`). It is not a
//! cryptographic generator: the 8-bit key it feeds is a guard against stale and guessed keys,
//! not a secret (IBTA keys are 32 bits on the wire and travel in clear text).

/// SplitMix64: 64 bits of state, one add and a mixing function per output.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator starting from `seed`; every seed, including 0, gives a full-period stream.
    pub const fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A random byte different from `avoid` (when given): the rxe rule for a re-used key slot
    /// (`rxe_get_next_key(last_key)` loops until the new key differs from the last one).
    pub fn next_key_byte(&mut self, avoid: Option<u8>) -> u8 {
        loop {
            // The top byte of the mixed output; eight tries per 64-bit draw would also do, but
            // a re-draw happens with probability 1/256 only.
            let b = (self.next_u64() >> 56) as u8;
            if Some(b) != avoid {
                return b;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_vector() {
        // First outputs of SplitMix64 seeded with 1234567 (reference values of the C
        // implementation by Vigna, prng.di.unimi.it/splitmix64.c).
        let mut r = SplitMix64::new(1_234_567);
        assert_eq!(r.next_u64(), 6_457_827_717_110_365_317);
        assert_eq!(r.next_u64(), 3_203_168_211_198_807_973);
        assert_eq!(r.next_u64(), 9_817_491_932_198_370_423);
    }

    #[test]
    fn key_byte_avoids_the_last_key() {
        let mut r = SplitMix64::new(7);
        for avoid in 0..=255u8 {
            for _ in 0..16 {
                assert_ne!(r.next_key_byte(Some(avoid)), avoid);
            }
        }
    }
}
