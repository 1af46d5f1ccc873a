//! What the benchmarks share: a seeded generator of the keys they claim.

/// Length of every idempotency key, in bytes.
pub const KEY_LEN: usize = 40;
/// Visible ASCII, 64 symbols: six random bits pick one.
const KEY_ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// SplitMix64: tiny, fast, and good enough to draw keys.
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `0..n` (the modulo bias is irrelevant for `n` this small).
    pub fn below(&mut self, n: usize) -> usize {
        let n = u64::try_from(n).expect("usize fits u64");
        usize::try_from(self.next_u64() % n).expect("below n fits usize")
    }

    /// `len` visible-ASCII bytes.
    pub fn ascii(&mut self, len: usize) -> String {
        let mut out = String::with_capacity(len);
        while out.len() < len {
            let mut bits = self.next_u64();
            for _ in 0..10 {
                if out.len() == len {
                    break;
                }
                let six = usize::try_from(bits & 63).expect("six bits fit usize");
                out.push(char::from(KEY_ALPHABET[six]));
                bits >>= 6;
            }
        }
        out
    }
}

/// A seed for one (benchmark, round, thread): distinct inputs give unrelated streams, so a
/// later round never draws the keys an earlier one claimed.
pub fn derive_seed(base: u64, round: u64, thread: usize) -> u64 {
    let thread = u64::try_from(thread).expect("usize fits u64");
    let mut mix = SplitMix64::new(base ^ round.rotate_left(32) ^ thread.rotate_left(48));
    mix.next_u64()
}

/// A fresh directory on the real disk: Cargo's `CARGO_TARGET_TMPDIR` (`target/tmp`), or
/// `IDEMDB_BENCH_DIR`. `/tmp` or `/dev/shm` may be tmpfs, where an fsync costs nothing and a
/// comparison would be meaningless.
pub fn bench_dir(prefix: &str) -> tempfile::TempDir {
    let base = std::env::var_os("IDEMDB_BENCH_DIR").map_or_else(
        || std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")),
        std::path::PathBuf::from,
    );
    std::fs::create_dir_all(&base).expect("create the bench directory");
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(base)
        .expect("create a temporary directory")
}
