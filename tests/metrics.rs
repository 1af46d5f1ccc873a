//! The `metrics` feature end to end: a Prometheus recorder installed in the process, an axum
//! server with the idempotency layer on 127.0.0.1, real requests over a real socket (ureq),
//! and `/metrics` scraped over the socket. The counts must move by exactly what the requests
//! did; the maintenance counters, halts and heals are driven through the store itself.
//!
//! Every test names its store, so that each reads its own series (`store` label) from the one
//! recorder the process has.
#![cfg(all(feature = "metrics", feature = "http"))]

use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::Router;
use idemdb::http::IdempotencyLayer;
use idemdb::{ManualClock, Resolution, Response, Store};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;

mod observed;

/// The process's one recorder, installed by the first test that asks.
fn recorder() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        PrometheusBuilder::new()
            .install_recorder()
            .expect("install the Prometheus recorder")
    })
}

/// One sample of the Prometheus text format: name, labels, value.
type Sample = (String, BTreeMap<String, String>, f64);

/// Parses the text format's sample lines (`name{k="v",...} value`).
fn parse(text: &str) -> Vec<Sample> {
    let mut samples = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line.rsplit_once(' ').expect("a sample line");
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => (name, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        let labels = labels
            .split(',')
            .filter(|l| !l.is_empty())
            .map(|l| {
                let (k, v) = l.split_once('=').expect("a label");
                (k.to_owned(), v.trim_matches('"').to_owned())
            })
            .collect();
        samples.push((name.to_owned(), labels, value.parse().expect("a number")));
    }
    samples
}

/// The sum of the samples of `name` whose labels include `labels`; 0 when there are none.
fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|(n, l, _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, _, v)| v)
        .sum()
}

/// The `# TYPE` the exposition gives `name`.
fn kind<'t>(text: &'t str, name: &str) -> Option<&'t str> {
    let prefix = format!("# TYPE {name} ");
    text.lines().find_map(|l| l.strip_prefix(prefix.as_str()))
}

async fn pay(body: String) -> (StatusCode, String) {
    (StatusCode::CREATED, format!("charged for {}", body.len()))
}

/// Claims `n` new keys, `retries` retries and one reused key over HTTP, scraping `/metrics`
/// over the socket before and after.
#[test]
fn counts_move_by_exactly_what_the_requests_did_over_http() {
    const STORE: &str = "http";
    let handle = recorder().clone();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::builder()
        .name(STORE)
        .open(dir.path().join("metrics.idem"))
        .unwrap();
    let layer = IdempotencyLayer::builder(store, |parts| {
        Some(parts.headers.get("x-api-key")?.to_str().ok()?.to_owned())
    })
    .build();
    let app = Router::new()
        .route("/v1/payments", post(pay))
        .layer(layer)
        .route("/metrics", get(move || std::future::ready(handle.render())));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    rt.spawn(async move { axum::serve(listener, app).await });
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let post = |key: &str, body: &str| {
        let response = agent
            .post(&format!("{base}/v1/payments"))
            .header("x-api-key", "tenant_metrics")
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .send(body)
            .unwrap();
        response.status().as_u16()
    };
    let scrape = || {
        let text = agent
            .get(&format!("{base}/metrics"))
            .call()
            .unwrap()
            .body_mut()
            .read_to_string()
            .unwrap();
        (parse(&text), text)
    };

    let (before, _) = scrape();
    const NEW: usize = 5;
    const RETRIES: usize = 3;
    for i in 0..NEW {
        assert_eq!(post(&format!("key-{i}"), r#"{"amount":100}"#), 201);
    }
    for i in 0..RETRIES {
        assert_eq!(post(&format!("key-{i}"), r#"{"amount":100}"#), 201);
    }
    assert_eq!(post("key-0", r#"{"amount":999}"#), 422);
    let (after, text) = scrape();

    let s = [("store", STORE)];
    let delta = |name: &str, labels: &[(&str, &str)]| {
        let labels: Vec<_> = s.iter().chain(labels).copied().collect();
        value(&after, name, &labels) - value(&before, name, &labels)
    };
    let claims = |decision| delta("idemdb_claims_total", &[("decision", decision)]);
    assert_eq!(claims("acquired"), NEW as f64);
    assert_eq!(claims("replay"), RETRIES as f64);
    assert_eq!(claims("mismatch"), 1.0);
    assert_eq!(claims("in_progress"), 0.0);
    assert_eq!(delta("idemdb_completes_total", &[]), NEW as f64);
    assert_eq!(delta("idemdb_releases_total", &[]), 0.0);
    assert_eq!(
        delta("idemdb_claim_duration_seconds_count", &[]),
        (NEW + RETRIES + 1) as f64
    );
    // Each acquired claim and each completion is in some batch; a batch holds at least one.
    let batched = delta("idemdb_commit_batch_size_sum", &[]);
    assert!(batched >= (2 * NEW) as f64, "ops committed: {batched}");
    assert!(delta("idemdb_commit_batch_size_count", &[]) >= 1.0);
    assert!(delta("idemdb_fsync_duration_seconds_count", &[]) >= 1.0);
    // The gauges, as the last commit left them.
    assert_eq!(value(&after, "idemdb_live_records", &s), NEW as f64);
    assert_eq!(value(&after, "idemdb_in_progress_records", &s), 0.0);
    assert_eq!(value(&after, "idemdb_stale_claims", &s), 0.0);
    let file = |f| {
        value(
            &after,
            "idemdb_file_bytes",
            &[("store", STORE), ("file", f)],
        )
    };
    assert!(file("store") > 0.0 && file("journal") > 0.0);

    for (name, kinds) in [
        ("idemdb_claims_total", &["counter"][..]),
        ("idemdb_completes_total", &["counter"]),
        ("idemdb_releases_total", &["counter"]),
        ("idemdb_takeovers_total", &["counter"]),
        ("idemdb_reaped_total", &["counter"]),
        ("idemdb_purged_total", &["counter"]),
        ("idemdb_halts_total", &["counter"]),
        ("idemdb_heals_total", &["counter"]),
        ("idemdb_checkpoints_total", &["counter"]),
        // The exporter renders histograms as summaries unless given buckets.
        ("idemdb_claim_duration_seconds", &["summary", "histogram"]),
        ("idemdb_commit_batch_size", &["summary", "histogram"]),
        ("idemdb_fsync_duration_seconds", &["summary", "histogram"]),
        ("idemdb_live_records", &["gauge"]),
        ("idemdb_in_progress_records", &["gauge"]),
        ("idemdb_stale_claims", &["gauge"]),
        ("idemdb_file_bytes", &["gauge"]),
    ] {
        let found = kind(&text, name);
        assert!(
            found.is_some_and(|k| kinds.contains(&k)),
            "{name}: type {found:?}"
        );
        assert!(
            text.contains(&format!("# HELP {name} ")),
            "{name} has no description"
        );
    }
    drop(rt);
}

/// The counters the HTTP test cannot reach: takeovers, releases, reaps, purges, and the
/// gauges they move.
#[test]
fn takeovers_releases_reaps_and_purges_are_counted() {
    const STORE: &str = "maintenance";
    let handle = recorder();
    let clock = ManualClock::new();
    let store = observed::on_clock(STORE, &clock);
    let acquire = |key: &str| observed::acquire(&store, key);
    let read = |name: &str| value(&parse(&handle.render()), name, &[("store", STORE)]);

    drop(acquire("taken-over"));
    drop(acquire("reaped"));
    drop(acquire("kept"));
    store.release(acquire("released")).unwrap();
    assert_eq!(read("idemdb_in_progress_records"), 3.0);
    clock.advance(Duration::from_secs(61));
    let ticket = acquire("taken-over");
    assert!(ticket.takeover().is_some());
    store.complete(ticket, Response::new(200, "ok")).unwrap();
    let resolved = store
        .reap(|stale| match stale.key.as_str() {
            "kept" => Resolution::Keep,
            _ => Resolution::Release,
        })
        .unwrap();
    assert_eq!(resolved, 1);
    clock.advance(Duration::from_secs(7200));
    assert_eq!(store.purge_expired().unwrap(), 1);

    assert_eq!(read("idemdb_takeovers_total"), 1.0);
    assert_eq!(read("idemdb_releases_total"), 1.0);
    assert_eq!(read("idemdb_completes_total"), 1.0);
    assert_eq!(read("idemdb_reaped_total"), 1.0);
    assert_eq!(read("idemdb_purged_total"), 1.0);
    // Left: the kept claim, stale, as the reap found it.
    assert_eq!(read("idemdb_stale_claims"), 1.0);
    assert_eq!(read("idemdb_in_progress_records"), 1.0);
    assert_eq!(read("idemdb_live_records"), 1.0);
}

/// A failed sync halts the store (counted), and the heal that follows is counted too.
#[test]
fn a_halt_and_its_heal_are_counted() {
    const STORE: &str = "heal";
    let handle = recorder();
    let _healed = observed::halted_then_healed(STORE);
    let read = |name: &str| value(&parse(&handle.render()), name, &[("store", STORE)]);
    assert_eq!(read("idemdb_halts_total"), 1.0);
    assert_eq!(read("idemdb_heals_total"), 1.0);
    // The healed store counted its records again from the file: "a" is an orphan now.
    assert_eq!(read("idemdb_in_progress_records"), 1.0);
}
