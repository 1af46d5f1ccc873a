//! Group commit on PostgreSQL, measured: the same claims (and claim + complete cycles) with the
//! operations that queue up together sharing one statement and one commit (the default),
//! against one statement per operation on the same 4 connections, and against one statement
//! per operation with a connection per caller. All three in one run, against one server.
//!
//! ```sh
//! scripts/with-postgres cargo bench --features postgres --bench postgres
//! ```
//!
//! `IDEMDB_BENCH_SECONDS` sets each cell's measuring time (default 3). Prints a table: requests
//! per second, p50 and p99 latency per request, and the statements (commits) per request.
//! Before it: replays from the cache against first requests, and one caller's requests against
//! a raw client's, taken in turn (`IDEMDB_BENCH_LONE` rounds, default 3000;
//! `IDEMDB_BENCH_LONE_ONLY` stops there).

use idemdb::{Claim, Fingerprint, Response, Scope, Store, StoreBuilder};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

#[derive(Clone, Copy)]
enum Mode {
    Batched,
    PerCall,
    PerCallOwnConnection,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Batched => "grouped (4 connections)",
            Mode::PerCall => "1 statement per call (4 connections)",
            Mode::PerCallOwnConnection => "1 statement per call (1 connection per caller)",
        }
    }

    fn builder(self, callers: usize) -> StoreBuilder {
        let b = Store::builder();
        match self {
            Mode::Batched => b.pool_size(4),
            Mode::PerCall => b.pool_size(4).batch_limit(1),
            Mode::PerCallOwnConnection => b.pool_size(callers).batch_limit(1),
        }
    }
}

struct Cell {
    requests: u64,
    elapsed: Duration,
    latencies: Vec<Duration>,
    commits: u64,
}

fn run(
    url: &str,
    schema: &str,
    mode: Mode,
    callers: usize,
    complete: bool,
    time: Duration,
) -> Cell {
    let store = mode
        .builder(callers)
        .schema(schema)
        .connect(url)
        .expect("connect");
    let scope = Scope::new("bench", "POST /v1/payments");
    let fp = Fingerprint::of(br#"{"amount":5000,"currency":"usd"}"#);
    let response =
        Response::new(201, vec![b'x'; 200]).with_header("content-type", "application/json");
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(callers + 1));
    let before = store.stats().commit_batches;
    let threads: Vec<_> = (0..callers)
        .map(|t| {
            let (store, scope, response, stop, start) = (
                store.clone(),
                scope.clone(),
                response.clone(),
                stop.clone(),
                start.clone(),
            );
            std::thread::spawn(move || {
                let mut latencies = Vec::new();
                start.wait();
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("{schema_tag}-{t}-{i}", schema_tag = "k");
                    i += 1;
                    let began = Instant::now();
                    let Claim::Acquired(ticket) = store.claim(&scope, &key, fp).expect("claim")
                    else {
                        panic!("a new key is acquired")
                    };
                    if complete {
                        store.complete(ticket, response.clone()).expect("complete");
                    } else {
                        std::mem::forget(ticket);
                    }
                    latencies.push(began.elapsed());
                }
                latencies
            })
        })
        .collect();
    start.wait();
    let began = Instant::now();
    std::thread::sleep(time);
    stop.store(true, Ordering::Relaxed);
    let mut latencies: Vec<Duration> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    let elapsed = began.elapsed();
    latencies.sort_unstable();
    Cell {
        requests: latencies.len() as u64,
        elapsed,
        latencies,
        commits: store.stats().commit_batches - before,
    }
}

/// The `per_mille`th of `sorted` (500: the median).
fn percentile(sorted: &[Duration], per_mille: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[(sorted.len() - 1) * per_mille / 1000]
}

/// One caller: the first request of a key (claim + complete, two commits) against a replay of
/// it served from the store's cache of completed responses (after one replay read it).
fn replays(url: &str, schema: &str) {
    let store = Store::builder()
        .schema(schema)
        .connect(url)
        .expect("connect");
    let scope = Scope::new("bench", "POST /v1/payments");
    let fp = Fingerprint::of(br#"{"amount":5000}"#);
    let response =
        Response::new(201, vec![b'x'; 200]).with_header("content-type", "application/json");
    let (mut first, mut cached) = (Vec::new(), Vec::new());
    for i in 0..500 {
        let key = format!("replay-{i}");
        let began = Instant::now();
        let Claim::Acquired(ticket) = store.claim(&scope, &key, fp).expect("claim") else {
            panic!("a new key is acquired")
        };
        store.complete(ticket, response.clone()).expect("complete");
        first.push(began.elapsed());
        let Claim::Replay(_) = store.claim(&scope, &key, fp).expect("replay") else {
            panic!("a completed key replays")
        };
        for _ in 0..10 {
            let began = Instant::now();
            let Claim::Replay(_) = store.claim(&scope, &key, fp).expect("replay") else {
                panic!("a completed key replays")
            };
            cached.push(began.elapsed());
        }
    }
    first.sort_unstable();
    cached.sort_unstable();
    let (f, c) = (percentile(&first, 500), percentile(&cached, 500));
    println!();
    println!("| 1 caller | p50 | p99 |");
    println!("|---|---:|---:|");
    println!(
        "| first request (claim + complete) | {:.1} µs | {:.1} µs |",
        f.as_secs_f64() * 1e6,
        percentile(&first, 990).as_secs_f64() * 1e6
    );
    println!(
        "| replay from the cache | {:.2} µs | {:.2} µs |",
        c.as_secs_f64() * 1e6,
        percentile(&cached, 990).as_secs_f64() * 1e6
    );
    println!(
        "first request / cached replay, p50: {:.0}x",
        f.as_secs_f64() / c.as_secs_f64()
    );
}

/// One caller, idemdb against a raw client, one request of each in turn (each first every other
/// round), so that both see the same disk at the same moments (this machine's fsync latency
/// drifts by tens of percent from minute to minute, which makes ratios of runs taken one after
/// the other unreliable). The raw client is `compare/`'s: one prepared `INSERT .. ON CONFLICT
/// DO NOTHING` per claim and one `UPDATE` per completion, on its own connection,
/// `synchronous_commit = on`.
fn lone_caller(url: &str, schema: &str, rounds: usize) {
    let store = Store::builder()
        .schema(schema)
        .connect(url)
        .expect("connect");
    let scope = Scope::new("bench", "POST /v1/payments");
    let fp = Fingerprint::of(br#"{"amount":5000}"#);
    let response = Response::new(201, vec![b'x'; 256]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let table = format!("{schema}_raw");
    let (raw, claim, complete) = rt.block_on(async {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(connection);
        client
            .batch_execute(&format!(
                "SET synchronous_commit = on; CREATE TABLE {table} (tenant TEXT NOT NULL, \
                 endpoint TEXT NOT NULL, key TEXT NOT NULL, meta BYTEA NOT NULL, \
                 response BYTEA, expires_at BIGINT NOT NULL, PRIMARY KEY (tenant, endpoint, key))"
            ))
            .await
            .expect("create");
        let claim = client
            .prepare(&format!(
                "INSERT INTO {table} (tenant, endpoint, key, meta, expires_at) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING"
            ))
            .await
            .expect("prepare");
        let complete = client
            .prepare(&format!(
                "UPDATE {table} SET response = $1, expires_at = $2 \
                 WHERE tenant = $3 AND endpoint = $4 AND key = $5"
            ))
            .await
            .expect("prepare");
        (client, claim, complete)
    });
    let meta = vec![7u8; 64];
    let body = vec![b'x'; 256];
    println!();
    println!("| 1 caller, in turn | idemdb p50 | raw p50 | idemdb / raw | idemdb p99 | raw p99 |");
    println!("|---|---:|---:|---:|---:|---:|");
    for with_complete in [false, true] {
        let (mut ours, mut theirs) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
        for i in 0..rounds + rounds / 10 {
            let key = format!("lone-{with_complete}-{i}");
            let run_ours = || {
                let began = Instant::now();
                let Claim::Acquired(ticket) = store.claim(&scope, &key, fp).expect("claim") else {
                    panic!("a new key is acquired")
                };
                if with_complete {
                    store.complete(ticket, response.clone()).expect("complete");
                } else {
                    std::mem::forget(ticket); // as compare/ does: the claim stays in progress
                }
                began.elapsed()
            };
            let run_raw = || {
                let began = Instant::now();
                rt.block_on(async {
                    let changed = raw
                        .execute(&claim, &[&"bench", &"POST", &key, &meta, &1i64])
                        .await
                        .expect("raw claim");
                    assert_eq!(changed, 1);
                    if with_complete {
                        raw.execute(&complete, &[&body, &2i64, &"bench", &"POST", &key])
                            .await
                            .expect("raw complete");
                    }
                });
                began.elapsed()
            };
            // Each goes first every other round: whichever follows the other finds the server
            // and the disk just busy, and that should not count against one side only.
            let (ours_took, theirs_took) = if i % 2 == 0 {
                let ours = run_ours();
                (ours, run_raw())
            } else {
                let theirs = run_raw();
                (run_ours(), theirs)
            };
            // The first tenth warms both up.
            if i >= rounds / 10 {
                ours.push(ours_took);
                theirs.push(theirs_took);
            }
        }
        ours.sort_unstable();
        theirs.sort_unstable();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        println!(
            "| {} | {:.0} µs | {:.0} µs | {:.2}x | {:.0} µs | {:.0} µs |",
            if with_complete {
                "claim + complete"
            } else {
                "claim"
            },
            us(percentile(&ours, 500)),
            us(percentile(&theirs, 500)),
            us(percentile(&ours, 500)) / us(percentile(&theirs, 500)),
            us(percentile(&ours, 990)),
            us(percentile(&theirs, 990)),
        );
    }
    rt.block_on(raw.batch_execute(&format!("DROP TABLE {table}")))
        .expect("drop");
}

fn main() {
    // `cargo bench` passes `--bench`; a name filter is not supported.
    let Ok(url) = std::env::var("IDEMDB_PG_URL") else {
        eprintln!(
            "IDEMDB_PG_URL is not set: run `scripts/with-postgres cargo bench --features postgres --bench postgres`"
        );
        std::process::exit(2);
    };
    let seconds: f64 = std::env::var("IDEMDB_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let time = Duration::from_secs_f64(seconds);
    replays(&url, &format!("bench_{}_replay", std::process::id()));
    let rounds = std::env::var("IDEMDB_BENCH_LONE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000);
    lone_caller(&url, &format!("bench_{}_lone", std::process::id()), rounds);
    if std::env::var_os("IDEMDB_BENCH_LONE_ONLY").is_some() {
        return;
    }
    println!();
    println!("| operation | callers | mode | requests/s | p50 | p99 | statements per request | vs grouped |");
    println!("|---|---:|---|---:|---:|---:|---:|---:|");
    let mut n = 0;
    for complete in [false, true] {
        for callers in [1usize, 16, 64] {
            let mut grouped = 0.0;
            for mode in [Mode::Batched, Mode::PerCall, Mode::PerCallOwnConnection] {
                n += 1;
                let schema = format!("bench_{}_{n}", std::process::id());
                let cell = run(&url, &schema, mode, callers, complete, time);
                let rate = cell.requests as f64 / cell.elapsed.as_secs_f64();
                if matches!(mode, Mode::Batched) {
                    grouped = rate;
                }
                println!(
                    "| {} | {callers} | {} | {rate:.0} | {:.2} ms | {:.2} ms | {:.2} | {:.2}x |",
                    if complete {
                        "claim + complete"
                    } else {
                        "claim"
                    },
                    mode.name(),
                    percentile(&cell.latencies, 500).as_secs_f64() * 1e3,
                    percentile(&cell.latencies, 990).as_secs_f64() * 1e3,
                    cell.commits as f64 / cell.requests.max(1) as f64,
                    grouped / rate,
                );
            }
        }
    }
}
