//! A payment API behind the `Idempotency-Key` layer, driven by a client that retries.
//!
//! ```text
//! cargo run --release --features http,metrics --example axum_payments
//! ```
//!
//! The server is an axum app with one route, `POST /v1/payments` (`{"amount": 5000,
//! "currency": "usd"}`), whose handler charges a fake card processor. The tenant is the
//! `x-api-key` header. Everything idempotency-related is the layer, a few lines in `main`.
//!
//! The program starts the server on 127.0.0.1 (a free port) and then plays the client: a new
//! payment, its retry (replayed, not charged again), a payment whose response is really lost
//! (the client times out; the server finishes anyway and the retry gets the stored response), a
//! duplicate sent while the first is still processing (409), the same key reused for another
//! amount (422), and a processor outage (503: the key is released, so the retry after the
//! outage charges). It prints each exchange and
//! exits non-zero unless the processor charged exactly once per logical payment.
//!
//! The server also serves the store's metrics at `GET /metrics` in Prometheus's text format
//! (feature `metrics`, rendered by `metrics-exporter-prometheus` without a listener of its own);
//! the client scrapes it at the end and checks that the claim counters add up.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use idemdb::http::IdempotencyLayer;
use idemdb::Store;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde_json::{json, Value};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The fake card processor: it counts charges, takes a moment per charge, and can be down.
#[derive(Default)]
struct Processor {
    charges: AtomicU32,
    started: AtomicU32,
    down: AtomicBool,
}

const PROCESSING: Duration = Duration::from_millis(150);

async fn create_payment(
    State(processor): State<Arc<Processor>>,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let amount = body["amount"].as_u64().filter(|&a| a > 0);
    let currency = body["currency"].as_str().filter(|c| c.len() == 3);
    let (Some(amount), Some(currency)) = (amount, currency) else {
        // Deterministic: a property of the request, so the layer stores and replays it.
        let error = json!({"error": "amount must be a positive integer, currency a 3-letter code"});
        return (StatusCode::UNPROCESSABLE_ENTITY, Json(error));
    };
    processor.started.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(PROCESSING).await;
    if processor.down.load(Ordering::SeqCst) {
        // Transient: a property of the moment, so the layer releases the key.
        let error = json!({"error": "card processor unavailable, retry later"});
        return (StatusCode::SERVICE_UNAVAILABLE, Json(error));
    }
    let n = processor.charges.fetch_add(1, Ordering::SeqCst) + 1;
    let payment = json!({"id": format!("ch_{n}"), "amount": amount, "currency": currency, "status": "succeeded"});
    (StatusCode::CREATED, Json(payment))
}

/// The server: the route, the idempotency layer over a store file, and `/metrics` (outside the
/// layer).
fn app(store: Store, processor: Arc<Processor>, metrics: PrometheusHandle) -> Router {
    let idempotency = IdempotencyLayer::builder(store, |parts| {
        let api_key = parts.headers.get("x-api-key")?.to_str().ok()?;
        Some(api_key.to_owned())
    })
    // A handler whose client hung up still finishes, and its response is stored for the retry.
    .spawner(|handler| {
        tokio::spawn(handler);
    })
    .build();
    Router::new()
        .route("/v1/payments", post(create_payment))
        .with_state(processor)
        .layer(idempotency)
        .route(
            "/metrics",
            get(move || std::future::ready(metrics.render())),
        )
}

// ---------------------------------------------------------------------------------------------
// The client.

struct Client {
    base: String,
    agent: ureq::Agent,
}

/// A response as the client saw it.
struct Reply {
    status: u16,
    replayed: bool,
    retry_after: Option<String>,
    body: String,
}

impl Client {
    /// Sends one payment and prints the exchange, labelled `who`.
    fn pay(&self, who: &str, key: &str, amount: u64) -> Result<Reply, ureq::Error> {
        self.pay_within(who, key, amount, Duration::from_secs(10))
    }

    /// [`Client::pay`], giving up after `timeout`.
    fn pay_within(
        &self,
        who: &str,
        key: &str,
        amount: u64,
        timeout: Duration,
    ) -> Result<Reply, ureq::Error> {
        let body = format!(r#"{{"amount":{amount},"currency":"usd"}}"#);
        let sent = self
            .agent
            .post(&format!("{}/v1/payments", self.base))
            .header("x-api-key", "sk_test_acme")
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .config()
            .timeout_global(Some(timeout))
            .build()
            .send(&body);
        let mut response = match sent {
            Ok(response) => response,
            Err(e) => {
                println!("   {who:<9} key={key:<10} amount={amount:<5} -> no response ({e})");
                return Err(e);
            }
        };
        let header = |name: &str| {
            let value = response.headers().get(name)?.to_str().ok()?;
            Some(value.to_owned())
        };
        let replayed = header("idempotent-replayed").is_some_and(|v| v == "true");
        let retry_after = header("retry-after");
        let problem = header("content-type").is_some_and(|t| t == "application/problem+json");
        let reply = Reply {
            status: response.status().as_u16(),
            replayed,
            retry_after,
            body: response.body_mut().read_to_string()?,
        };
        let mut notes = String::new();
        if reply.replayed {
            notes.push_str(" Idempotent-Replayed: true");
        }
        if let Some(after) = &reply.retry_after {
            notes.push_str(&format!(" Retry-After: {after}"));
        }
        let shown = if problem {
            // An RFC 9457 problem: its type's last segment and its title are enough here.
            let doc: Value = serde_json::from_str(&reply.body).unwrap_or_default();
            let kind = doc["type"].as_str().unwrap_or("").rsplit('/').next();
            format!("problem {} ({})", kind.unwrap_or(""), doc["title"])
        } else {
            reply.body.clone()
        };
        println!(
            "   {who:<9} key={key:<10} amount={amount:<5} -> {}{notes}  {shown}",
            reply.status
        );
        Ok(reply)
    }
}

fn ensure(ok: bool, what: &str) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(format!("check failed: {what}"))
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    // The recorder goes in before the store opens: a store registers its metrics as it opens.
    let metrics = PrometheusBuilder::new().install_recorder()?;
    let dir = tempfile::tempdir()?;
    let store = Store::builder()
        .name("payments")
        .open(dir.path().join("payments.idem"))?;
    let processor = Arc::new(Processor::default());

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let addr = listener.local_addr()?;
    let server = app(store, Arc::clone(&processor), metrics);
    rt.spawn(async move { axum::serve(listener, server).await });
    println!("payment API on http://{addr}\n");

    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let client = Client {
        base: format!("http://{addr}"),
        agent,
    };
    let mut payments = 0;

    println!("1. a new payment");
    let first = client.pay("request", "order-1001", 5000)?;
    ensure(
        first.status == 201 && !first.replayed,
        "the payment is created",
    )?;
    payments += 1;

    println!("2. the client retries it (say its response was lost)");
    let retry = client.pay("retry", "order-1001", 5000)?;
    ensure(
        retry.status == 201 && retry.replayed,
        "the retry is a replay",
    )?;
    ensure(retry.body == first.body, "the replay is the same payment")?;

    println!("3. a response really is lost: the client gives up before the server answers");
    let lost = client.pay_within("request", "order-1002", 3000, PROCESSING / 3);
    ensure(lost.is_err(), "the client timed out")?;
    // The server finishes the charge anyway; the client backs off and retries with the same key.
    let mut attempts = 0;
    let retry = loop {
        std::thread::sleep(PROCESSING);
        attempts += 1;
        let retry = client.pay("retry", "order-1002", 3000)?;
        if retry.status != 409 || attempts == 20 {
            break retry;
        }
    };
    ensure(
        retry.status == 201 && retry.replayed,
        "the lost response is replayed",
    )?;
    payments += 1;

    println!("4. a duplicate arrives while the first is still processing");
    let (original, duplicate) = std::thread::scope(|s| {
        let before = processor.started.load(Ordering::SeqCst);
        let original = s.spawn(|| client.pay("original", "order-1003", 1250));
        while processor.started.load(Ordering::SeqCst) == before {
            std::thread::sleep(Duration::from_millis(2));
        }
        let duplicate = client.pay("duplicate", "order-1003", 1250);
        (original.join().expect("client thread"), duplicate)
    });
    let (original, duplicate) = (original?, duplicate?);
    ensure(original.status == 201, "the original is created")?;
    ensure(duplicate.status == 409, "the duplicate gets 409")?;
    ensure(
        duplicate.retry_after.is_some(),
        "the 409 says when to retry",
    )?;
    payments += 1;

    println!("5. a client bug: the first key reused for another amount");
    let reused = client.pay("reuse", "order-1001", 9900)?;
    ensure(reused.status == 422, "a reused key is refused")?;

    println!("6. the card processor goes down, then comes back");
    processor.down.store(true, Ordering::SeqCst);
    let outage = client.pay("outage", "order-1004", 700)?;
    ensure(outage.status == 503, "the outage is reported")?;
    processor.down.store(false, Ordering::SeqCst);
    let after = client.pay("retry", "order-1004", 700)?;
    ensure(
        after.status == 201 && !after.replayed,
        "the key was released: the retry charges",
    )?;
    payments += 1;

    let charges = processor.charges.load(Ordering::SeqCst);
    println!("\nlogical payments: {payments}, charges: {charges}");
    ensure(charges == payments, "one charge per logical payment")?;

    println!("\n7. what GET /metrics says (the idemdb counters)");
    let text = client
        .agent
        .get(&format!("{}/metrics", client.base))
        .call()?
        .body_mut()
        .read_to_string()?;
    let counter = |series: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or(0.0)
    };
    for line in text
        .lines()
        .filter(|l| l.starts_with("idemdb_") && l.contains("_total"))
    {
        println!("   {line}");
    }
    // Every logical payment acquired its key once, and the outage's key once more.
    let acquired = counter(r#"idemdb_claims_total{store="payments",decision="acquired"}"#);
    ensure(acquired == (payments + 1) as f64, "claims acquired")?;
    let completes = counter(r#"idemdb_completes_total{store="payments"}"#);
    ensure(completes == payments as f64, "one completion per payment")?;
    let releases = counter(r#"idemdb_releases_total{store="payments"}"#);
    ensure(releases == 1.0, "the outage's key was released")?;
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => {
            println!("ok: every payment charged exactly once");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}
