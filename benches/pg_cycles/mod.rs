//! Claim + complete cycles on a PostgreSQL store from many blocking callers: what the
//! PostgreSQL benches that compare connection routes share.

use idemdb::{Claim, Fingerprint, Response, Scope, Store};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).map_or(default, |v| v.parse().expect("a number"))
}

/// Claim + complete cycles of new keys from `callers` threads for `length`: requests per
/// second and the median latency.
pub(crate) fn run(store: &Store, callers: usize, length: Duration, round: u64) -> (f64, Duration) {
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
                let scope = Scope::new("bench", "POST /cycle");
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
