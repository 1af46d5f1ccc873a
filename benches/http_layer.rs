//! What the `Idempotency-Key` layer adds to a request, over the same axum handler without it.
//!
//! Run with `cargo bench --bench http_layer` (about a minute and a half).
//!
//! No sockets: each iteration builds a request and calls the axum `Router` as a tower
//! `Service` (`poll_ready`, then `call`), collects the response body, on a tokio current-thread
//! runtime. The handler is the same trivial JSON handler in every case, so the difference
//! between `layer` and `no_layer` in a group is the layer's cost per request.
//!
//! - `first_request`: a new key every iteration: read the body, fingerprint it, claim the key
//!   (one fsync), run the handler, store the response (a second fsync). The store file lives in
//!   a fresh temporary directory under Cargo's `CARGO_TARGET_TMPDIR` (`target/tmp`, the build's
//!   disk; `/dev/shm` or a tmpfs `/tmp` would make the fsyncs free). Set `IDEMDB_BENCH_DIR` to
//!   measure another disk. Expect this group to be dominated by the disk's fsync latency;
//!   `store_only` (the same claim and completion through the store's async API, no HTTP) is
//!   there so the layer's own share can be read: `layer - store_only - no_layer`.
//! - `replay`: the same key every iteration: the layer answers from the store (an in-memory
//!   index lookup and a read of the stored response) and the handler never runs.
//! - `no_key_passthrough`: a `GET` without a key, which the layer does not guard: the cost of
//!   passing through.

use axum::body::{Body, Bytes};
use axum::http::{Request, Response, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use criterion::{BatchSize, Criterion, SamplingMode};
use http_body_util::BodyExt;
use idemdb::http::IdempotencyLayer;
use idemdb::{Claim, Fingerprint, Scope, Store};
use std::path::PathBuf;
use std::time::Duration;
use tower::Service;

const BODY: &str = r#"{"amount":5000,"currency":"usd","customer":"cus_abc"}"#;

async fn pay(body: Bytes) -> impl IntoResponse {
    let reply = format!(
        r#"{{"id":"pay_1","status":"succeeded","bytes":{}}}"#,
        body.len()
    );
    (
        StatusCode::CREATED,
        [("content-type", "application/json")],
        reply,
    )
}

fn handler_only() -> Router {
    Router::new().route("/v1/payments", post(pay).get(pay))
}

fn with_layer(store: Store) -> Router {
    let layer = IdempotencyLayer::builder(store, |parts| {
        parts
            .headers
            .get("x-api-key")?
            .to_str()
            .ok()
            .map(str::to_owned)
    })
    .build();
    handler_only().layer(layer)
}

fn request(method: &str, key: Option<&str>) -> Request<Body> {
    let mut builder = Request::builder()
        .method(method)
        .uri("/v1/payments")
        .header("x-api-key", "tenant-bench")
        .header("content-type", "application/json");
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    builder.body(Body::from(BODY)).expect("a valid request")
}

/// One request through `router` as a tower service, its response body collected.
async fn call(router: &mut Router, req: Request<Body>) -> (Response<()>, Bytes) {
    std::future::poll_fn(|cx| Service::<Request<Body>>::poll_ready(router, cx))
        .await
        .expect("infallible");
    let response = router.call(req).await.expect("infallible");
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.expect("a full body").to_bytes();
    (Response::from_parts(parts, ()), bytes)
}

fn bench_dir() -> tempfile::TempDir {
    let base = std::env::var_os("IDEMDB_BENCH_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")), PathBuf::from);
    std::fs::create_dir_all(&base).expect("create the bench directory");
    tempfile::tempdir_in(base).expect("a temporary directory")
}

fn http_layer(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let dir = bench_dir();
    let store = Store::open(dir.path().join("bench.idem")).expect("open the store");
    let mut guarded = with_layer(store.clone());
    let mut plain = handler_only();

    // Check once that each case does what it is meant to measure.
    let (first, first_body) = rt.block_on(call(&mut guarded, request("POST", Some("check-1"))));
    assert_eq!(first.status(), StatusCode::CREATED);
    let (again, _) = rt.block_on(call(&mut guarded, request("POST", Some("check-1"))));
    assert!(again.headers().contains_key("idempotent-replayed"));
    let (get, _) = rt.block_on(call(&mut guarded, request("GET", None)));
    assert!(!get.headers().contains_key("idempotent-replayed"));

    let mut group = c.benchmark_group("first_request");
    // Milliseconds per iteration when fsyncs are slow: equal-sized samples keep the group
    // within its measurement time.
    group.sampling_mode(SamplingMode::Flat).sample_size(50);
    let mut n = 0u64;
    group.bench_function("layer", |b| {
        b.iter_batched(
            || {
                n += 1;
                request("POST", Some(&format!("first-{n}")))
            },
            |req| {
                let (response, _) = rt.block_on(call(&mut guarded, req));
                assert_eq!(response.status(), StatusCode::CREATED);
            },
            BatchSize::SmallInput,
        );
    });
    group.bench_function("no_layer", |b| {
        b.iter_batched(
            || {
                n += 1;
                request("POST", Some(&format!("first-{n}")))
            },
            |req| rt.block_on(call(&mut plain, req)),
            BatchSize::SmallInput,
        );
    });
    // The same two durable writes without HTTP: what `layer` minus `no_layer` is mostly made of.
    let scope = Scope::new("tenant-bench", "POST /v1/payments");
    group.bench_function("store_only", |b| {
        b.iter_batched(
            || {
                n += 1;
                format!("first-{n}")
            },
            |key| {
                rt.block_on(async {
                    let fingerprint = Fingerprint::of(BODY.as_bytes());
                    let Ok(Claim::Acquired(ticket)) =
                        store.claim_async(&scope, &key, fingerprint).await
                    else {
                        panic!("a new key is acquired");
                    };
                    let response = idemdb::Response::new(201, first_body.to_vec())
                        .with_header("content-type", "application/json");
                    store
                        .complete_async(ticket, response)
                        .await
                        .expect("complete");
                });
            },
            BatchSize::SmallInput,
        );
    });
    group.finish();

    let mut group = c.benchmark_group("replay");
    group.bench_function("layer", |b| {
        b.iter_batched(
            || request("POST", Some("check-1")),
            |req| {
                let (response, _) = rt.block_on(call(&mut guarded, req));
                debug_assert!(response.headers().contains_key("idempotent-replayed"));
                response
            },
            BatchSize::SmallInput,
        );
    });
    group.bench_function("no_layer", |b| {
        b.iter_batched(
            || request("POST", Some("check-1")),
            |req| rt.block_on(call(&mut plain, req)),
            BatchSize::SmallInput,
        );
    });
    group.finish();

    let mut group = c.benchmark_group("no_key_passthrough");
    group.bench_function("layer", |b| {
        b.iter_batched(
            || request("GET", None),
            |req| rt.block_on(call(&mut guarded, req)),
            BatchSize::SmallInput,
        );
    });
    group.bench_function("no_layer", |b| {
        b.iter_batched(
            || request("GET", None),
            |req| rt.block_on(call(&mut plain, req)),
            BatchSize::SmallInput,
        );
    });
    group.finish();

    let stats = store.stats();
    assert_eq!(stats.acquired, stats.completes, "every claim completed");
    eprintln!(
        "store: {} claims, {} completions, {} commits (fsyncs)",
        stats.acquired, stats.completes, stats.commit_batches
    );
}

fn main() {
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(8))
        .configure_from_args();
    http_layer(&mut c);
    c.final_summary();
}
