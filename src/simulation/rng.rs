//! SplitMix64: the one seeded generator idemdb's own tests, benchmarks, fuzz targets and
//! comparison harness draw from, so that a seed printed by any of them reproduces its run.

/// The SplitMix64 finaliser: a bijective 64-bit mix. Equal inputs give equal outputs; nearby
/// inputs give unrelated ones.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Visible ASCII, 64 symbols: six random bits pick one.
const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// SplitMix64 (Steele, Lea and Flood): small, fast, seedable, and good enough for test data,
/// schedules and keys. Not for anything an adversary sees.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator whose stream is fixed by `seed`.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    /// A generator for one (purpose, index) pair of a base seed, such as (round, thread):
    /// distinct inputs give unrelated streams.
    pub fn derive(base: u64, purpose: u64, index: u64) -> SplitMix64 {
        SplitMix64(mix(mix(mix(base) ^ purpose) ^ index))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }

    /// A value in `0..n` (the modulo bias is negligible for the small `n` tests use).
    ///
    /// # Panics
    /// If `n` is zero.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// An index in `0..n`, as [`SplitMix64::below`].
    ///
    /// # Panics
    /// If `n` is zero.
    pub fn index(&mut self, n: usize) -> usize {
        let n = u64::try_from(n).unwrap_or(u64::MAX);
        usize::try_from(self.below(n)).unwrap_or(usize::MAX)
    }

    /// `len` bytes of a 64-symbol visible-ASCII alphabet: valid idempotency keys.
    pub fn ascii(&mut self, len: usize) -> String {
        let mut out = String::with_capacity(len);
        while out.len() < len {
            let mut bits = self.next_u64();
            for _ in 0..10 {
                if out.len() == len {
                    break;
                }
                out.push(char::from(
                    ALPHABET[usize::try_from(bits & 63).unwrap_or(0)],
                ));
                bits >>= 6;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stream for seed 1234567, as computed independently (Python's exact integers).
    #[test]
    fn matches_the_reference_stream() {
        let mut r = SplitMix64::new(1_234_567);
        let got: Vec<u64> = (0..3).map(|_| r.next_u64()).collect();
        assert_eq!(
            got,
            [
                6_457_827_717_110_365_317,
                3_203_168_211_198_807_973,
                9_817_491_932_198_370_423
            ]
        );
    }

    #[test]
    fn ascii_is_a_valid_key() {
        let key = SplitMix64::new(7).ascii(40);
        assert_eq!(key.len(), 40);
        assert!(crate::validate_key(&key).is_ok());
    }

    #[test]
    fn derived_streams_differ() {
        let a = SplitMix64::derive(1, 0, 0).next_u64();
        let b = SplitMix64::derive(1, 0, 1).next_u64();
        let c = SplitMix64::derive(1, 1, 0).next_u64();
        assert!(a != b && b != c && a != c);
    }
}
