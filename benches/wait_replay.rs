//! How long a duplicate that waits for an in-flight attempt takes to get its replay once the
//! first attempt has its result: the wait modes of the agent gateway
//! (`GatewayBuilder::wait_for_in_flight`, blocking) and of the HTTP layer
//! (`IdempotencyLayerBuilder::wait_for_in_flight`, async).
//!
//! Run with `cargo bench --bench wait_replay` (about half a minute). It prints a table. With
//! `scripts/with-postgres cargo bench --features postgres --bench wait_replay`, the same on
//! PostgreSQL too, the duplicate on a second replica.
//!
//! Each round: the first attempt claims its key and its tool (handler) blocks; the duplicate
//! starts and is left 1 to 29 ms to start waiting; then the tool returns, noting the
//! instant `t0`. The duplicate notes `t1` when it holds the replay. The figure is `t1 - t0`:
//! the completion's own fsync plus however long the waiter takes to notice. Beside it, the
//! time from `t0` until the first attempt itself returned: the floor a waiter cannot beat. The store lives in
//! a fresh directory under `CARGO_TARGET_TMPDIR` (a real disk), or `IDEMDB_BENCH_DIR`.

use axum::body::{Body, Bytes};
use axum::http::{Request, StatusCode};
use axum::routing::post;
use axum::Router;
use http_body_util::BodyExt;
use idemdb::agent::{Gateway, Outcome, ToolCallKey};
use idemdb::http::IdempotencyLayer;
use idemdb::Store;
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tower::Service;

const ROUNDS: usize = 200;
const WAIT_BOUND: Duration = Duration::from_secs(5);
/// How long the duplicate is given to reach its wait before the first attempt finishes: 1 to
/// 29 ms, spread over the rounds so that a waiter that polls is caught at every phase of its
/// polling interval.
fn head_start(round: usize) -> Duration {
    Duration::from_millis(1 + (round as u64 * 7919) % 29)
}

fn bench_dir() -> tempfile::TempDir {
    let base = std::env::var_os("IDEMDB_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
    std::fs::create_dir_all(&base).expect("create the bench directory");
    tempfile::tempdir_in(base).expect("a temporary directory")
}

/// The blocking gateway, one sample per round.
fn gateway_rounds(store: &Store, other: &Store) -> Vec<Sample> {
    let gateway = Gateway::builder(store.clone())
        .wait_for_in_flight(WAIT_BOUND)
        .build();
    let other_gateway = Gateway::builder(other.clone())
        .wait_for_in_flight(WAIT_BOUND)
        .build();
    let mut out = Vec::with_capacity(ROUNDS);
    for round in 0..ROUNDS {
        let key = ToolCallKey::new("bench", u64::try_from(round).unwrap_or(0), "create");
        let (release, released) = mpsc::channel::<()>();
        let (started, start) = mpsc::channel::<()>();
        let t0 = Arc::new(Mutex::new(None::<Instant>));
        let first = {
            let (gateway, key, t0) = (gateway.clone(), key.clone(), Arc::clone(&t0));
            std::thread::spawn(move || {
                let outcome = gateway
                    .call("tenant", &key, b"{}", |_ctx| {
                        started.send(()).expect("the bench waits for this");
                        released.recv().expect("the bench releases the tool");
                        *t0.lock().expect("not poisoned") = Some(Instant::now());
                        Ok(b"done".to_vec())
                    })
                    .expect("the first attempt runs");
                (Instant::now(), outcome)
            })
        };
        start.recv().expect("the tool started");
        let duplicate = {
            let (gateway, key) = (other_gateway.clone(), key.clone());
            std::thread::spawn(move || {
                let outcome = gateway
                    .call("tenant", &key, b"{}", |_ctx| Ok(b"twice".to_vec()))
                    .expect("the duplicate is answered");
                (Instant::now(), outcome)
            })
        };
        std::thread::sleep(head_start(round));
        release.send(()).expect("the tool waits for this");
        let (t_first, _) = first.join().expect("the first attempt finishes");
        let (t1, outcome) = duplicate.join().expect("the duplicate finishes");
        assert!(
            matches!(outcome, Outcome::Replayed { .. }),
            "the duplicate waits for the replay, got {outcome:?}"
        );
        let t0 = t0.lock().expect("not poisoned").expect("the tool ran");
        out.push(Sample::new(t0, t_first, t1));
    }
    out
}

/// The HTTP layer, called as a tower service on a multi-thread tokio runtime.
fn http_rounds(store: &Store, other: &Store) -> Vec<Sample> {
    type Gate = Arc<Mutex<Option<tokio::sync::oneshot::Receiver<()>>>>;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let gate: Gate = Arc::new(Mutex::new(None));
    let t0 = Arc::new(Mutex::new(None::<Instant>));
    let handler = {
        let (gate, t0) = (Arc::clone(&gate), Arc::clone(&t0));
        move |_body: Bytes| {
            let (gate, t0) = (Arc::clone(&gate), Arc::clone(&t0));
            async move {
                let rx = gate.lock().expect("not poisoned").take();
                if let Some(rx) = rx {
                    let _ = rx.await;
                }
                *t0.lock().expect("not poisoned") = Some(Instant::now());
                (StatusCode::CREATED, "paid")
            }
        }
    };
    let router_on = |store: &Store| {
        let layer = IdempotencyLayer::builder(store.clone(), |_parts| Some("tenant".to_owned()))
            .wait_for_in_flight(WAIT_BOUND)
            .build();
        Router::new()
            .route("/v1/payments", post(handler.clone()))
            .layer(layer)
    };
    let (router, other_router) = (router_on(store), router_on(other));
    let request = |key: &str| {
        Request::builder()
            .method("POST")
            .uri("/v1/payments")
            .header("idempotency-key", key)
            .body(Body::from("{}"))
            .expect("a valid request")
    };
    let mut out = Vec::with_capacity(ROUNDS);
    for round in 0..ROUNDS {
        let key = format!("http-{round}");
        let (release, gated) = tokio::sync::oneshot::channel();
        *gate.lock().expect("not poisoned") = Some(gated);
        let first = {
            let mut router = router.clone();
            let req = request(&key);
            rt.spawn(async move {
                let response = router.call(req).await;
                (Instant::now(), response)
            })
        };
        // The first attempt holds its claim once its handler took the gate.
        while gate.lock().expect("not poisoned").is_some() {
            std::thread::sleep(Duration::from_micros(100));
        }
        let duplicate = {
            let mut router = other_router.clone();
            let req = request(&key);
            rt.spawn(async move {
                let response = router.call(req).await.expect("infallible");
                let t1 = Instant::now();
                let status = response.status();
                let body = response.into_body().collect().await.map(|b| b.to_bytes());
                (t1, status, body.ok())
            })
        };
        std::thread::sleep(head_start(round));
        release.send(()).expect("the handler waits");
        let (t_first, response) = rt.block_on(first).expect("the first attempt finishes");
        response.expect("infallible");
        let (t1, status, body) = rt.block_on(duplicate).expect("the duplicate finishes");
        assert_eq!(status, StatusCode::CREATED, "the duplicate gets the replay");
        assert_eq!(body.as_deref(), Some(&b"paid"[..]));
        let t0 = t0
            .lock()
            .expect("not poisoned")
            .take()
            .expect("the handler ran");
        out.push(Sample::new(t0, t_first, t1));
    }
    out
}

/// One round, in microseconds from the first attempt's result.
struct Sample {
    /// Until the first attempt itself returned (its completion's fsync included).
    first: f64,
    /// Until the waiting duplicate held the replay.
    duplicate: f64,
}

impl Sample {
    fn new(result: Instant, first: Instant, duplicate: Instant) -> Sample {
        let micros = |t: Instant| t.saturating_duration_since(result).as_secs_f64() * 1e6;
        Sample {
            first: micros(first),
            duplicate: micros(duplicate),
        }
    }
}

/// The nearest-rank percentile `p` (0..=100) of sorted samples.
fn percentile(sorted: &[f64], p: usize) -> f64 {
    sorted[(p * (sorted.len() - 1) + 50) / 100]
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs it with no arguments and only
    // wants to see it start.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let dir = bench_dir();
    let store = Store::open(dir.path().join("wait.idem")).expect("open the store");
    println!("waiting duplicate: time from the first attempt's result to the duplicate's replay");
    println!("{ROUNDS} rounds each, store on {}\n", dir.path().display());
    println!(
        "| store | wait mode | from the result to | p50 µs | p90 µs | p99 µs | max µs | mean µs |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    print_rows("file", &store, &store);
    drop(store);
    // Beside `scripts/with-postgres`: the first attempt on one replica, the duplicate on
    // another, in a schema of this run's own.
    #[cfg(feature = "postgres")]
    if let Ok(url) = std::env::var("IDEMDB_PG_URL") {
        let schema = format!("wait_bench_{}", std::process::id());
        let replica = |owner: &str| {
            Store::builder()
                .schema(schema.clone())
                .owner(owner)
                .connect(&url)
                .expect("connect")
        };
        print_rows("PostgreSQL, 2 replicas", &replica("a"), &replica("b"));
    }
}

/// The table's rows for one store: the first attempts on `store`, the duplicates on `other`.
fn print_rows(engine: &str, store: &Store, other: &Store) {
    for (name, samples) in [
        ("agent gateway (blocking)", gateway_rounds(store, other)),
        ("HTTP layer (async)", http_rounds(store, other)),
    ] {
        for (what, pick) in [
            (
                "the first attempt's return",
                (|s: &Sample| s.first) as fn(&Sample) -> f64,
            ),
            ("the duplicate's replay", |s: &Sample| s.duplicate),
        ] {
            let mut v: Vec<f64> = samples.iter().map(pick).collect();
            v.sort_by(f64::total_cmp);
            let mean = v.iter().sum::<f64>() / v.len() as f64;
            println!(
                "| {engine} | {name} | {what} | {:.0} | {:.0} | {:.0} | {:.0} | {mean:.0} |",
                percentile(&v, 50),
                percentile(&v, 90),
                percentile(&v, 99),
                percentile(&v, 100),
            );
        }
    }
}
