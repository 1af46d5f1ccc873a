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

/// One request of a bulk load: its scope, key, fingerprint and response body.
pub(crate) type Request = (idemdb::Scope, String, idemdb::Fingerprint, Vec<u8>);

/// Claims and completes (status 201) the new keys `request(i)` names for every `i` in `keys`,
/// `in_flight` at a time, through the async API on one thread: each commit carries thousands.
pub(crate) fn claim_and_complete(
    store: &idemdb::Store,
    keys: std::ops::Range<u64>,
    in_flight: usize,
    request: fn(u64) -> Request,
) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        for i in keys {
            if tasks.len() == in_flight {
                tasks.join_next().await.expect("a task").expect("no panic");
            }
            let store = store.clone();
            tasks.spawn(async move {
                let (scope, key, fingerprint, body) = request(i);
                let claim = store.claim_async(&scope, &key, fingerprint).await;
                let Ok(idemdb::Claim::Acquired(ticket)) = claim else {
                    panic!("a new key is acquired: {claim:?}")
                };
                store
                    .complete_async(ticket, idemdb::Response::new(201, body))
                    .await
                    .expect("complete");
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.expect("no panic");
        }
    });
}

/// The journal beside the store file at `path` (`<store file>-journal`).
pub(crate) fn journal_path(path: &std::path::Path) -> std::path::PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push("-journal");
    std::path::PathBuf::from(name)
}
