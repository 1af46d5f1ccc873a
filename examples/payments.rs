//! A payment service behind a lossy network, kept effectively-once by idempotency keys.
//!
//! ```text
//! cargo run --release --example payments [-- SEED]
//! ```
//!
//! Eight client threads send a few hundred payments for four merchants to one service. The
//! network loses requests (the service never ran) and responses (the service ran and charged the
//! card, but the client hears nothing): from the client's side both are the same timeout, so it
//! retries with the same idempotency key. Some requests go out twice at once, one client has the
//! classic bug of reusing a key for a different payment, the payment provider has short outages,
//! and halfway through the service process crashes with claims in flight, is restarted on the
//! same store file, and reaps the claims it abandoned by reconciling with the provider.
//!
//! At the end every payment must have been charged exactly once, and the buggy request never;
//! the example exits non-zero otherwise.
//!
//! Every fault is drawn from a small seeded PRNG (one stream per client), so a seed always
//! injects the same faults; the counts still wobble a little between runs because threads
//! interleave differently.

use idemdb::{Claim, Fingerprint, Resolution, Response, Scope, StaleClaim, Stats, Store, Ticket};
use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

/// The endpoint half of every key's scope. The other half is the merchant: two merchants can
/// never see each other's stored responses, whatever keys their clients pick.
const ENDPOINT: &str = "POST /v1/payments";
const MERCHANTS: [&str; 4] = ["acme", "globex", "initech", "umbrella"];
const CLIENTS: usize = 8;
const PAYMENTS_PER_CLIENT: usize = 50;
/// This client reuses the key of its previous payment for every tenth payment, with another
/// amount: the bug the request fingerprint exists to catch.
const BUGGY_CLIENT: usize = 7;
const DEFAULT_SEED: u64 = 42;

/// The `Retry-After` hint a 409 carries. Real services say a second or so; the demo's handlers
/// take a millisecond, so a few milliseconds keeps it fast.
const RETRY_AFTER: Duration = Duration::from_millis(5);
/// Clients never wait longer than this, whatever a 409 or 503 says.
const MAX_BACKOFF: Duration = Duration::from_millis(5);
/// How long one call to the payment provider takes. It widens the window in which a
/// concurrent duplicate finds the key in progress.
const PROVIDER_LATENCY: Duration = Duration::from_millis(1);

// Fault rates, in per mille.
/// The request is lost on the way in: the service never ran.
const LOST_REQUEST: u64 = 50;
/// The response is lost on the way out: the service ran (and charged), the client saw nothing.
const LOST_RESPONSE: u64 = 80;
/// The client sends the same request twice at once (a double click, an over-eager retry).
const DUPLICATE: u64 = 60;
/// The payment provider is briefly unavailable and charges nothing.
const PROVIDER_UNAVAILABLE: u64 = 30;

/// The crash: once half the payments have completed, the service process dies. The next few
/// handlers that hold a claim die with it, alternately just after the charge and just before
/// it, leaving claims that were acquired and never completed.
const CRASH_AFTER_COMPLETES: u64 = (CLIENTS * PAYMENTS_PER_CLIENT / 2) as u64;
const CRASH_VICTIMS: usize = 4;

fn main() -> ExitCode {
    let seed = match std::env::args().nth(1).map(|s| s.parse::<u64>()) {
        None => DEFAULT_SEED,
        Some(Ok(seed)) => seed,
        Some(Err(_)) => {
            eprintln!("usage: payments [SEED]   (SEED is an unsigned integer)");
            return ExitCode::from(2);
        }
    };
    match run(seed) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(seed: u64) -> Result<bool, Box<dyn std::error::Error>> {
    let started = Instant::now();
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("payments.idem");
    let provider = Provider::new(seed);
    let metrics = Metrics::default();
    let mut clients: Vec<Client> = (0..CLIENTS).map(|id| Client::new(id, seed)).collect();
    let payments = clients.iter().map(Client::payments).sum::<usize>();
    println!("idemdb payments demo, seed {seed}");
    println!(
        "  {CLIENTS} clients, {} merchants, {payments} payments, store {}",
        MERCHANTS.len(),
        path.display()
    );

    // First process lifetime: serve until the crash.
    let store = open_store(&path)?;
    let service = Service::new(store, &provider, &metrics, Some(CrashPlan::default()));
    serve(&service, &mut clients);
    let at_crash = service.store.stats();
    let died = service.crash.as_ref().map_or([0, 0], CrashPlan::deaths);
    println!(
        "\nlifetime 1: crashed after {} completed payments; {} handlers died holding a claim \
         ({} after charging, {} before)",
        service.completes.load(Ordering::Relaxed),
        died[0] + died[1],
        died[0],
        died[1]
    );
    print_stats("  store stats", &at_crash);
    // The process is gone: dropping the service drops the only `Store`, which closes the file.
    // Nothing more is written, just as if it had been killed; every claim it held stays on
    // disk, in progress.
    drop(service);

    // Second lifetime: reopen the same file. The claims the dead process held come back as
    // orphans: a retry of one gets 409 until it is reaped (or its 30 s lease runs out and a
    // retry takes it over). Reap before serving: whether each one charged, only the payment
    // provider knows, so the resolver asks it.
    let store = open_store(&path)?;
    println!("\nlifetime 2: reopened the store; reaping the orphaned claims");
    let (mut completed, mut released) = (0, 0);
    let reaped = store.reap(|stale: &StaleClaim| {
        let reference = reference(stale.scope.tenant(), &stale.key);
        match provider.find(&reference) {
            // The card was charged but the response never stored: store the response the
            // handler would have returned, so the retry replays it instead of charging again.
            Some(charge) => {
                completed += 1;
                println!(
                    "  {reference} (fence {}, orphan: {}): provider charged {} by fence {} \
                     -> complete",
                    stale.fence, stale.orphan, charge.payment_id, charge.fence
                );
                Resolution::Complete(payment_response(&charge))
            }
            // Nothing was charged: free the key, so the retry executes.
            None => {
                released += 1;
                println!(
                    "  {reference} (fence {}, orphan: {}): no charge -> release",
                    stale.fence, stale.orphan
                );
                Resolution::Release
            }
        }
    })?;
    println!("  reaped {reaped}: {completed} completed, {released} released");
    let service = Service::new(store, &provider, &metrics, None);
    serve(&service, &mut clients);
    let after_restart = service.store.stats();
    print_stats("  store stats", &after_restart);
    drop(service);

    let problems = verify(&clients, &provider, died[0] + died[1], reaped);
    report(&metrics, &provider, &clients, [at_crash, after_restart]);
    println!("  elapsed                  {:.2?}", started.elapsed());
    if problems.is_empty() {
        println!("\nOK: every payment was charged exactly once; the reused key was never charged");
        Ok(true)
    } else {
        for problem in &problems {
            eprintln!("FAIL: {problem}");
        }
        Ok(false)
    }
}

fn open_store(path: &Path) -> idemdb::Result<Store> {
    Store::builder()
        // Retries must fit inside the TTL: a retry that arrives after it executes again.
        .ttl(Duration::from_secs(24 * 3600))
        // Far longer than any handler here runs: a lease that runs out under a live handler lets
        // a retry take the key over while the first attempt is still charging.
        .lease(Duration::from_secs(30))
        .retry_after(RETRY_AFTER)
        .open(path)
}

/// Runs every client on its own thread until it has no payment left, or finds the service
/// down (it then keeps its unfinished payment, key and all, for the next lifetime).
fn serve(service: &Service, clients: &mut [Client]) {
    thread::scope(|s| {
        for client in clients.iter_mut() {
            s.spawn(move || client.run(service));
        }
    });
}

// ---------------------------------------------------------------------------------------------
// The service.

/// One `POST /v1/payments`, as the service receives it.
#[derive(Debug, Clone)]
struct PaymentRequest {
    merchant: &'static str,
    /// The `Idempotency-Key` header.
    key: String,
    amount: u64,
    customer: String,
}

impl PaymentRequest {
    /// The canonical body: fixed field order, no whitespace. The fingerprint covers it, so "the
    /// same request" means the same payment, not the same bytes on the wire.
    fn canonical_body(&self) -> String {
        format!(
            r#"{{"amount":{},"currency":"usd","customer":"{}"}}"#,
            self.amount, self.customer
        )
    }
}

/// The handle the service gives the provider for a charge, and asks it about after a crash.
fn reference(merchant: &str, key: &str) -> String {
    format!("{merchant}/{key}")
}

/// The service process: a store and a provider, and (in the first lifetime) the plan of its
/// own death.
struct Service<'a> {
    store: Store,
    provider: &'a Provider,
    metrics: &'a Metrics,
    crash: Option<CrashPlan>,
    completes: AtomicU64,
}

/// How a request failed to produce a response.
enum Dropped {
    /// The process died while handling it: the client sees the connection drop.
    Reset,
    /// The process is gone: nothing is listening.
    Refused,
}

impl<'a> Service<'a> {
    fn new(
        store: Store,
        provider: &'a Provider,
        metrics: &'a Metrics,
        crash: Option<CrashPlan>,
    ) -> Self {
        Service {
            store,
            provider,
            metrics,
            crash,
            completes: AtomicU64::new(0),
        }
    }

    fn handle(&self, req: &PaymentRequest) -> Result<Response, Dropped> {
        if self.crash.as_ref().is_some_and(CrashPlan::is_down) {
            return Err(Dropped::Refused);
        }
        let scope = Scope::new(req.merchant, ENDPOINT);
        let fingerprint = Fingerprint::of(req.canonical_body().as_bytes());
        // Claim the key BEFORE charging. The claim is atomic and durable when it returns: of any
        // number of concurrent attempts with this key exactly one is `Acquired`, and a crash
        // after this line leaves a record saying "this may have happened", never silence.
        // (A real service answers 500 on a store error; here one is a bug, so it panics.)
        let claim = self
            .store
            .claim(&scope, &req.key, fingerprint)
            .expect("claim");
        match claim {
            Claim::Acquired(ticket) => self.execute(req, ticket),
            // Completed earlier: the stored response, byte for byte, plus a marker the client
            // may look at. Nothing is executed.
            Claim::Replay(stored) => {
                self.metrics.replays.fetch_add(1, Ordering::Relaxed);
                Ok(stored.with_header("idempotent-replay", "true"))
            }
            // Another attempt with this key is running right now (or its process died and it
            // is not reaped yet): do not run it twice, tell the client to come back.
            Claim::InProgress { retry_after, .. } => {
                self.metrics.conflicts.fetch_add(1, Ordering::Relaxed);
                Ok(error_response(
                    409,
                    "a request with this Idempotency-Key is in progress",
                    Some(retry_after),
                ))
            }
            // Same key, different request: a client bug. Replaying the first response would
            // tell it a payment it did not ask for succeeded.
            Claim::Mismatch { .. } => {
                self.metrics.mismatches.fetch_add(1, Ordering::Relaxed);
                Ok(error_response(
                    422,
                    "Idempotency-Key reused with a different request body",
                    None,
                ))
            }
        }
    }

    /// Runs the side effect for a claim this handler holds, then stores its response.
    fn execute(&self, req: &PaymentRequest, ticket: Ticket) -> Result<Response, Dropped> {
        let reference = reference(req.merchant, &req.key);
        // Taking over a claim whose holder vanished (its lease ran out): that attempt may have
        // charged already, so ask the provider before charging again. (Rare here: the demo
        // reaps orphans at startup, and its leases outlive every handler.)
        if ticket.takeover().is_some() {
            self.metrics.takeovers.fetch_add(1, Ordering::Relaxed);
            if let Some(charge) = self.provider.find(&reference) {
                let response = payment_response(&charge);
                self.store
                    .complete(ticket, response.clone())
                    .expect("complete");
                return Ok(response);
            }
        }
        let doom = self.crash.as_ref().and_then(CrashPlan::doom);
        self.checkpoint(doom, Point::BeforeCharge)?;
        match self.provider.charge(&reference, req.amount, ticket.fence()) {
            // The provider was down and charged nothing. That failure belongs to the moment,
            // not to the request: release the key so the retry executes. Storing the 503 would
            // replay it forever, even after the provider recovered.
            Err(Unavailable) => {
                self.store.release(ticket).expect("release");
                self.metrics.unavailable.fetch_add(1, Ordering::Relaxed);
                Ok(error_response(
                    503,
                    "payment provider unavailable",
                    Some(RETRY_AFTER),
                ))
            }
            // Charged. Store the whole response (the client needs the payment id), durably,
            // before answering: a retry after a lost response replays exactly this.
            Ok(charge) => {
                let response = payment_response(&charge);
                self.checkpoint(doom, Point::AfterCharge)?;
                self.store
                    .complete(ticket, response.clone())
                    .expect("complete");
                let done = self.completes.fetch_add(1, Ordering::Relaxed) + 1;
                if let Some(crash) = &self.crash {
                    crash.arm_if(done >= CRASH_AFTER_COMPLETES);
                }
                Ok(response)
            }
        }
    }

    /// Dies here if the crash plan says so. The ticket is simply dropped by the caller's `?`,
    /// which does nothing: the claim stays in progress on disk, exactly as after a real crash.
    fn checkpoint(&self, doom: Option<Point>, here: Point) -> Result<(), Dropped> {
        match &self.crash {
            Some(crash) if doom == Some(here) || crash.is_down() => {
                crash.record_death(here);
                Err(Dropped::Reset)
            }
            _ => Ok(()),
        }
    }
}

/// The 201 a successful charge answers. The reaper builds it too, from the provider's record,
/// so a payment completed by reconciliation replays the same response a live handler stores.
fn payment_response(charge: &Charge) -> Response {
    Response::new(
        201,
        format!(
            r#"{{"id":"{}","object":"payment","amount":{},"currency":"usd","status":"succeeded"}}"#,
            charge.payment_id, charge.amount
        ),
    )
    .with_header("content-type", "application/json")
}

fn error_response(status: u16, message: &str, retry_after: Option<Duration>) -> Response {
    let response = Response::new(status, format!(r#"{{"error":"{message}"}}"#))
        .with_header("content-type", "application/json");
    match retry_after {
        // HTTP's Retry-After counts whole seconds; the demo's waits are milliseconds.
        Some(wait) => response.with_header("retry-after-ms", wait.as_millis().to_string()),
        None => response,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Point {
    BeforeCharge,
    AfterCharge,
}

/// When and where the first service process dies.
#[derive(Default)]
struct CrashPlan {
    /// Half the payments are done: the next handlers to acquire a claim die.
    dying: AtomicBool,
    /// Handlers picked to die so far.
    victims: AtomicUsize,
    died_after_charge: AtomicUsize,
    died_before_charge: AtomicUsize,
    /// The process is gone: requests are refused, and handlers still running die.
    down: AtomicBool,
}

impl CrashPlan {
    fn arm_if(&self, condition: bool) {
        if condition {
            self.dying.store(true, Ordering::SeqCst);
        }
    }

    /// Where a handler that just acquired a claim will die, if it will.
    fn doom(&self) -> Option<Point> {
        if !self.dying.load(Ordering::SeqCst) {
            return None;
        }
        match self.victims.fetch_add(1, Ordering::SeqCst) {
            n if n >= CRASH_VICTIMS => Some(Point::BeforeCharge),
            n if n % 2 == 0 => Some(Point::AfterCharge),
            _ => Some(Point::BeforeCharge),
        }
    }

    fn record_death(&self, at: Point) {
        let counter = match at {
            Point::AfterCharge => &self.died_after_charge,
            Point::BeforeCharge => &self.died_before_charge,
        };
        counter.fetch_add(1, Ordering::SeqCst);
        if self.deaths().iter().sum::<usize>() >= CRASH_VICTIMS {
            self.down.store(true, Ordering::SeqCst);
        }
    }

    /// `[after charging, before charging]`.
    fn deaths(&self) -> [usize; 2] {
        [
            self.died_after_charge.load(Ordering::SeqCst),
            self.died_before_charge.load(Ordering::SeqCst),
        ]
    }

    fn is_down(&self) -> bool {
        self.down.load(Ordering::SeqCst)
    }
}

// ---------------------------------------------------------------------------------------------
// The payment provider: the downstream side effect. It is NOT idempotent: every call charges.

#[derive(Debug, Clone)]
struct Charge {
    payment_id: String,
    amount: u64,
    /// The fence of the claim whose handler made this charge.
    fence: u64,
}

struct Unavailable;

struct Provider {
    seed: u64,
    ledger: Mutex<Ledger>,
}

#[derive(Default)]
struct Ledger {
    issued: u64,
    /// Every charge made, by reference: more than one under a reference is a duplicate charge.
    charges: HashMap<String, Vec<Charge>>,
}

impl Provider {
    fn new(seed: u64) -> Self {
        Provider {
            seed,
            ledger: Mutex::default(),
        }
    }

    fn charge(&self, reference: &str, amount: u64, fence: u64) -> Result<Charge, Unavailable> {
        thread::sleep(PROVIDER_LATENCY);
        // Outages are a function of the seed and the attempt, so a retry (a new claim, a new
        // fence) usually gets through.
        if mix(self.seed ^ fence.wrapping_mul(0x2545_F491_4F6C_DD1D)) % 1000 < PROVIDER_UNAVAILABLE
        {
            return Err(Unavailable);
        }
        let mut ledger = self.ledger.lock().unwrap();
        ledger.issued += 1;
        let charge = Charge {
            payment_id: format!("pay_{:06}", ledger.issued),
            amount,
            fence,
        };
        ledger
            .charges
            .entry(reference.to_owned())
            .or_default()
            .push(charge.clone());
        Ok(charge)
    }

    /// The reconciliation query: did a charge with this reference happen?
    fn find(&self, reference: &str) -> Option<Charge> {
        let ledger = self.ledger.lock().unwrap();
        ledger.charges.get(reference)?.first().cloned()
    }

    fn charges(&self, reference: &str) -> Vec<Charge> {
        let ledger = self.ledger.lock().unwrap();
        ledger.charges.get(reference).cloned().unwrap_or_default()
    }

    /// `(charges executed, references charged more than once, extra charges)`.
    fn totals(&self) -> (usize, usize, usize) {
        let ledger = self.ledger.lock().unwrap();
        let executed = ledger.charges.values().map(Vec::len).sum();
        let repeated = ledger.charges.values().filter(|c| c.len() > 1).count();
        let extra = ledger.charges.values().map(|c| c.len() - 1).sum();
        (executed, repeated, extra)
    }
}

// ---------------------------------------------------------------------------------------------
// The clients and the lossy network between them and the service.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// A real payment: retried until it gets its 201.
    Charge,
    /// The buggy reuse of a key for another payment: retried until it gets its 422.
    Reject,
}

struct Job {
    request: PaymentRequest,
    expect: Expect,
    sends: u64,
}

struct Finished {
    request: PaymentRequest,
    expect: Expect,
    status: u16,
    payment_id: Option<String>,
}

struct Client {
    rng: SplitMix64,
    jobs: VecDeque<Job>,
    finished: Vec<Finished>,
}

/// What one send looks like from the client's side.
enum Delivery {
    Response(Response),
    /// No answer. The client cannot tell whether the service ran.
    Timeout,
    /// Nobody is listening (the service process is dead).
    Refused,
}

#[derive(Debug, Clone, Copy)]
enum Fate {
    Deliver,
    LoseRequest,
    LoseResponse,
}

impl Client {
    fn new(id: usize, seed: u64) -> Self {
        let mut rng = SplitMix64(seed ^ mix(id as u64 + 1));
        let merchant = MERCHANTS[id % MERCHANTS.len()];
        let mut jobs = VecDeque::new();
        for i in 0..PAYMENTS_PER_CLIENT {
            // One key per logical payment, minted before its first attempt and kept with the
            // job, so every retry (even after the service restarts) carries the same one.
            let request = PaymentRequest {
                merchant,
                key: mint_key(&mut rng),
                amount: 100 + rng.below(99_900),
                customer: format!("cus_{:04}", rng.below(10_000)),
            };
            let reuse = (id == BUGGY_CLIENT && i % 10 == 9).then(|| PaymentRequest {
                // The bug: the key of the payment just made, for a different amount.
                key: request.key.clone(),
                amount: request.amount + 1 + rng.below(5_000),
                ..request.clone()
            });
            jobs.push_back(Job {
                request,
                expect: Expect::Charge,
                sends: 0,
            });
            if let Some(request) = reuse {
                jobs.push_back(Job {
                    request,
                    expect: Expect::Reject,
                    sends: 0,
                });
            }
        }
        Client {
            rng,
            jobs,
            finished: Vec::new(),
        }
    }

    fn payments(&self) -> usize {
        self.jobs
            .iter()
            .filter(|job| job.expect == Expect::Charge)
            .count()
    }

    fn run(&mut self, service: &Service) {
        let metrics = service.metrics;
        while let Some(job) = self.jobs.front_mut() {
            // Sometimes two copies of the request go out at once. Exactly one may execute.
            let copies = if self.rng.chance(DUPLICATE) { 2 } else { 1 };
            let fates: Vec<Fate> = (0..copies).map(|_| self.rng.fate()).collect();
            metrics.requests.fetch_add(copies, Ordering::Relaxed);
            metrics.duplicates.fetch_add(copies - 1, Ordering::Relaxed);
            if job.sends > 0 {
                metrics.retries.fetch_add(1, Ordering::Relaxed);
            }
            job.sends += 1;
            let request = &job.request;
            let deliveries: Vec<Delivery> = thread::scope(|s| {
                let extra: Vec<_> = fates[1..]
                    .iter()
                    .map(|&fate| s.spawn(move || send(service, request, fate)))
                    .collect();
                let mut all = vec![send(service, request, fates[0])];
                all.extend(extra.into_iter().map(|h| h.join().unwrap()));
                all
            });

            let mut answer = None;
            let mut refused = false;
            let mut wait = Duration::ZERO;
            for delivery in deliveries {
                match delivery {
                    Delivery::Response(r) => match r.status() {
                        // Final answers: a payment (first or replayed) or the 422.
                        201 | 422 => answer = Some(r),
                        // In progress (409) or a transient failure (503): same key, later.
                        409 | 503 => wait = wait.max(retry_after(&r)),
                        other => panic!("unexpected status {other}"),
                    },
                    // The ambiguous case. Retrying is safe only because the key is the same.
                    Delivery::Timeout => {}
                    Delivery::Refused => refused = true,
                }
            }
            if let Some(r) = answer {
                let job = self.jobs.pop_front().expect("the job being sent");
                self.finished.push(Finished {
                    status: r.status(),
                    payment_id: payment_id(r.body()),
                    request: job.request,
                    expect: job.expect,
                });
            } else if refused {
                // The service is down. Keep the job (and its key) for when it is back.
                return;
            } else {
                thread::sleep(wait.min(MAX_BACKOFF));
            }
        }
    }
}

/// The network: loses the request, or the response, or neither.
fn send(service: &Service, request: &PaymentRequest, fate: Fate) -> Delivery {
    let metrics = service.metrics;
    if let Fate::LoseRequest = fate {
        metrics.lost_requests.fetch_add(1, Ordering::Relaxed);
        return Delivery::Timeout;
    }
    match service.handle(request) {
        Ok(_) if matches!(fate, Fate::LoseResponse) => {
            metrics.lost_responses.fetch_add(1, Ordering::Relaxed);
            Delivery::Timeout
        }
        Ok(response) => Delivery::Response(response),
        Err(Dropped::Reset) => Delivery::Timeout,
        Err(Dropped::Refused) => Delivery::Refused,
    }
}

fn retry_after(response: &Response) -> Duration {
    response
        .headers()
        .iter()
        .find(|(name, _)| name == "retry-after-ms")
        .and_then(|(_, value)| std::str::from_utf8(value).ok()?.parse().ok())
        .map_or(MAX_BACKOFF, Duration::from_millis)
}

/// The `"id"` of a payment response body.
fn payment_id(body: &[u8]) -> Option<String> {
    let body = std::str::from_utf8(body).ok()?;
    let start = body.find(r#""id":""#)? + 6;
    let len = body[start..].find('"')?;
    Some(body[start..start + len].to_owned())
}

/// A random key in the shape of a UUID v4.
fn mint_key(rng: &mut SplitMix64) -> String {
    let (a, b) = (rng.next(), rng.next());
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        0x8000 | ((b >> 48) & 0x3fff),
        b & 0xffff_ffff_ffff
    )
}

/// splitmix64: tiny, fast and good enough to draw faults from.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }

    fn fate(&mut self) -> Fate {
        match self.below(1000) {
            n if n < LOST_REQUEST => Fate::LoseRequest,
            n if n < LOST_REQUEST + LOST_RESPONSE => Fate::LoseResponse,
            _ => Fate::Deliver,
        }
    }
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

// ---------------------------------------------------------------------------------------------
// Counting and checking.

#[derive(Default)]
struct Metrics {
    // Client side.
    requests: AtomicU64,
    retries: AtomicU64,
    duplicates: AtomicU64,
    // Network.
    lost_requests: AtomicU64,
    lost_responses: AtomicU64,
    // Service side.
    replays: AtomicU64,
    conflicts: AtomicU64,
    mismatches: AtomicU64,
    unavailable: AtomicU64,
    takeovers: AtomicU64,
}

/// Everything that must hold at the end; each violation, described.
fn verify(clients: &[Client], provider: &Provider, died: usize, reaped: usize) -> Vec<String> {
    let mut problems = Vec::new();
    if died != reaped {
        problems.push(format!(
            "{died} handlers died holding a claim, but the reaper found {reaped} orphans"
        ));
    }
    let mut payments = 0;
    for client in clients {
        if let Some(job) = client.jobs.front() {
            problems.push(format!("{} never finished", job.request.key));
        }
        for done in &client.finished {
            let req = &done.request;
            let charges = provider.charges(&reference(req.merchant, &req.key));
            match done.expect {
                Expect::Charge => {
                    payments += 1;
                    if done.status != 201 || charges.len() != 1 {
                        problems.push(format!(
                            "payment {}: status {}, charged {} times",
                            req.key,
                            done.status,
                            charges.len()
                        ));
                    } else if charges[0].amount != req.amount
                        || done.payment_id.as_deref() != Some(&*charges[0].payment_id)
                    {
                        problems.push(format!(
                            "payment {}: the client got {:?} for {}, the provider charged {:?}",
                            req.key, done.payment_id, req.amount, charges[0]
                        ));
                    }
                }
                Expect::Reject => {
                    if done.status != 422 || charges.iter().any(|c| c.amount == req.amount) {
                        problems.push(format!(
                            "the reused key {} got {} (charges: {charges:?})",
                            req.key, done.status
                        ));
                    }
                }
            }
        }
    }
    let (executed, _, _) = provider.totals();
    if executed != payments {
        problems.push(format!("{executed} charges for {payments} payments"));
    }
    problems
}

fn report(metrics: &Metrics, provider: &Provider, clients: &[Client], stats: [Stats; 2]) {
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let finished = clients.iter().flat_map(|c| &c.finished);
    let payments = finished
        .clone()
        .filter(|f| f.expect == Expect::Charge)
        .count();
    let reused = finished.filter(|f| f.expect == Expect::Reject).count();
    let (executed, repeated, extra) = provider.totals();
    let [a, b] = stats;
    println!("\nreport");
    println!("  requests sent            {}", get(&metrics.requests));
    println!("    retries                {}", get(&metrics.retries));
    println!("    concurrent duplicates  {}", get(&metrics.duplicates));
    println!("  requests lost            {}", get(&metrics.lost_requests));
    println!(
        "  responses lost           {}",
        get(&metrics.lost_responses)
    );
    println!("  replays (stored 201s)    {}", get(&metrics.replays));
    println!("  in progress (409)        {}", get(&metrics.conflicts));
    println!("  mismatches (422)         {}", get(&metrics.mismatches));
    println!("  provider outages (503)   {}", get(&metrics.unavailable));
    println!("  takeovers                {}", get(&metrics.takeovers));
    println!("  logical payments         {payments} (+ {reused} requests reusing a key)");
    println!("  charges executed         {executed}");
    println!("  duplicate charges        {extra} (on {repeated} payments)");
    println!(
        "  writes per fsync         {:.2}",
        (writes(&a) + writes(&b)) as f64 / (a.commit_batches + b.commit_batches).max(1) as f64
    );
}

/// Durable writes: each claim, completion, release and reap is one record written.
fn writes(s: &Stats) -> u64 {
    s.acquired + s.completes + s.releases + s.reaped
}

fn print_stats(label: &str, s: &Stats) {
    println!(
        "{label}: acquired {}, completes {}, releases {}, replays {}, in_progress {}, \
         mismatches {}, takeovers {}, reaped {}, live {}",
        s.acquired,
        s.completes,
        s.releases,
        s.replays,
        s.in_progress,
        s.mismatches,
        s.takeovers,
        s.reaped,
        s.live_records.unwrap_or_default()
    );
    println!(
        "{}  commit_batches {} for {} writes (group commit: {:.2} writes per fsync)",
        " ".repeat(label.len() - label.trim_start().len()),
        s.commit_batches,
        writes(s),
        writes(s) as f64 / s.commit_batches.max(1) as f64
    );
}
