//! The HTTP layer end to end: an axum server on 127.0.0.1 and a real HTTP client (ureq), one
//! fresh connection per request. Each test is named after the rule it checks.
//!
//! The handler under test is a fake payment processor: it charges (counts an execution) as
//! soon as it runs, then does its slow part (an optional delay), then answers with the status
//! its script says (201 by default). Everything the layer promises is checked from the
//! outside: status, headers and body on the wire, plus the processor's execution count and the
//! store's counters.

#![cfg(feature = "http")]

#[macro_use]
mod engines;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use engines::Backend;
use idemdb::http::{IdempotencyLayer, IdempotencyLayerBuilder};
use idemdb::Store;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

const IN_PROGRESS: &str = "https://idemdb.dev/problems/idempotency-key-in-progress";
const MISMATCH: &str = "https://idemdb.dev/problems/idempotency-key-reused";
const MISSING_KEY: &str = "https://idemdb.dev/problems/idempotency-key-missing";
const MALFORMED_KEY: &str = "https://idemdb.dev/problems/idempotency-key-malformed";
const REPEATED_KEY: &str = "https://idemdb.dev/problems/idempotency-key-repeated";
const NO_TENANT: &str = "https://idemdb.dev/problems/tenant-unknown";
const BODY_TOO_LARGE: &str = "https://idemdb.dev/problems/request-body-too-large";
const HANDLER_PANICKED: &str = "https://idemdb.dev/problems/handler-panicked";

const PAYMENT: &str = r#"{"amount":5000,"currency":"usd"}"#;

// ---------------------------------------------------------------------------------------------
// The server side: a fake processor behind the layer.

/// What the processor does on one execution.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// Charge, wait `delay`, answer `status`.
    Answer { status: u16, delay: Duration },
    /// Charge, then panic.
    Panic,
}

#[derive(Clone, Default)]
struct Processor {
    /// Executions (charges) started.
    executions: Arc<AtomicU32>,
    /// Executions that ran to their answer.
    finished: Arc<AtomicU32>,
    /// The bodies answered, in order.
    answered: Arc<Mutex<Vec<Vec<u8>>>>,
    /// Steps for the next executions; when empty, `Answer { 201, default_delay }`.
    script: Arc<Mutex<VecDeque<Step>>>,
    default_delay: Duration,
}

impl Processor {
    fn with_delay(delay: Duration) -> Processor {
        Processor {
            default_delay: delay,
            ..Processor::default()
        }
    }

    fn script(self, steps: impl IntoIterator<Item = Step>) -> Processor {
        self.script.lock().unwrap().extend(steps);
        self
    }

    fn executions(&self) -> u32 {
        self.executions.load(Ordering::SeqCst)
    }

    fn finished(&self) -> u32 {
        self.finished.load(Ordering::SeqCst)
    }
}

fn answer(status: u16) -> Step {
    Step::Answer {
        status,
        delay: Duration::ZERO,
    }
}

async fn charge(State(p): State<Processor>, headers: HeaderMap, body: Bytes) -> Response {
    let n = p.executions.fetch_add(1, Ordering::SeqCst) + 1;
    let step = p.script.lock().unwrap().pop_front();
    let (status, delay) = match step {
        Some(Step::Panic) => panic!("the processor blew up (execution {n})"),
        Some(Step::Answer { status, delay }) => (status, delay),
        None => (201, p.default_delay),
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let tenant = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-");
    let request = String::from_utf8_lossy(&body);
    let out = format!(
        r#"{{"id":"pay_{n}","tenant":"{tenant}","status":{status},"request":{request:?}}}"#
    );
    p.answered.lock().unwrap().push(out.clone().into_bytes());
    p.finished.fetch_add(1, Ordering::SeqCst);
    (
        StatusCode::from_u16(status).unwrap(),
        [
            ("content-type", "application/json".to_owned()),
            ("x-charge-id", format!("pay_{n}")),
        ],
        out,
    )
        .into_response()
}

/// A handler with a mix of headers: some that must be replayed, some that must not.
async fn headers_handler(State(p): State<Processor>) -> Response {
    let n = p.executions.fetch_add(1, Ordering::SeqCst) + 1;
    let mut response = format!("made {n}").into_response();
    *response.status_mut() = StatusCode::CREATED;
    let h = response.headers_mut();
    h.insert("content-type", "text/plain; charset=utf-8".parse().unwrap());
    h.append("x-b", "b1".parse().unwrap());
    h.append("x-a", "a1".parse().unwrap());
    h.append("set-cookie", "session=s3cr3t; HttpOnly".parse().unwrap());
    h.append("x-a", "a2".parse().unwrap());
    h.append("link", "</v1/payments/1>; rel=self".parse().unwrap());
    h.append("x-a", "a3".parse().unwrap());
    h.append("set-cookie", "tracking=1".parse().unwrap());
    h.append("date", "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap());
    h.append("cache-control", "no-store".parse().unwrap());
    response
}

fn tenant_from_api_key(parts: &axum::http::request::Parts) -> Option<String> {
    parts
        .headers
        .get("x-api-key")?
        .to_str()
        .ok()
        .map(str::to_owned)
}

struct Server {
    base: String,
    store: Store,
    processor: Processor,
    _rt: tokio::runtime::Runtime,
}

fn serve(app: Router) -> (String, tokio::runtime::Runtime) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), rt)
}

/// `POST` and `GET /v1/payments` (the processor) and `POST /v1/headers`, behind a layer over
/// `store` configured by `configure`.
fn start(
    store: Store,
    processor: Processor,
    configure: impl FnOnce(IdempotencyLayerBuilder) -> IdempotencyLayerBuilder,
) -> Server {
    let layer = configure(IdempotencyLayer::builder(
        store.clone(),
        tenant_from_api_key,
    ))
    .build();
    let app = Router::new()
        .route("/v1/payments", post(charge).get(charge))
        .route("/v1/headers", post(headers_handler))
        .layer(layer)
        .with_state(processor.clone());
    let (base, rt) = serve(app);
    Server {
        base,
        store,
        processor,
        _rt: rt,
    }
}

fn start_default(backend: &Backend, processor: Processor) -> Server {
    start(backend.store(), processor, |b| b)
}

// ---------------------------------------------------------------------------------------------
// The client side.

/// One exchange as the client saw it.
#[derive(Clone, PartialEq, Eq)]
struct Reply {
    status: u16,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
}

impl std::fmt::Debug for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.status)?;
        for (name, value) in &self.headers {
            write!(f, " | {name}: {}", String::from_utf8_lossy(value))?;
        }
        write!(f, " | {}", String::from_utf8_lossy(&self.body))
    }
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| std::str::from_utf8(v).unwrap())
    }

    fn header_all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| std::str::from_utf8(v).unwrap())
            .collect()
    }

    fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }

    fn text(&self) -> &str {
        std::str::from_utf8(&self.body).unwrap()
    }

    /// The RFC 9457 problem `type`, after checking that this is a problem document whose
    /// `status` member matches the status line.
    fn problem_type(&self) -> String {
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "{self:?}"
        );
        let doc: serde_json::Value = serde_json::from_slice(&self.body).unwrap();
        assert_eq!(doc["status"], u64::from(self.status), "{doc}");
        assert!(doc["title"].is_string(), "{doc}");
        doc["type"].as_str().unwrap().to_owned()
    }

    /// Asserts a problem response with this status and type.
    fn assert_problem(&self, status: u16, kind: &str) {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(self.problem_type(), kind);
        assert!(!self.replayed());
    }

    /// The headers the handler chose: without those the HTTP stack adds on the way out
    /// (`date`, `content-length`) and without the replay marker.
    fn handler_headers(&self) -> Vec<(String, Vec<u8>)> {
        self.headers
            .iter()
            .filter(|(n, _)| {
                !matches!(
                    n.as_str(),
                    "date" | "content-length" | "idempotent-replayed"
                )
            })
            .cloned()
            .collect()
    }
}

/// A request to send; `send` opens a fresh connection for it.
struct Req {
    method: &'static str,
    url: String,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
    timeout: Duration,
    chunked: bool,
}

impl Req {
    /// `POST /v1/payments` for tenant `t-a` with `key` and the JSON body `body`.
    fn payment(server: &Server, key: &str, body: &str) -> Req {
        Req::new("POST", server, "/v1/payments")
            .tenant("t-a")
            .key(key)
            .json(body)
    }

    fn new(method: &'static str, server: &Server, path: &str) -> Req {
        Req {
            method,
            url: format!("{}{path}", server.base),
            headers: Vec::new(),
            body: Vec::new(),
            timeout: Duration::from_secs(10),
            chunked: false,
        }
    }

    fn header(mut self, name: &'static str, value: impl Into<String>) -> Req {
        self.headers.push((name, value.into()));
        self
    }

    fn tenant(self, tenant: &str) -> Req {
        self.header("x-api-key", tenant)
    }

    fn key(self, key: &str) -> Req {
        self.header("idempotency-key", key)
    }

    fn without(mut self, name: &str) -> Req {
        self.headers.retain(|(n, _)| *n != name);
        self
    }

    fn json(mut self, body: &str) -> Req {
        self.headers.retain(|(n, _)| *n != "content-type");
        self.body = body.as_bytes().to_vec();
        self.header("content-type", "application/json")
    }

    fn raw_body(mut self, body: Vec<u8>) -> Req {
        self.body = body;
        self
    }

    /// Sends the body with chunked transfer coding, without a `Content-Length`.
    fn chunked(mut self) -> Req {
        self.chunked = true;
        self
    }

    fn timeout(mut self, timeout: Duration) -> Req {
        self.timeout = timeout;
        self
    }

    fn try_send(&self) -> Result<Reply, ureq::Error> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(self.timeout))
            .max_idle_connections(0)
            .build()
            .into();
        let mut builder = ureq::http::Request::builder()
            .method(self.method)
            .uri(&self.url);
        for (name, value) in &self.headers {
            builder = builder.header(*name, value.as_bytes());
        }
        let mut response = if self.chunked {
            let mut reader = &self.body[..];
            agent.run(builder.body(ureq::SendBody::from_reader(&mut reader))?)?
        } else if self.body.is_empty() {
            agent.run(builder.body(())?)?
        } else {
            agent.run(builder.body(&self.body[..])?)?
        };
        let headers = response
            .headers()
            .iter()
            .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
            .collect();
        Ok(Reply {
            status: response.status().as_u16(),
            headers,
            body: response.body_mut().read_to_vec()?,
        })
    }

    fn send(&self) -> Reply {
        self.try_send()
            .unwrap_or_else(|e| panic!("{} {}: {e}", self.method, self.url))
    }
}

/// Waits (bounded) until `done` holds.
fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        thread::sleep(Duration::from_millis(5));
    }
}

/// Sends `req` from `n` threads released together by a barrier.
fn send_concurrently(n: usize, req: impl Fn() -> Req + Sync) -> Vec<Reply> {
    let barrier = Barrier::new(n);
    thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|_| {
                s.spawn(|| {
                    let req = req();
                    barrier.wait();
                    req.send()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

// ---------------------------------------------------------------------------------------------
// The seed's scenario: a timeout, then a retry.

on_every_engine! {
    fn smoke_a_retry_replays_the_first_response(b: Backend) {
        let server = start_default(&b, Processor::default());
        let first = Req::payment(&server, "\"k-1\"", PAYMENT).send();
        assert_eq!(first.status, 201);
        let second = Req::payment(&server, "\"k-1\"", PAYMENT).send();
        assert_eq!(second.status, 201);
        assert!(second.replayed());
        assert_eq!(second.body, first.body);
        assert_eq!(server.processor.executions(), 1);
    }
}

on_every_engine! {
    /// The first attempt charges, its client times out (the response is lost); the retry with the
    /// same key, after the first finished, gets the first attempt's response byte for byte, and
    /// the card is charged once. A retry while the first still runs gets 409. This needs the
    /// layer's spawner: hyper drops a request's future when its client disconnects, and the
    /// spawner is what lets the handler finish and its response be stored anyway.
    fn a_lost_response_is_replayed_to_the_retry_and_the_card_is_charged_once(b: Backend) {
        let server = start(
            b.store(),
            Processor::with_delay(Duration::from_millis(300)),
            |b| {
                b.spawner(|f| {
                    tokio::spawn(f);
                })
            },
        );
        let first = Req::payment(&server, "\"lost-1\"", PAYMENT).timeout(Duration::from_millis(100));
        let err = first
            .try_send()
            .expect_err("the client gives up after 100 ms");
        assert!(matches!(err, ureq::Error::Timeout(_)), "{err}");
        assert_eq!(server.processor.executions(), 1, "the card was charged");

        // While the first attempt still runs, a retry is told to come back later.
        let early = Req::payment(&server, "\"lost-1\"", PAYMENT).send();
        early.assert_problem(409, IN_PROGRESS);
        let retry_after: u64 = early.header("retry-after").unwrap().parse().unwrap();
        assert!(retry_after >= 1);

        // The handler returns at ~300 ms; its response is stored just after.
        wait_until("the first attempt's response is stored", || {
            server.store.stats().completes == 1
        });
        assert_eq!(server.processor.finished(), 1);
        let retry = Req::payment(&server, "\"lost-1\"", PAYMENT).send();
        assert!(retry.replayed(), "{retry:?}");
        assert_eq!(retry.status, 201);
        assert_eq!(retry.header("content-type"), Some("application/json"));
        assert_eq!(retry.header("x-charge-id"), Some("pay_1"));
        assert_eq!(
            retry.body,
            server.processor.answered.lock().unwrap()[0],
            "the stored response is the one the first attempt produced"
        );
        assert_eq!(server.processor.executions(), 1, "charged once in total");
    }
}

on_every_engine! {
    /// Without a spawner, a client disconnect cancels the handler mid-way. It may already have
    /// charged, so the layer must not release the key: the retry gets 409 until the lease runs
    /// out, and only then runs (as a takeover).
    fn without_a_spawner_a_handler_cancelled_by_a_disconnect_keeps_its_claim_until_the_lease_ends(b: Backend) {
        let store = b.open(Store::builder()
            .lease(Duration::from_secs(3)));
        let server = start(
            store,
            Processor::default().script([Step::Answer {
                status: 201,
                delay: Duration::from_millis(300),
            }]),
            |b| b,
        );
        let started = Instant::now();
        let err = Req::payment(&server, "cut-1", PAYMENT)
            .timeout(Duration::from_millis(100))
            .try_send()
            .expect_err("the client gives up after 100 ms");
        assert!(matches!(err, ureq::Error::Timeout(_)), "{err}");
        // Past the handler's own 300 ms: it was cancelled, never finished, and never released.
        thread::sleep(Duration::from_millis(500).saturating_sub(started.elapsed()));
        assert_eq!(server.processor.executions(), 1);
        assert_eq!(server.processor.finished(), 0, "the handler was cancelled");
        let retry = Req::payment(&server, "cut-1", PAYMENT).send();
        retry.assert_problem(409, IN_PROGRESS);
        // Nobody is left to finish the cancelled handler: the retry is told when the lease ends
        // (about 2.5 s from now, rounded up), not the usual one-second hint.
        let hint: u64 = retry.header("retry-after").unwrap().parse().unwrap();
        assert_eq!(hint, 3, "Retry-After names the lease's end");
        assert_eq!(server.store.stats().releases, 0);
        assert_eq!(server.processor.executions(), 1, "no second charge");

        thread::sleep(Duration::from_millis(3300).saturating_sub(started.elapsed()));
        let later = Req::payment(&server, "cut-1", PAYMENT).send();
        assert_eq!(later.status, 201);
        assert!(!later.replayed());
        assert_eq!(server.store.stats().takeovers, 1);
        assert_eq!(server.processor.executions(), 2);
    }
}

on_every_engine! {
    /// Regression: a client that hung up while its claim was being made durable stranded the key.
    /// hyper dropped the request future inside `claim_async`; the claim still landed, nobody held
    /// its ticket, the handler never ran, and every retry got 409 (`Retry-After: 1`) for the whole
    /// 60 s lease. A claim nobody received must not hold its key: the retry runs (or replays, if
    /// the handler was already detached), promptly, and the card is charged exactly once.
    fn a_client_that_hangs_up_while_its_claim_is_made_durable_does_not_strand_the_key(b: Backend) {
        use std::io::Write as _;
        const KEYS: u32 = 60;
        // A store on a real disk, so a claim takes an fsync to become durable: the window.
        let store = b.store();
        let server = start(
            store,
            Processor::with_delay(Duration::from_millis(2)),
            |b| {
                b.spawner(|f| {
                    tokio::spawn(f);
                })
            },
        );
        let addr = server.base.trim_start_matches("http://").to_owned();
        let mut slowest = Duration::ZERO;
        for i in 0..KEYS {
            let key = format!("hangup-{i}");
            let request = format!(
                "POST /v1/payments HTTP/1.1\r\nhost: {addr}\r\nx-api-key: t-a\r\n\
                 idempotency-key: {key}\r\ncontent-type: application/json\r\n\
                 content-length: {}\r\n\r\n{PAYMENT}",
                PAYMENT.len()
            );
            let mut socket = std::net::TcpStream::connect(&addr).unwrap();
            socket.write_all(request.as_bytes()).unwrap();
            // Hang up 0.1 to 2 ms after the request is out: mostly while the claim is in flight.
            thread::sleep(Duration::from_micros(100 + u64::from(i * 37 % 20) * 100));
            drop(socket);
            // The retry budget of a real client library: seconds, not the 60 s lease.
            let started = Instant::now();
            let reply = loop {
                let reply = Req::payment(&server, &key, PAYMENT).send();
                if reply.status != 409 || started.elapsed() > Duration::from_secs(5) {
                    break reply;
                }
                let hint: u64 = reply.header("retry-after").unwrap().parse().unwrap();
                assert!(hint <= 60, "Retry-After within the lease");
                thread::sleep(Duration::from_millis(50));
            };
            slowest = slowest.max(started.elapsed());
            assert_eq!(
                reply.status, 201,
                "key {key}: the retry must run or replay, not wait out the lease: {reply:?}"
            );
        }
        wait_until("every handler finished", || {
            server.processor.finished() == server.processor.executions()
        });
        assert_eq!(
            server.processor.executions(),
            KEYS,
            "exactly one charge per key"
        );
        assert!(
            slowest < Duration::from_secs(5),
            "slowest key took {slowest:?}"
        );
    }
}

on_every_engine! {
    /// While the first attempt runs (its client still waiting), a retry with the same key gets
    /// 409 with `Retry-After` and an in-progress problem; once the first is done, the retry gets a
    /// byte-identical replay (status, headers, body) marked `Idempotent-Replayed: true`.
    fn a_retry_during_the_first_attempt_gets_409_and_after_it_a_byte_identical_replay(b: Backend) {
        let server = start_default(&b, Processor::with_delay(Duration::from_millis(500)));
        let original = thread::scope(|s| {
            let first = s.spawn(|| Req::payment(&server, "\"k-1\"", PAYMENT).send());
            wait_until("the first attempt started", || {
                server.processor.executions() == 1
            });
            let early = Req::payment(&server, "\"k-1\"", PAYMENT).send();
            early.assert_problem(409, IN_PROGRESS);
            let retry_after: u64 = early.header("retry-after").unwrap().parse().unwrap();
            assert!(retry_after >= 1, "delta-seconds, rounded up");
            first.join().unwrap()
        });
        assert_eq!(original.status, 201);
        assert!(!original.replayed());

        let retry = Req::payment(&server, "\"k-1\"", PAYMENT).send();
        assert!(retry.replayed());
        assert_eq!(retry.status, original.status);
        assert_eq!(retry.handler_headers(), original.handler_headers());
        assert_eq!(retry.header("content-type"), Some("application/json"));
        assert_eq!(retry.body, original.body);
        // The bare-token spelling of the same key is the same key.
        let bare = Req::payment(&server, "k-1", PAYMENT).send();
        assert!(bare.replayed());
        assert_eq!(bare.body, original.body);
        assert_eq!(server.processor.executions(), 1);
    }
}

// ---------------------------------------------------------------------------------------------
// Concurrent duplicates.

on_every_engine! {
    fn concurrent_duplicates_execute_once_and_the_rest_get_409(b: Backend) {
        const N: usize = 8;
        // Long enough for all N to arrive while the first runs, even on a loaded machine.
        let server = start_default(&b, Processor::with_delay(Duration::from_millis(800)));
        let replies = send_concurrently(N, || Req::payment(&server, "dup-1", PAYMENT));
        let created: Vec<_> = replies.iter().filter(|r| r.status == 201).collect();
        assert_eq!(created.len(), 1, "{replies:?}");
        assert!(!created[0].replayed());
        for r in replies.iter().filter(|r| r.status != 201) {
            r.assert_problem(409, IN_PROGRESS);
            assert!(r.header("retry-after").is_some());
        }
        assert_eq!(server.processor.executions(), 1);
        let stats = server.store.stats();
        assert_eq!((stats.acquired, stats.in_progress), (1, N as u64 - 1));
    }
}

on_every_engine! {
    fn concurrent_duplicates_wait_for_in_flight_and_get_the_replay(b: Backend) {
        const N: usize = 8;
        let server = start(
            b.store(),
            Processor::with_delay(Duration::from_millis(300)),
            |b| b.wait_for_in_flight(Duration::from_secs(5)),
        );
        let replies = send_concurrently(N, || Req::payment(&server, "dup-2", PAYMENT));
        assert!(replies.iter().all(|r| r.status == 201), "{replies:?}");
        let fresh: Vec<_> = replies.iter().filter(|r| !r.replayed()).collect();
        assert_eq!(fresh.len(), 1, "{replies:?}");
        for r in &replies {
            assert_eq!(r.body, fresh[0].body);
            assert_eq!(r.handler_headers(), fresh[0].handler_headers());
        }
        assert_eq!(server.processor.executions(), 1);
    }
}

// ---------------------------------------------------------------------------------------------
// The fingerprint.

on_every_engine! {
    fn a_reused_key_with_a_different_amount_gets_422_and_no_second_charge(b: Backend) {
        let server = start_default(&b, Processor::default());
        let first = Req::payment(&server, "fp-1", PAYMENT).send();
        assert_eq!(first.status, 201);
        let other = Req::payment(&server, "fp-1", r#"{"amount":500000,"currency":"usd"}"#).send();
        other.assert_problem(422, MISMATCH);
        assert_eq!(server.processor.executions(), 1, "no second charge");
        // The mismatch changed nothing: the original request still replays.
        let retry = Req::payment(&server, "fp-1", PAYMENT).send();
        assert!(retry.replayed());
        assert_eq!(retry.body, first.body);
        assert_eq!(server.processor.executions(), 1);
    }
}

on_every_engine! {
    fn the_same_json_with_reordered_keys_and_other_whitespace_is_a_replay_not_a_422(b: Backend) {
        let server = start_default(&b, Processor::default());
        let first = Req::payment(&server, "fp-2", r#"{"amount":5000,"currency":"usd"}"#).send();
        assert_eq!(first.status, 201);
        let respelled = Req::payment(
            &server,
            "fp-2",
            "{\n  \"currency\" : \"usd\",\n  \"amount\" : 5000\n}\n",
        )
        .send();
        assert_eq!(respelled.status, 201, "{}", respelled.text());
        assert!(respelled.replayed());
        assert_eq!(respelled.body, first.body);
        // Other spellings of the same value: a number's exponent form, an escaped character.
        let escaped = Req::payment(&server, "fp-2", r#"{"currency":"\u0075sd","amount":5e3}"#).send();
        assert_eq!(escaped.status, 201, "{}", escaped.text());
        assert!(escaped.replayed());
        // A different value is still a different request.
        let other = Req::payment(&server, "fp-2", r#"{"currency":"usd","amount":5001}"#).send();
        other.assert_problem(422, MISMATCH);
        assert_eq!(server.processor.executions(), 1);
    }
}

// ---------------------------------------------------------------------------------------------
// The outcome policy: store what belongs to the request, release what belongs to the moment.

on_every_engine! {
    fn a_503_from_the_handler_releases_the_key_and_the_retry_executes_and_is_stored(b: Backend) {
        let server = start_default(&b, Processor::default().script([answer(503)]));
        let outage = Req::payment(&server, "out-1", PAYMENT).send();
        assert_eq!(outage.status, 503);
        assert!(!outage.replayed());
        let retry = Req::payment(&server, "out-1", PAYMENT).send();
        assert_eq!(retry.status, 201);
        assert!(!retry.replayed(), "the retry executed");
        assert_eq!(server.processor.executions(), 2);
        let again = Req::payment(&server, "out-1", PAYMENT).send();
        assert!(again.replayed(), "the second outcome was stored");
        assert_eq!(again.body, retry.body);
        assert_eq!(server.processor.executions(), 2);
    }
}

on_every_engine! {
    fn a_422_from_the_handler_is_stored_and_replayed(b: Backend) {
        let server = start_default(&b, Processor::default().script([answer(422)]));
        let invalid = Req::payment(&server, "inv-1", PAYMENT).send();
        assert_eq!(invalid.status, 422);
        assert_eq!(invalid.header("content-type"), Some("application/json"));
        let retry = Req::payment(&server, "inv-1", PAYMENT).send();
        assert_eq!(retry.status, 422);
        assert!(retry.replayed());
        assert_eq!(retry.body, invalid.body);
        assert_eq!(server.processor.executions(), 1);
    }
}

on_every_engine! {
    fn a_409_or_429_from_the_handler_releases_the_key(b: Backend) {
        for status in [409, 429] {
            let server = start_default(&b, Processor::default().script([answer(status)]));
            let key = format!("busy-{status}");
            let first = Req::payment(&server, &key, PAYMENT).send();
            assert_eq!(first.status, status);
            assert_eq!(
                first.header("content-type"),
                Some("application/json"),
                "the handler's own {status}, not the layer's"
            );
            let retry = Req::payment(&server, &key, PAYMENT).send();
            assert_eq!(retry.status, 201, "after a {status}");
            assert!(!retry.replayed());
            assert_eq!(server.processor.executions(), 2);
            let stats = server.store.stats();
            assert_eq!((stats.releases, stats.completes), (1, 1));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Scope.

on_every_engine! {
    fn a_tenant_never_receives_another_tenants_response_for_the_same_key(b: Backend) {
        let server = start_default(&b, Processor::default());
        let a = Req::payment(&server, "shared-key", PAYMENT)
            .tenant("t-a")
            .send();
        let b = Req::payment(&server, "shared-key", PAYMENT)
            .without("x-api-key")
            .tenant("t-b")
            .send();
        assert_eq!((a.status, b.status), (201, 201));
        assert!(!b.replayed(), "tenant B executed its own request");
        assert!(a.text().contains(r#""tenant":"t-a""#));
        assert!(b.text().contains(r#""tenant":"t-b""#));
        assert_ne!(a.body, b.body);
        assert_eq!(server.processor.executions(), 2);
        // Each tenant's retry replays its own response.
        let a2 = Req::payment(&server, "shared-key", PAYMENT).send();
        let b2 = Req::payment(&server, "shared-key", PAYMENT)
            .without("x-api-key")
            .tenant("t-b")
            .send();
        assert!(a2.replayed() && b2.replayed());
        assert_eq!((a2.body, b2.body), (a.body, b.body));
        assert_eq!(server.processor.executions(), 2);
    }
}

on_every_engine! {
    fn a_request_without_a_tenant_gets_401_and_nothing_is_claimed(b: Backend) {
        let server = start_default(&b, Processor::default());
        let anonymous = Req::payment(&server, "anon-1", PAYMENT)
            .without("x-api-key")
            .send();
        anonymous.assert_problem(401, NO_TENANT);
        assert_eq!(server.processor.executions(), 0, "the handler never ran");
        assert_eq!(server.store.stats().acquired, 0);
        assert_eq!(server.store.record_count().unwrap(), 0);
        // The same key with a tenant is new work.
        let known = Req::payment(&server, "anon-1", PAYMENT).send();
        assert_eq!(known.status, 201);
        assert!(!known.replayed());
        assert_eq!(server.processor.executions(), 1);
    }
}

// ---------------------------------------------------------------------------------------------
// Refusals before any claim.

on_every_engine! {
    fn every_bad_key_is_a_400_and_nothing_is_claimed(b: Backend) {
        let server = start_default(&b, Processor::default());
        let missing = Req::payment(&server, "x", PAYMENT)
            .without("idempotency-key")
            .send();
        missing.assert_problem(400, MISSING_KEY);

        let long = "k".repeat(256);
        for key in [
            "\"\"",
            "\"a b\"",
            "a b",
            long.as_str(),
            "clé-1",
            "\"clé-1\"",
            "\"abc",
        ] {
            let reply = Req::payment(&server, key, PAYMENT).send();
            assert_eq!(reply.status, 400, "key {key:?}");
            assert_eq!(reply.problem_type(), MALFORMED_KEY, "key {key:?}");
        }
        let twice = Req::payment(&server, "two-1", PAYMENT).key("two-2").send();
        twice.assert_problem(400, REPEATED_KEY);
        let twice_same = Req::payment(&server, "two-1", PAYMENT).key("two-1").send();
        twice_same.assert_problem(400, REPEATED_KEY);

        assert_eq!(server.processor.executions(), 0);
        assert_eq!(server.store.stats().acquired, 0);
        // 255 characters is still a key.
        let longest = Req::payment(&server, &"k".repeat(255), PAYMENT).send();
        assert_eq!(longest.status, 201);
    }
}

on_every_engine! {
    fn a_body_over_the_cap_gets_413_and_nothing_is_claimed(b: Backend) {
        let server = start(b.store(), Processor::default(), |b| {
            b.max_body_bytes(1024)
        });
        let big = format!(r#"{{"amount":5000,"memo":"{}"}}"#, "x".repeat(2000));
        let declared = Req::payment(&server, "big-1", &big).send();
        declared.assert_problem(413, BODY_TOO_LARGE);
        // Without a Content-Length, the layer finds out while reading.
        let chunked = Req::payment(&server, "big-2", "")
            .raw_body(big.into_bytes())
            .chunked()
            .send();
        chunked.assert_problem(413, BODY_TOO_LARGE);
        assert_eq!(server.processor.executions(), 0);
        assert_eq!(server.store.stats().acquired, 0);

        // Nothing was claimed: the same keys with a small body execute.
        for key in ["big-1", "big-2"] {
            let small = Req::payment(&server, key, PAYMENT).send();
            assert_eq!(small.status, 201);
            assert!(!small.replayed());
        }
        // Exactly at the cap is accepted.
        let at_cap = format!(r#"{{"memo":"{}"}}"#, "x".repeat(1024 - 11));
        assert_eq!(at_cap.len(), 1024);
        assert_eq!(Req::payment(&server, "cap-1", &at_cap).send().status, 201);
        assert_eq!(server.processor.executions(), 3);
    }
}

// ---------------------------------------------------------------------------------------------
// Pass-through.

on_every_engine! {
    fn with_key_required_false_a_request_without_a_key_passes_through_unguarded(b: Backend) {
        let server = start(b.store(), Processor::default(), |b| {
            b.key_required(false)
        });
        for _ in 0..2 {
            let reply = Req::payment(&server, "x", PAYMENT)
                .without("idempotency-key")
                .send();
            assert_eq!(reply.status, 201);
            assert!(!reply.replayed());
        }
        assert_eq!(server.processor.executions(), 2, "unguarded: both ran");
        assert_eq!(server.store.stats().acquired, 0);
        // A request with a key is still guarded.
        let keyed = Req::payment(&server, "opt-1", PAYMENT).send();
        let again = Req::payment(&server, "opt-1", PAYMENT).send();
        assert!(!keyed.replayed() && again.replayed());
        assert_eq!(server.processor.executions(), 3);
    }
}

on_every_engine! {
    fn a_get_passes_through_even_with_a_key(b: Backend) {
        let server = start_default(&b, Processor::default());
        for _ in 0..2 {
            let reply = Req::new("GET", &server, "/v1/payments")
                .tenant("t-a")
                .key("get-1")
                .send();
            assert_eq!(reply.status, 201);
            assert!(!reply.replayed());
        }
        // Not even a tenant or a well-formed key is needed.
        let bare = Req::new("GET", &server, "/v1/payments").key("\"\"").send();
        assert_eq!(bare.status, 201);
        assert_eq!(server.processor.executions(), 3);
        assert_eq!(server.store.stats().acquired, 0);
    }
}

// ---------------------------------------------------------------------------------------------
// Failure inside the handler.

on_every_engine! {
    fn a_panic_in_the_handler_releases_the_key_and_the_next_attempt_executes(b: Backend) {
        let server = start_default(&b, Processor::default().script([Step::Panic]));
        let crashed = Req::payment(&server, "boom-1", PAYMENT).send();
        crashed.assert_problem(500, HANDLER_PANICKED);
        let retry = Req::payment(&server, "boom-1", PAYMENT).send();
        assert_eq!(retry.status, 201);
        assert!(!retry.replayed(), "the retry executed");
        assert_eq!(server.processor.executions(), 2);
        // The server survived the panic and the outcome is now stored.
        assert!(Req::payment(&server, "boom-1", PAYMENT).send().replayed());
    }
}

// ---------------------------------------------------------------------------------------------
// Stored headers.

on_every_engine! {
    fn a_replay_drops_set_cookie_and_date_and_keeps_other_headers_in_order_with_repeats(b: Backend) {
        let server = start_default(&b, Processor::default());
        let send = || {
            Req::new("POST", &server, "/v1/headers")
                .tenant("t-a")
                .key("hdr-1")
                .send()
        };
        let first = send();
        assert_eq!(first.status, 201);
        assert_eq!(
            first.header_all("set-cookie").len(),
            2,
            "the original has them"
        );
        let replay = send();
        assert!(replay.replayed());
        assert_eq!(replay.status, 201);
        assert_eq!(replay.body, first.body);
        assert!(replay.header("set-cookie").is_none(), "{replay:?}");
        assert_ne!(
            replay.header("date"),
            Some("Wed, 21 Oct 2015 07:28:00 GMT"),
            "a replay gets its own Date"
        );
        assert_eq!(replay.header_all("x-a"), ["a1", "a2", "a3"]);
        let expected: Vec<_> = first
            .handler_headers()
            .into_iter()
            .filter(|(n, _)| n != "set-cookie")
            .collect();
        assert_eq!(replay.handler_headers(), expected);
        let names: Vec<_> = expected.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "content-type",
                "x-b",
                "x-a",
                "x-a",
                "x-a",
                "link",
                "cache-control"
            ]
        );
        assert_eq!(server.processor.executions(), 1);
    }
}

// ---------------------------------------------------------------------------------------------
// The lease heartbeat.

/// A store with a 1 s lease; the handler takes 2.5 s; a retry arrives at 1.5 s.
fn slow_handler_and_retry_past_the_lease(b: &Backend, heartbeat: bool) -> (Server, Reply, Reply) {
    let store = b.open(Store::builder().lease(Duration::from_secs(1)));
    let processor = Processor::default().script([Step::Answer {
        status: 201,
        delay: Duration::from_millis(2500),
    }]);
    let server = start(store, processor, |b| {
        if heartbeat {
            b.heartbeat(Duration::from_millis(200))
        } else {
            b
        }
    });
    let (first, retry) = thread::scope(|s| {
        let started = Instant::now();
        let first = s.spawn(|| Req::payment(&server, "slow-1", PAYMENT).send());
        thread::sleep(Duration::from_millis(1500).saturating_sub(started.elapsed()));
        let retry = Req::payment(&server, "slow-1", PAYMENT).send();
        (first.join().unwrap(), retry)
    });
    (server, first, retry)
}

on_every_engine! {
    fn the_heartbeat_keeps_a_slow_handler_from_being_taken_over(b: Backend) {
        let (server, first, retry) = slow_handler_and_retry_past_the_lease(&b, true);
        retry.assert_problem(409, IN_PROGRESS);
        assert_eq!(first.status, 201);
        assert_eq!(server.processor.executions(), 1);
        assert_eq!(server.store.stats().takeovers, 0);
        let after = Req::payment(&server, "slow-1", PAYMENT).send();
        assert!(after.replayed());
        assert_eq!(after.body, first.body);
    }
}

on_every_engine! {
    fn without_the_heartbeat_a_retry_after_the_lease_takes_a_slow_handler_over(b: Backend) {
        let (server, first, retry) = slow_handler_and_retry_past_the_lease(&b, false);
        assert_eq!(retry.status, 201, "{}", retry.text());
        assert!(!retry.replayed(), "the retry executed");
        assert_eq!(first.status, 201);
        assert_eq!(server.processor.executions(), 2, "charged twice");
        assert_eq!(server.store.stats().takeovers, 1);
        // The first attempt lost its lease, so the stored outcome is the takeover's.
        let after = Req::payment(&server, "slow-1", PAYMENT).send();
        assert!(after.replayed());
        assert_eq!(after.body, retry.body);
    }
}

on_every_engine! {
    /// Regression: a takeover ran the handler with nothing telling it so, although the whole point
    /// of a takeover is that the handler reconciles downstream first. The layer now puts the claim
    /// (key, fence, takeover) in the request's extensions.
    fn a_takeover_is_visible_to_the_handler(b: Backend) {
        use axum::Extension;
        use idemdb::http::Claimed;
        let seen: Arc<Mutex<Vec<Claimed>>> = Arc::default();
        let s = seen.clone();
        let store = b.open(Store::builder()
            .lease(Duration::from_secs(1)));
        let layer = IdempotencyLayer::builder(store, |_| Some("tenant".into())).build();
        let app = Router::new()
            .route(
                "/v1/payments",
                post(move |Extension(claimed): Extension<Claimed>| {
                    let s = s.clone();
                    async move {
                        let first = claimed.takeover.is_none();
                        s.lock().unwrap().push(claimed);
                        if first {
                            // The first attempt is slow; its client gives up and it is cancelled.
                            tokio::time::sleep(Duration::from_millis(400)).await;
                        }
                        StatusCode::CREATED
                    }
                }),
            )
            .layer(layer);
        let (base, _rt) = serve(app);
        let send = |timeout: Option<Duration>| {
            let agent: ureq::Agent = ureq::Agent::config_builder()
                .timeout_global(timeout)
                .http_status_as_error(false)
                .build()
                .into();
            agent
                .post(&format!("{base}/v1/payments"))
                .header("idempotency-key", "takeover-1")
                .send("{}")
        };
        assert!(send(Some(Duration::from_millis(100))).is_err());
        thread::sleep(Duration::from_millis(1200));
        assert_eq!(send(None).unwrap().status(), 201);
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0].key, "takeover-1");
        let takeover = seen[1]
            .takeover
            .as_ref()
            .expect("the retry is told it took over");
        assert_eq!(takeover.previous_fence, seen[0].fence);
        assert!(seen[1].fence > seen[0].fence);
    }
}

/// A tenant at `max_live_records_per_tenant` gets 429 with `Retry-After` and a problem type of
/// its own; its handler does not run, its own keys still replay, and another tenant is served.
#[test]
fn a_tenant_at_its_record_limit_gets_429_and_another_tenant_is_served() {
    const TENANT_FULL: &str = "https://idemdb.dev/problems/tenant-record-limit";
    let dir = tempfile::tempdir().unwrap();
    let store = Store::builder()
        .max_live_records_per_tenant(2)
        .open(dir.path().join("payments.idem"))
        .unwrap();
    let server = start(store, Processor::default(), |b| b);
    for key in ["k1", "k2"] {
        assert_eq!(Req::payment(&server, key, PAYMENT).send().status, 201);
    }
    let refused = Req::payment(&server, "k3", PAYMENT).send();
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(refused.problem_type(), TENANT_FULL);
    assert_eq!(refused.header("retry-after"), Some("60"));
    assert_eq!(server.processor.executions(), 2, "the handler did not run");
    let replay = Req::payment(&server, "k1", PAYMENT).send();
    assert_eq!(replay.status, 201);
    assert!(replay.replayed());
    let other = Req::new("POST", &server, "/v1/payments")
        .tenant("t-b")
        .key("k3")
        .json(PAYMENT)
        .send();
    assert_eq!(other.status, 201, "{other:?}");
    assert_eq!(server.processor.executions(), 3);
}

/// `max_waiters`: with `wait_for_in_flight`, only that many duplicates wait for the in-flight
/// request (and get its replay); the others get 409 with `Retry-After` at once, as without
/// waiting. Nothing runs twice.
#[test]
fn only_max_waiters_duplicates_wait_and_the_rest_get_409_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("payments.idem")).unwrap();
    let server = start(
        store,
        Processor::with_delay(Duration::from_millis(1500)),
        |b| b.wait_for_in_flight(Duration::from_secs(10)).max_waiters(2),
    );
    thread::scope(|s| {
        let first = s.spawn(|| Req::payment(&server, "busy", PAYMENT).send());
        wait_until("the first attempt runs", || {
            server.processor.executions() == 1
        });
        let duplicates = send_concurrently(5, || Req::payment(&server, "busy", PAYMENT));
        assert_eq!(first.join().unwrap().status, 201);
        let replayed = duplicates
            .iter()
            .filter(|r| r.status == 201 && r.replayed())
            .count();
        let turned_away: Vec<&Reply> = duplicates.iter().filter(|r| r.status == 409).collect();
        assert_eq!((replayed, turned_away.len()), (2, 3), "{duplicates:?}");
        for r in turned_away {
            r.assert_problem(409, IN_PROGRESS);
            assert!(r.header("retry-after").is_some());
        }
    });
    assert_eq!(server.processor.executions(), 1);
}

/// `max_response_bytes`: the layer buffers at most that much of a handler's response to store
/// it. A larger response is not stored, and its claim is not released either (the side effect
/// happened): it stays in progress, so a retry gets 409 and nothing runs twice. A body of
/// declared length reaches the client whole; one that streams past the limit gets a 500.
#[test]
fn a_response_larger_than_the_layer_buffers_is_not_stored_and_nothing_runs_twice() {
    const RESPONSE_TOO_LARGE: &str = "https://idemdb.dev/problems/response-too-large";
    const BIG: usize = 3 << 20;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("payments.idem")).unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let layer = IdempotencyLayer::builder(store, tenant_from_api_key)
        .max_response_bytes(1 << 20)
        .build();
    let sized = {
        let runs = Arc::clone(&runs);
        move || {
            runs.fetch_add(1, Ordering::SeqCst);
            async { vec![b'x'; BIG] }
        }
    };
    let streamed = {
        let runs = Arc::clone(&runs);
        move || {
            runs.fetch_add(1, Ordering::SeqCst);
            async {
                let chunks = (0..BIG / 4096).map(|_| Ok::<_, std::io::Error>(vec![b'y'; 4096]));
                axum::body::Body::from_stream(futures_util::stream::iter(chunks))
            }
        }
    };
    let app = Router::new()
        .route("/sized", post(sized))
        .route("/streamed", post(streamed))
        .layer(layer);
    let (base, _rt) = serve(app);
    let server = Server {
        base,
        store: Store::in_memory().unwrap(),
        processor: Processor::default(),
        _rt,
    };
    let send = |path: &str| {
        Req::new("POST", &server, path)
            .tenant("t-a")
            .key("big-1")
            .json(PAYMENT)
            .send()
    };
    let whole = send("/sized");
    assert_eq!(whole.status, 200, "{:?}", whole.status);
    assert_eq!(
        whole.body.len(),
        BIG,
        "the declared-length body passes through whole"
    );
    let retry = send("/sized");
    retry.assert_problem(409, IN_PROGRESS);

    let cut = send("/streamed");
    cut.assert_problem(500, RESPONSE_TOO_LARGE);
    send("/streamed").assert_problem(409, IN_PROGRESS);
    assert_eq!(runs.load(Ordering::SeqCst), 2, "each handler ran once");
}

/// Header sizes are bounded: an `Idempotency-Key` of 300 bytes is a 400 from the layer, one of
/// 64 KiB a 400 or the HTTP stack's own 431; either way nothing is claimed and nothing runs.
#[test]
fn an_oversized_idempotency_key_header_is_refused_and_nothing_runs() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        Store::open(dir.path().join("payments.idem")).unwrap(),
        Processor::default(),
        |b| b,
    );
    Req::payment(&server, &"k".repeat(300), PAYMENT)
        .send()
        .assert_problem(400, MALFORMED_KEY);
    let huge = Req::payment(&server, &"k".repeat(64 << 10), PAYMENT).send();
    assert!(matches!(huge.status, 400 | 431), "{:?}", huge.status);
    assert_eq!(server.processor.executions(), 0);
    assert_eq!(server.store.record_count().unwrap(), 0);
}
