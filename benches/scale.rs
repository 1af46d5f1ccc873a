//! Scaling: idemdb alone, from 100k to 10M live keys. Prints one table.
//!
//! Run with `cargo bench --bench scale` (100k and 1M keys, about two minutes), or choose the
//! sizes: `IDEMDB_SCALE_KEYS=100000,1000000,10000000 cargo bench --bench scale` (10M keys take
//! about ten minutes and 5 GB of disk).
//!
//! For each size N, in a fresh store on the real disk (`CARGO_TARGET_TMPDIR`, or
//! `IDEMDB_BENCH_DIR`):
//!
//! 1. **preload**: N claim + complete cycles with a 256-byte response, through the async API
//!    with 8192 requests in flight, so commits are large batches. Reported as records/s.
//! 2. **claims/s**: new-key claims from 64 threads for `IDEMDB_SCALE_SECONDS` (default 3) on
//!    top of the N live keys; each claim is fsynced before it returns.
//! 3. **open**: a child process opens the file (rebuilding the index from the record heads,
//!    checking each head's checksum), and reports the time and its resident memory before and after; the
//!    difference divided by the live records is the **resident bytes per live key**, the
//!    redb page cache included.
//! 4. **purge**: a child process opens the file with a clock 25 hours ahead and purges every
//!    expired record; reported as records/s.
//! 5. **file bytes per live key**: the store file's and its journal's size after the preload
//!    and the claims.
//!
//! `IDEMDB_SCALE_KEEP=1` keeps each store file (its path is printed, and the purge is skipped)
//! for profiling; `IDEMDB_SCALE_OPEN=<file>` only measures opening that file
//! (`IDEMDB_SCALE_PAGE_CHECK=verify` opens it verifying every redb page first).

use idemdb::{Claim, Fingerprint, ManualClock, Response, Scope, Store};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant, SystemTime};

#[allow(dead_code)] // shared with the other benches, which use all of it
mod common;
use common::{SplitMix64, KEY_LEN};

const TENANTS: usize = 4;
const ENDPOINT: &str = "POST /v1/payments";
const RESPONSE_LEN: usize = 256;
const IN_FLIGHT: usize = 8192;
const CLAIM_THREADS: usize = 64;
const CHILD_ENV: &str = "IDEMDB_SCALE_CHILD";

fn main() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        child(&spec);
        return;
    }
    if let Some(path) = std::env::var_os("IDEMDB_SCALE_OPEN") {
        let opened = run_child("open", Path::new(&path));
        println!(
            "opened {} records in {:.3} s; resident {:.1} bytes per record",
            opened[3],
            opened[0],
            (opened[2] - opened[1]) / opened[3]
        );
        return;
    }
    let sizes: Vec<u64> = std::env::var("IDEMDB_SCALE_KEYS")
        .unwrap_or_else(|_| "100000,1000000".into())
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .expect("IDEMDB_SCALE_KEYS: a list of numbers")
        })
        .collect();
    let seconds: f64 = std::env::var("IDEMDB_SCALE_SECONDS")
        .map_or(3.0, |s| s.parse().expect("IDEMDB_SCALE_SECONDS: a number"));
    println!("idemdb scaling, {}", machine());
    println!(
        "{:>10} | {:>12} | {:>10} | {:>9} | {:>11} | {:>9} | {:>10} | {:>10}",
        "live keys",
        "preload /s",
        "claims/s",
        "open s",
        "open s/1M",
        "B/key RSS",
        "purge /s",
        "file B/key"
    );
    for n in sizes {
        let row = measure(n, Duration::from_secs_f64(seconds));
        println!(
            "{:>10} | {:>12.0} | {:>10.0} | {:>9.3} | {:>11.3} | {:>9.1} | {:>10.0} | {:>10.1}",
            row.live,
            row.preload_rate,
            row.claims_per_sec,
            row.open_secs,
            row.open_secs * 1e6 / row.live as f64,
            row.rss_per_key,
            row.purge_rate,
            row.file_per_key
        );
    }
}

struct Row {
    live: u64,
    preload_rate: f64,
    claims_per_sec: f64,
    open_secs: f64,
    rss_per_key: f64,
    purge_rate: f64,
    file_per_key: f64,
}

fn scopes() -> Vec<Scope> {
    (0..TENANTS)
        .map(|t| Scope::new(format!("tenant_{t:04}"), ENDPOINT))
        .collect()
}

fn measure(n: u64, seconds: Duration) -> Row {
    let dir = common::bench_dir("idemdb-scale-");
    let path = dir.path().join("scale.idem");
    let store = Store::open(&path).expect("open");
    let started = Instant::now();
    preload(&store, n);
    let preload_rate = n as f64 / started.elapsed().as_secs_f64();
    let claims_per_sec = claim_loop(&store, seconds);
    let live = store.record_count().unwrap();
    drop(store);
    // The store file and its journal.
    let journal = std::fs::metadata(dir.path().join("scale.idem-journal")).map_or(0, |m| m.len());
    let file_per_key =
        (std::fs::metadata(&path).expect("stat").len() + journal) as f64 / live as f64;

    let opened = run_child("open", &path);
    let (open_secs, rss_before, rss_after, reopened_live) =
        (opened[0], opened[1], opened[2], opened[3]);
    assert_eq!(
        reopened_live, live as f64,
        "the reopened store lost records"
    );
    let purged = if std::env::var_os("IDEMDB_SCALE_KEEP").is_some() {
        let kept = dir.keep();
        eprintln!("kept {}", kept.join("scale.idem").display());
        vec![f64::NAN, 1.0]
    } else {
        let purged = run_child("purge", &path);
        assert_eq!(
            purged[0], n as f64,
            "purge removed another number of records"
        );
        purged
    };
    Row {
        live,
        preload_rate,
        claims_per_sec,
        open_secs,
        rss_per_key: (rss_after - rss_before) / live as f64,
        purge_rate: purged[0] / purged[1],
        file_per_key,
    }
}

/// `n` claim + complete cycles with `IN_FLIGHT` of them in flight at once.
fn preload(store: &Store, n: u64) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("tokio runtime");
    let scopes = scopes();
    let fingerprint = Fingerprint::of(br#"{"amount":5000,"currency":"usd"}"#);
    let body = SplitMix64::new(0xb0d7).ascii(RESPONSE_LEN).into_bytes();
    runtime.block_on(async {
        let mut rng = SplitMix64::derive(0x5ca1e, n, 0);
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..n {
            if tasks.len() == IN_FLIGHT {
                tasks.join_next().await.expect("a task").expect("no panic");
            }
            let (store, body) = (store.clone(), body.clone());
            let scope = scopes[rng.index(TENANTS)].clone();
            let key = rng.ascii(KEY_LEN);
            tasks.spawn(async move {
                let claim = store.claim_async(&scope, &key, fingerprint).await;
                let Ok(Claim::Acquired(ticket)) = claim else {
                    panic!("a new key is acquired: {claim:?}")
                };
                store
                    .complete_async(ticket, Response::new(201, body))
                    .await
                    .expect("complete");
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.expect("no panic");
        }
    });
}

/// New-key claims from `CLAIM_THREADS` threads for `seconds`; returns claims per second.
fn claim_loop(store: &Store, seconds: Duration) -> f64 {
    let scopes = scopes();
    let fingerprint = Fingerprint::of(b"scale");
    let barrier = Barrier::new(CLAIM_THREADS + 1);
    let stop = AtomicBool::new(false);
    let claims = AtomicU64::new(0);
    let elapsed = std::thread::scope(|s| {
        for t in 0..CLAIM_THREADS {
            let (barrier, stop, claims, scopes) = (&barrier, &stop, &claims, &scopes);
            s.spawn(move || {
                let mut rng =
                    SplitMix64::derive(0xc1a1, 0, u64::try_from(t).expect("usize fits u64"));
                let mut mine = 0;
                barrier.wait();
                while !stop.load(Ordering::Relaxed) {
                    let scope = &scopes[rng.index(TENANTS)];
                    let claim = store.claim(scope, &rng.ascii(KEY_LEN), fingerprint);
                    assert!(matches!(claim, Ok(Claim::Acquired(_))), "{claim:?}");
                    mine += 1;
                }
                claims.fetch_add(mine, Ordering::Relaxed);
            });
        }
        barrier.wait();
        let started = Instant::now();
        std::thread::sleep(seconds);
        stop.store(true, Ordering::Relaxed);
        started
    })
    .elapsed();
    claims.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64()
}

/// Runs this binary again in child mode; returns the numbers it prints.
fn run_child(what: &str, path: &Path) -> Vec<f64> {
    let out = Command::new(std::env::current_exe().expect("current exe"))
        .env(CHILD_ENV, format!("{what}:{}", path.display()))
        .output()
        .expect("run the child");
    assert!(
        out.status.success(),
        "child {what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .split_whitespace()
        .map(|x| x.parse().expect("a number"))
        .collect()
}

fn child(spec: &str) {
    let (what, path) = spec.split_once(':').expect("what:path");
    match what {
        "open" => {
            let before = rss_bytes();
            let started = Instant::now();
            let mut builder = Store::builder();
            if let Ok(bytes) = std::env::var("IDEMDB_SCALE_CACHE") {
                builder = builder.cache_size(bytes.parse().expect("IDEMDB_SCALE_CACHE: bytes"));
            }
            if std::env::var("IDEMDB_SCALE_PAGE_CHECK").as_deref() == Ok("verify") {
                builder = builder.page_check(idemdb::PageCheck::Verify);
            }
            let store = builder.open(path).expect("open");
            let secs = started.elapsed().as_secs_f64();
            let after = rss_bytes();
            let live = store.record_count().unwrap();
            println!("{secs} {before} {after} {live}");
        }
        "purge" => {
            let clock = ManualClock::at(SystemTime::now() + Duration::from_secs(25 * 3600));
            let store = Store::builder().clock(clock).open(path).expect("open");
            let started = Instant::now();
            let purged = store.purge_expired().expect("purge");
            println!("{purged} {}", started.elapsed().as_secs_f64());
        }
        _ => panic!("unknown child mode {what}"),
    }
}

/// This process's resident set, from `/proc/self/statm` (pages).
fn rss_bytes() -> f64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("read statm");
    let pages: f64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("statm has a resident field");
    pages * 4096.0
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cores} cores, {cpu}")
}
