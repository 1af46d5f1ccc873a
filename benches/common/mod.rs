//! What the benchmarks share: the key length, the seeded generator they draw keys from, and
//! where their files go.

/// Length of every idempotency key, in bytes.
pub(crate) const KEY_LEN: usize = 40;
pub(crate) use idemdb::simulation::SplitMix64;

/// A fresh directory on the real disk: Cargo's `CARGO_TARGET_TMPDIR` (`target/tmp`), or
/// `IDEMDB_BENCH_DIR`. `/tmp` or `/dev/shm` may be tmpfs, where an fsync costs nothing and a
/// comparison would be meaningless.
pub(crate) fn bench_dir(prefix: &str) -> tempfile::TempDir {
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
