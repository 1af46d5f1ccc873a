//! Claim benchmarks: what a durable claim costs in idemdb, next to a naive redb baseline.
//!
//! Run with `cargo bench --bench claim` (a few minutes; add a filter such as
//! `cargo bench --bench claim -- claim_throughput` to run one group).
//!
//! Each group asks one question:
//!
//! - `claim_latency_1_thread`: how long one new-key claim takes on a single thread, for idemdb
//!   and for `naive_redb`: a plain redb database that, per claim, opens one write transaction,
//!   `get`s the key, `insert`s a ~100-byte value if it is absent, and commits with redb's
//!   default (`Immediate`) durability. Both pay one fsync per claim here; the ratio is
//!   idemdb's overhead over "just redb".
//! - `claim_throughput`: new-key claims per second with 1, 4, 16 and 64 threads. idemdb
//!   group-commits concurrent claims (one journal entry and one fsync per batch); the naive
//!   baseline serialises one fsync per claim, whatever the thread count. `idemdb_no_journal` is
//!   idemdb with `journal_size(0)`: each batch a durable redb commit, as before the journal.
//! - `decisions`: the answers that change nothing (replay, in progress, mismatch) on one
//!   thread. idemdb decides them from its in-memory index (a replay also reads the response
//!   from the file) and never fsyncs; `naive_redb/existing_key` is what the baseline does for
//!   any existing key: a write transaction that finds the key, and commits.
//! - `claim_complete_cycle`: the whole life of a request, claim then complete with a
//!   ~200-byte response, on 1 and on 16 threads (two durable writes per request).
//!
//! After each idemdb benchmark the number of commits (fsyncs) it made is printed to stderr, so
//! the group-commit batch size can be read next to the figures.
//!
//! Files live in a fresh `tempfile::TempDir` per benchmark under Cargo's `CARGO_TARGET_TMPDIR`
//! (`target/tmp`, on the same disk as the build; `/tmp` or `/dev/shm` may be tmpfs, where an
//! fsync costs nothing and the comparison would be meaningless). Set `IDEMDB_BENCH_DIR` to
//! measure another disk. Keys are 40 random visible-ASCII bytes spread over a few tenants,
//! drawn from fixed seeds, so every run claims the same keys.
//!
//! With features `metrics` and `tracing` (`cargo bench --features metrics,tracing --bench
//! claim`), the process observes as a production one would: a Prometheus recorder is installed
//! before the first store opens (its upkeep runs every 5 s, as the exporter's own listener
//! would run it), and a subscriber at INFO, under which idemdb's spans (DEBUG) are disabled by
//! level. Without the features, nothing is observed: the two runs, side by side, are the cost
//! of observing (`docs/performance.md`, "Observability cost").
//!
//! Absolute figures depend on the disk's fsync latency far more than on the code, and vary
//! from run to run and machine to machine: read the idemdb/naive ratios within one run, never
//! across runs.

use criterion::{criterion_main, BatchSize, BenchmarkId, Criterion, SamplingMode, Throughput};
use idemdb::{Claim, Fingerprint, Response, Scope, Stats, Store};
use redb::{ReadableTable, TableDefinition};
use std::sync::Barrier;
use std::time::{Duration, Instant};
use tempfile::TempDir;

#[allow(dead_code)] // shared with the other benches, which use all of it
mod common;
use common::{SplitMix64, KEY_LEN};

/// Distinct tenants the keys are spread over.
const TENANTS: usize = 4;
const ENDPOINT: &str = "POST /v1/payments";
/// Size of the value the naive baseline stores per claim (idemdb's in-progress record is ~65).
const NAIVE_VALUE_LEN: usize = 100;
/// Size of the response body completed in `claim_complete_cycle`.
const RESPONSE_LEN: usize = 200;
const THROUGHPUT_THREADS: [usize; 4] = [1, 4, 16, 64];
const CYCLE_THREADS: [usize; 2] = [1, 16];

const SEED_LATENCY: u64 = 0x1de3_db00_0000_0001;
const SEED_THROUGHPUT: u64 = 0x1de3_db00_0000_0002;
const SEED_DECISIONS: u64 = 0x1de3_db00_0000_0003;
const SEED_CYCLE: u64 = 0x1de3_db00_0000_0004;

/// The naive baseline's only table: key -> value.
const NAIVE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("naive");

/// One request: which tenant, which key, and the same key as the naive baseline names it.
struct Request {
    tenant: usize,
    key: String,
    naive_key: Vec<u8>,
}

/// The scopes and request fingerprint every benchmark shares.
struct Workload {
    scopes: Vec<Scope>,
    fingerprint: Fingerprint,
    response_body: Vec<u8>,
}

impl Workload {
    fn new() -> Self {
        let mut rng = SplitMix64::new(0x5eed);
        Workload {
            scopes: (0..TENANTS)
                .map(|t| Scope::new(format!("tenant_{t:04}"), ENDPOINT))
                .collect(),
            fingerprint: Fingerprint::of(br#"{"amount":5000,"currency":"usd","customer":"cus_1"}"#),
            response_body: rng.ascii(RESPONSE_LEN).into_bytes(),
        }
    }

    /// A new request with a fresh random key.
    fn request(&self, rng: &mut SplitMix64) -> Request {
        let tenant = rng.index(TENANTS);
        let key = rng.ascii(KEY_LEN);
        let scope = &self.scopes[tenant];
        let mut naive_key = Vec::with_capacity(scope.tenant().len() + ENDPOINT.len() + KEY_LEN + 2);
        naive_key.extend_from_slice(scope.tenant().as_bytes());
        naive_key.push(b'/');
        naive_key.extend_from_slice(ENDPOINT.as_bytes());
        naive_key.push(b'/');
        naive_key.extend_from_slice(key.as_bytes());
        Request {
            tenant,
            key,
            naive_key,
        }
    }

    fn response(&self) -> Response {
        Response::new(201, self.response_body.clone())
            .with_header("content-type", "application/json")
    }
}

/// Installs what a production process observes with, once, when the features are on.
fn observe() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        #[cfg(feature = "metrics")]
        {
            let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
                .install_recorder()
                .expect("install the Prometheus recorder");
            std::thread::spawn(move || loop {
                std::thread::sleep(Duration::from_secs(5));
                handle.run_upkeep();
            });
        }
        #[cfg(feature = "tracing")]
        tracing::subscriber::set_global_default(info::Subscriber)
            .expect("install the tracing subscriber");
    });
}

/// A subscriber at INFO, as in production: idemdb's spans (DEBUG) are disabled by level, so
/// each costs a level check. What it would do with an enabled event (format and write it) is
/// not measured: none fires in these benchmarks but a checkpoint's, at DEBUG.
#[cfg(feature = "tracing")]
mod info {
    use tracing::level_filters::LevelFilter;
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Level, Metadata};

    pub(crate) struct Subscriber;

    impl tracing::Subscriber for Subscriber {
        fn enabled(&self, metadata: &Metadata<'_>) -> bool {
            *metadata.level() <= Level::INFO
        }

        fn max_level_hint(&self) -> Option<LevelFilter> {
            Some(LevelFilter::INFO)
        }

        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }

        fn record(&self, _: &Id, _: &Record<'_>) {}

        fn record_follows_from(&self, _: &Id, _: &Id) {}

        fn event(&self, _: &Event<'_>) {}

        fn enter(&self, _: &Id) {}

        fn exit(&self, _: &Id) {}
    }
}

fn bench_dir() -> TempDir {
    common::bench_dir("idemdb-bench-")
}

/// An idemdb store in its own directory; the store closes before the directory goes.
struct IdemBench {
    store: Store,
    _dir: TempDir,
}

impl IdemBench {
    fn open() -> Self {
        Self::open_with(Store::builder())
    }

    fn open_with(builder: idemdb::StoreBuilder) -> Self {
        observe();
        let dir = bench_dir();
        let store = builder
            .open(dir.path().join("bench.idem"))
            .expect("open idemdb");
        IdemBench { store, _dir: dir }
    }

    /// Claims a new key; panics unless it is acquired. The ticket is dropped by the caller.
    fn claim_new(&self, w: &Workload, req: &Request) -> Claim {
        let claim = self
            .store
            .claim(&w.scopes[req.tenant], &req.key, w.fingerprint)
            .expect("claim");
        assert!(matches!(claim, Claim::Acquired(_)), "new key: {claim:?}");
        claim
    }

    /// Claims a new key and completes it.
    fn cycle(&self, w: &Workload, req: &Request) {
        let Claim::Acquired(ticket) = self.claim_new(w, req) else {
            unreachable!()
        };
        self.store.complete(ticket, w.response()).expect("complete");
    }
}

/// The baseline: one plain redb write transaction, with default durability, per operation.
struct NaiveRedb {
    db: redb::Database,
    value: Vec<u8>,
    _dir: TempDir,
}

impl NaiveRedb {
    fn open() -> Self {
        let dir = bench_dir();
        let db = redb::Database::create(dir.path().join("naive.redb")).expect("create redb");
        let txn = db.begin_write().expect("begin_write");
        txn.open_table(NAIVE).expect("create the table");
        txn.commit().expect("commit");
        let value = SplitMix64::new(0xba5e).ascii(NAIVE_VALUE_LEN).into_bytes();
        NaiveRedb {
            db,
            value,
            _dir: dir,
        }
    }

    /// The naive claim: `None` if the key was absent and is now inserted, else its value.
    fn claim(&self, key: &[u8]) -> Option<Vec<u8>> {
        let txn = self.db.begin_write().expect("begin_write");
        let existing = {
            let mut table = txn.open_table(NAIVE).expect("open_table");
            let existing = table.get(key).expect("get").map(|v| v.value().to_vec());
            if existing.is_none() {
                table.insert(key, self.value.as_slice()).expect("insert");
            }
            existing
        };
        txn.commit().expect("commit");
        existing
    }

    fn claim_new(&self, req: &Request) {
        let existing = self.claim(&req.naive_key);
        assert!(existing.is_none(), "new key already present");
    }

    /// The naive completion: overwrite the value with the response, in its own transaction.
    fn complete(&self, key: &[u8], response: &[u8]) {
        let txn = self.db.begin_write().expect("begin_write");
        txn.open_table(NAIVE)
            .expect("open_table")
            .insert(key, response)
            .expect("insert");
        txn.commit().expect("commit");
    }

    fn cycle(&self, w: &Workload, req: &Request) {
        self.claim_new(req);
        let mut response = Vec::with_capacity(2 + w.response_body.len());
        response.extend_from_slice(&201u16.to_be_bytes());
        response.extend_from_slice(&w.response_body);
        self.complete(&req.naive_key, &response);
    }
}

/// Runs `iters` operations on fresh keys split over `threads` threads, and returns the wall
/// time from the moment all threads are ready until the last one finishes. Keys are drawn
/// before the clock starts.
fn run_parallel(
    threads: usize,
    iters: u64,
    seed: u64,
    w: &Workload,
    op: &(dyn Fn(&Request) + Sync),
) -> Duration {
    let n = u64::try_from(threads).expect("usize fits u64");
    let barrier = Barrier::new(threads + 1);
    let start = std::thread::scope(|s| {
        for t in 0..threads {
            let barrier = &barrier;
            let t64 = u64::try_from(t).expect("usize fits u64");
            let share = iters / n + u64::from(t64 < iters % n);
            s.spawn(move || {
                let mut rng = SplitMix64::derive(seed, 0, t64);
                let requests: Vec<Request> = (0..share).map(|_| w.request(&mut rng)).collect();
                barrier.wait();
                for req in &requests {
                    op(req);
                }
            });
        }
        barrier.wait();
        Instant::now()
    });
    start.elapsed()
}

/// Prints how many commits (fsyncs) an idemdb benchmark made, for the mean batch size.
fn report_commits(name: &str, before: Stats, after: Stats) {
    let ops = (after.acquired - before.acquired) + (after.completes - before.completes);
    let commits = after.commit_batches - before.commit_batches;
    if commits > 0 {
        // Lossless enough for a printout.
        #[allow(clippy::cast_precision_loss)]
        let per = ops as f64 / commits as f64;
        eprintln!("{name}: {ops} durable writes in {commits} commits ({per:.1} per fsync)");
    }
}

fn claim_latency_1_thread(c: &mut Criterion) {
    let w = Workload::new();
    let mut g = c.benchmark_group("claim_latency_1_thread");
    g.sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(8));

    let idem = IdemBench::open();
    let before = idem.store.stats();
    let mut rng = SplitMix64::new(SEED_LATENCY);
    g.bench_function("idemdb", |b| {
        b.iter_batched(
            || w.request(&mut rng),
            |req| idem.claim_new(&w, &req),
            BatchSize::SmallInput,
        );
    });
    report_commits("claim_latency_1_thread/idemdb", before, idem.store.stats());
    drop(idem);

    let naive = NaiveRedb::open();
    let mut rng = SplitMix64::new(SEED_LATENCY);
    g.bench_function("naive_redb", |b| {
        b.iter_batched(
            || w.request(&mut rng),
            |req| naive.claim_new(&req),
            BatchSize::SmallInput,
        );
    });
    g.finish();
}

fn claim_throughput(c: &mut Criterion) {
    side_by_side(
        c,
        "claim_throughput",
        &THROUGHPUT_THREADS,
        SEED_THROUGHPUT,
        |idem, w, req| drop(idem.claim_new(w, req)),
        |naive, _, req| naive.claim_new(req),
    );
}

/// One flat-sampled group that runs `idem_op` and then `naive_op` on fresh keys from `threads`
/// concurrent callers, for each thread count, reporting elements (requests) per second.
fn side_by_side(
    c: &mut Criterion,
    group: &str,
    threads: &[usize],
    seed: u64,
    idem_op: fn(&IdemBench, &Workload, &Request),
    naive_op: fn(&NaiveRedb, &Workload, &Request),
) {
    let w = Workload::new();
    let mut g = c.benchmark_group(group);
    g.sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Elements(1));

    for &threads in threads {
        // idemdb as shipped, and with its journal turned off (every batch a durable redb
        // commit): the journal's effect, measured side by side.
        for (name, journal) in [("idemdb", None), ("idemdb_no_journal", Some(0))] {
            let builder = match journal {
                Some(bytes) => Store::builder().journal_size(bytes),
                None => Store::builder(),
            };
            let idem = IdemBench::open_with(builder);
            let before = idem.store.stats();
            let mut round = 0;
            g.bench_with_input(BenchmarkId::new(name, threads), &threads, |b, &n| {
                b.iter_custom(|iters| {
                    round += 1;
                    let seed = SplitMix64::derive(seed, round, n as u64).next_u64();
                    run_parallel(n, iters, seed, &w, &|req| idem_op(&idem, &w, req))
                });
            });
            report_commits(
                &format!("{group}/{name}/{threads}"),
                before,
                idem.store.stats(),
            );
        }

        let naive = NaiveRedb::open();
        let mut round = 0;
        g.bench_with_input(
            BenchmarkId::new("naive_redb", threads),
            &threads,
            |b, &n| {
                b.iter_custom(|iters| {
                    round += 1;
                    let seed = SplitMix64::derive(seed, round, n as u64).next_u64();
                    run_parallel(n, iters, seed, &w, &|req| naive_op(&naive, &w, req))
                });
            },
        );
    }
    g.finish();
}

fn decisions(c: &mut Criterion) {
    let w = Workload::new();
    let mut rng = SplitMix64::new(SEED_DECISIONS);
    let scope = &w.scopes[0];
    let fp = w.fingerprint;
    let other_fp = Fingerprint::of(br#"{"amount":9999,"currency":"usd","customer":"cus_1"}"#);
    let (done_key, held_key) = (rng.ascii(KEY_LEN), rng.ascii(KEY_LEN));

    // A lease far longer than the group runs, so the held claim never goes stale under it.
    let idem = IdemBench::open_with(Store::builder().lease(Duration::from_secs(3600)));
    let store = &idem.store;
    let Claim::Acquired(ticket) = store.claim(scope, &done_key, fp).expect("claim") else {
        panic!("a new key is acquired");
    };
    store.complete(ticket, w.response()).expect("complete");
    let Claim::Acquired(held) = store.claim(scope, &held_key, fp).expect("claim") else {
        panic!("a new key is acquired");
    };

    let mut g = c.benchmark_group("decisions");
    g.warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));
    let before = store.stats();
    g.bench_function("replay", |b| {
        b.iter(|| {
            let claim = store.claim(scope, &done_key, fp).expect("claim");
            assert!(matches!(claim, Claim::Replay(_)), "{claim:?}");
            claim
        });
    });
    g.bench_function("in_progress", |b| {
        b.iter(|| {
            let claim = store.claim(scope, &held_key, fp).expect("claim");
            assert!(matches!(claim, Claim::InProgress { .. }), "{claim:?}");
            claim
        });
    });
    g.bench_function("mismatch", |b| {
        b.iter(|| {
            let claim = store.claim(scope, &done_key, other_fp).expect("claim");
            assert!(
                matches!(claim, Claim::Mismatch { completed: true }),
                "{claim:?}"
            );
            claim
        });
    });
    let after = store.stats();
    assert_eq!(
        after.commit_batches, before.commit_batches,
        "decisions must not write"
    );
    store.release(held).expect("release");
    drop(idem);

    // The baseline has one answer for any existing key: a write transaction that finds it.
    let naive = NaiveRedb::open();
    let req = w.request(&mut rng);
    naive.claim_new(&req);
    g.sample_size(20).measurement_time(Duration::from_secs(4));
    g.bench_function("naive_redb/existing_key", |b| {
        b.iter(|| {
            let existing = naive.claim(&req.naive_key);
            assert!(existing.is_some());
            existing
        });
    });
    g.finish();
}

fn claim_complete_cycle(c: &mut Criterion) {
    side_by_side(
        c,
        "claim_complete_cycle",
        &CYCLE_THREADS,
        SEED_CYCLE,
        |idem, w, req| idem.cycle(w, req),
        |naive, w, req| naive.cycle(w, req),
    );
}

/// Criterion's generated `benches` function carries no doc comment, hence the allow.
#[allow(missing_docs)]
mod group {
    use super::{claim_complete_cycle, claim_latency_1_thread, claim_throughput, decisions};
    criterion::criterion_group!(
        benches,
        claim_latency_1_thread,
        claim_throughput,
        decisions,
        claim_complete_cycle
    );
}
criterion_main!(group::benches);
