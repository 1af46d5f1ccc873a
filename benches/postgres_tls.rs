//! What TLS costs the PostgreSQL engine: claim + complete through the blocking API at 1 and 64
//! callers, with `sslmode=verify-full` against `sslmode=disable`, on one server, the two taken
//! in turn (`IDEMDB_BENCH_ROUNDS` rounds, default 2, of `IDEMDB_BENCH_SECONDS`, default 3).
//!
//! ```sh
//! cargo bench --features postgres --bench postgres_tls
//! ```
//!
//! It makes its certificates (`tests/tls_certs`), starts a server that speaks TLS
//! (`scripts/with-postgres --tls`, as root), and runs itself beside it. The plain connections
//! log in as `idemdb_plain`, the one role that server lets in without TLS. Prints a table:
//! requests per second and p50 latency per request for each.

use idemdb::{Claim, Fingerprint, Response, Scope, Store};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "../tests/tls_certs/mod.rs"]
mod tls_certs;

const CERTS_ENV: &str = "IDEMDB_TLS_CERTS";

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    match std::env::var_os(CERTS_ENV) {
        Some(dir) => measure(Path::new(&dir)),
        None => {
            let dir = tempfile::tempdir().expect("a temporary directory");
            tls_certs::make(dir.path());
            let status = std::process::Command::new(
                Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/with-postgres"),
            )
            .arg("--tls")
            .arg(dir.path())
            .arg(std::env::current_exe().expect("this bench"))
            .env(CERTS_ENV, dir.path())
            .status()
            .expect("run scripts/with-postgres");
            assert!(status.success());
        }
    }
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).map_or(default, |v| v.parse().expect("a number"))
}

fn measure(dir: &Path) {
    let port = std::env::var("IDEMDB_PG_PORT").expect("beside scripts/with-postgres");
    let seconds = env_or("IDEMDB_BENCH_SECONDS", 3);
    let rounds = env_or("IDEMDB_BENCH_ROUNDS", 2);
    let plain = format!("host=127.0.0.1 port={port} user=idemdb_plain dbname=idem sslmode=disable");
    let tls = format!(
        "host=localhost port={port} user=idemdb_plain dbname=idem sslmode=verify-full sslrootcert='{}'",
        dir.join("ca.crt").display()
    );
    println!("| callers | connection | requests/s | p50 per request |");
    println!("| ---: | --- | ---: | ---: |");
    for callers in [1, 64] {
        for round in 0..rounds {
            for (name, url) in [("plain", &plain), ("TLS, verify-full", &tls)] {
                let store = Store::builder()
                    .schema("tls_bench")
                    .connect(url)
                    .expect("connect");
                let (rate, p50) = run(&store, callers, Duration::from_secs(seconds), round);
                println!("| {callers} | {name} | {rate:.0} | {p50:.0?} |");
            }
        }
    }
}

/// Claim + complete cycles of new keys from `callers` threads for `length`: requests per
/// second and the median latency.
fn run(store: &Store, callers: usize, length: Duration, round: u64) -> (f64, Duration) {
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    // Keys new to this run too, whatever earlier runs left in the schema.
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let threads: Vec<_> = (0..callers)
        .map(|t| {
            let (store, stop) = (store.clone(), Arc::clone(&stop));
            std::thread::spawn(move || {
                let scope = Scope::new("bench", "POST /tls");
                let mut latencies = Vec::new();
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("r{round}-t{t}-{i}-{stamp}");
                    let at = Instant::now();
                    match store
                        .claim(&scope, &key, Fingerprint::of(b"x"))
                        .expect("claim")
                    {
                        Claim::Acquired(ticket) => store
                            .complete(ticket, Response::new(201, vec![b'x'; 256]))
                            .expect("complete"),
                        other => panic!("{other:?}"),
                    }
                    latencies.push(at.elapsed());
                    i += 1;
                }
                latencies
            })
        })
        .collect();
    std::thread::sleep(length);
    stop.store(true, Ordering::Relaxed);
    let mut all: Vec<Duration> = threads
        .into_iter()
        .flat_map(|t| t.join().expect("no panic"))
        .collect();
    let elapsed = started.elapsed().as_secs_f64();
    all.sort();
    (all.len() as f64 / elapsed, all[all.len() / 2])
}
