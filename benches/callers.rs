//! Claim + complete with 64 requests in flight on one store file, two ways side by side, in
//! alternating rounds: 64 OS threads calling the blocking API (what `compare/` measures), and
//! 64 tasks on a tokio runtime of two worker threads calling the async API (what the HTTP
//! layer does). Every request is a new key, answered `Acquired`, completed with a 256-byte
//! response. Prints one table: requests per second, and CPU time per request, of this process
//! (`/proc/self/stat`), of its `idemdb-apply` thread (`/proc/self/task`) and of the whole
//! machine (`/proc/stat`, which counts the kernel's I/O work and anything else running); and
//! how long a duplicate of a request completed a moment before takes to be answered with the
//! stored response under that load (one duplicate a millisecond, each of its own key, so each
//! is read from the file: a replay waits until the applier holds what was answered).
//!
//! `cargo bench --bench callers` (about 40 s). `IDEMDB_CALLERS_SECONDS` sets each round's
//! length (default 5); the store is made anew in `IDEMDB_BENCH_DIR` (or
//! `CARGO_TARGET_TMPDIR`) and deleted at the end.

use idemdb::{Claim, Fingerprint, Response, Scope, Store};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[allow(dead_code, unused_imports)] // shared with the other benches, which use all of it
mod common;

const IN_FLIGHT: usize = 64;
const ROUNDS: usize = 2;

fn main() {
    let seconds: f64 = std::env::var("IDEMDB_CALLERS_SECONDS").map_or(5.0, |s| {
        s.parse().expect("IDEMDB_CALLERS_SECONDS: a number")
    });
    let window = Duration::from_secs_f64(seconds);
    let dir = std::env::var_os("IDEMDB_BENCH_DIR")
        .or_else(|| std::env::var_os("CARGO_TARGET_TMPDIR"))
        .map_or_else(std::env::temp_dir, PathBuf::from);
    let path = dir.join(format!("callers-{}.idem", std::process::id()));
    let store = Store::open(&path).expect("open");
    let next = Arc::new(AtomicU64::new(0));
    println!(
        "{:<28} {:>12} {:>16} {:>16} {:>18} {:>24}",
        "callers (64 in flight)",
        "requests/s",
        "process CPU us/r",
        "applier CPU us/r",
        "machine CPU us/r",
        "replay p50/p99/max us"
    );
    for _ in 0..ROUNDS {
        for way in [Way::Threads, Way::Tasks] {
            let row = measure(way, &store, &next, window);
            let q = |per_mille: usize| {
                let last = row.replays.len().saturating_sub(1);
                row.replays
                    .get(last * per_mille / 1000)
                    .map_or_else(|| "-".to_owned(), u64::to_string)
            };
            println!(
                "{:<28} {:>12.0} {:>16.1} {:>16.1} {:>18.1} {:>24}",
                way.name(),
                row.requests as f64 / row.wall,
                row.process_cpu * 1e6 / row.requests as f64,
                row.applier_cpu * 1e6 / row.requests as f64,
                row.machine_cpu * 1e6 / row.requests as f64,
                format!("{}/{}/{}", q(500), q(990), q(1000))
            );
        }
    }
    drop(store);
    for p in [common::journal_path(&path), path] {
        let _ = std::fs::remove_file(p);
    }
}

#[derive(Clone, Copy)]
enum Way {
    Threads,
    Tasks,
}

impl Way {
    fn name(self) -> &'static str {
        match self {
            Way::Threads => "64 threads, blocking API",
            Way::Tasks => "64 tokio tasks, async API",
        }
    }
}

struct Row {
    requests: u64,
    wall: f64,
    process_cpu: f64,
    applier_cpu: f64,
    machine_cpu: f64,
    /// The replay latencies of the duplicates, µs, sorted.
    replays: Vec<u64>,
}

fn measure(way: Way, store: &Store, next: &Arc<AtomicU64>, window: Duration) -> Row {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let (process0, applier0) = (process_cpu(), applier_cpu());
    let (machine0, started) = (machine_busy(), Instant::now());
    let duplicates = std::thread::spawn({
        let (store, stop, next) = (store.clone(), stop.clone(), next.clone());
        move || duplicates(&store, &stop, &next)
    });
    match way {
        Way::Threads => std::thread::scope(|s| {
            for _ in 0..IN_FLIGHT {
                let (stop, done, next) = (&stop, &done, next);
                s.spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let (scope, key) = request(next);
                        let Claim::Acquired(ticket) =
                            store.claim(&scope, &key, fingerprint()).expect("claim")
                        else {
                            panic!("a new key is acquired");
                        };
                        store.complete(ticket, response()).expect("complete");
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
            std::thread::sleep(window);
            stop.store(true, Ordering::Relaxed);
        }),
        Way::Tasks => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_time()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                let mut tasks = Vec::new();
                for _ in 0..IN_FLIGHT {
                    let (store, stop, done, next) =
                        (store.clone(), stop.clone(), done.clone(), next.clone());
                    tasks.push(tokio::spawn(async move {
                        while !stop.load(Ordering::Relaxed) {
                            let (scope, key) = request(&next);
                            let claim = store.claim_async(&scope, &key, fingerprint()).await;
                            let Claim::Acquired(ticket) = claim.expect("claim") else {
                                panic!("a new key is acquired");
                            };
                            store
                                .complete_async(ticket, response())
                                .await
                                .expect("complete");
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                    }));
                }
                tokio::time::sleep(window).await;
                stop.store(true, Ordering::Relaxed);
                for t in tasks {
                    t.await.expect("task");
                }
            });
        }
    }
    let requests = done.load(Ordering::Relaxed);
    let (wall, process_cpu, applier_cpu, machine_cpu) = (
        started.elapsed().as_secs_f64(),
        process_cpu() - process0,
        applier_cpu() - applier0,
        machine_busy() - machine0,
    );
    let mut replays = duplicates.join().expect("the duplicates' thread");
    replays.sort_unstable();
    Row {
        requests,
        wall,
        process_cpu,
        applier_cpu,
        machine_cpu,
        replays,
    }
}

/// Until `stop`: a request of a new key, claimed and completed, then timed, its duplicate,
/// answered with the stored response; one a millisecond. Returns the duplicates' latencies.
fn duplicates(store: &Store, stop: &AtomicBool, next: &AtomicU64) -> Vec<u64> {
    let mut took = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let (scope, key) = request(next);
        let Claim::Acquired(ticket) = store.claim(&scope, &key, fingerprint()).expect("claim")
        else {
            panic!("a new key is acquired");
        };
        store.complete(ticket, response()).expect("complete");
        let started = Instant::now();
        let Claim::Replay(_) = store.claim(&scope, &key, fingerprint()).expect("claim") else {
            panic!("a completed key replays");
        };
        took.push(u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX));
        std::thread::sleep(Duration::from_millis(1));
    }
    took
}

fn request(next: &AtomicU64) -> (Scope, String) {
    let i = next.fetch_add(1, Ordering::Relaxed);
    (
        Scope::new(format!("tenant_{:02}", i % 4), "POST /v1/payments"),
        format!("{i:036}"),
    )
}

fn fingerprint() -> Fingerprint {
    Fingerprint::of(br#"{"amount":5000,"currency":"usd"}"#)
}

fn response() -> Response {
    Response::new(201, vec![b'r'; 256]).with_header("content-type", "application/json")
}

/// This process's user + system CPU seconds.
fn process_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    stat_cpu(&stat).expect("/proc/self/stat has its CPU times")
}

/// User + system CPU seconds of this process's `idemdb-apply` thread (the store's one applier).
fn applier_cpu() -> f64 {
    let mut seconds = 0.0;
    for task in std::fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let task = task.expect("a task").path();
        let comm = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
        if comm.trim() != "idemdb-apply" {
            continue;
        }
        // A thread that exited meanwhile has no stat left to read.
        let stat = std::fs::read_to_string(task.join("stat")).unwrap_or_default();
        seconds += stat_cpu(&stat).unwrap_or(0.0);
    }
    seconds
}

/// The user + system CPU seconds in a `stat` line of `/proc` (a process's or a thread's).
fn stat_cpu(stat: &str) -> Option<f64> {
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i)?.parse::<f64>().ok();
    Some((ticks(11)? + ticks(12)?) / clock_ticks())
}

/// Busy CPU seconds of the whole machine (every state but idle and iowait).
fn machine_busy() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").expect("/proc/stat");
    let cpu = stat.lines().next().expect("the cpu line");
    let v: Vec<f64> = cpu
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().expect("a tick count"))
        .collect();
    let total: f64 = v.iter().sum();
    (total - v[3] - v.get(4).copied().unwrap_or(0.0)) / clock_ticks()
}

/// USER_HZ: 100 on every Linux this runs on (`getconf CLK_TCK`).
fn clock_ticks() -> f64 {
    100.0
}
