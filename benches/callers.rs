//! Claim + complete with 64 requests in flight on one store file, two ways side by side, in
//! alternating rounds: 64 OS threads calling the blocking API (what `compare/` measures), and
//! 64 tasks on a tokio runtime of two worker threads calling the async API (what the HTTP
//! layer does). Every request is a new key, answered `Acquired`, completed with a 256-byte
//! response. Prints one table: requests per second, and CPU time per request, of this process
//! (`/proc/self/stat`) and of the whole machine (`/proc/stat`, which counts the kernel's I/O
//! work and anything else running).
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
        "{:<28} {:>12} {:>16} {:>18}",
        "callers (64 in flight)", "requests/s", "process CPU us/r", "machine CPU us/r"
    );
    for _ in 0..ROUNDS {
        for way in [Way::Threads, Way::Tasks] {
            let row = measure(way, &store, &next, window);
            println!(
                "{:<28} {:>12.0} {:>16.1} {:>18.1}",
                way.name(),
                row.requests as f64 / row.wall,
                row.process_cpu * 1e6 / row.requests as f64,
                row.machine_cpu * 1e6 / row.requests as f64
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
    machine_cpu: f64,
}

fn measure(way: Way, store: &Store, next: &Arc<AtomicU64>, window: Duration) -> Row {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let (process0, machine0, started) = (process_cpu(), machine_busy(), Instant::now());
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
    Row {
        requests: done.load(Ordering::Relaxed),
        wall: started.elapsed().as_secs_f64(),
        process_cpu: process_cpu() - process0,
        machine_cpu: machine_busy() - machine0,
    }
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
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields[i].parse::<f64>().expect("a tick count");
    (ticks(11) + ticks(12)) / clock_ticks()
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
