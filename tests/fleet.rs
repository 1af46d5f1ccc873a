//! A fleet of payment-service replicas on one PostgreSQL, under kill -9.
//!
//! Four replica processes (this test binary run again as `fleet_replica`) each serve
//! `POST /pay` on 127.0.0.1 behind the `IdempotencyLayer` over `Store::connect`. The handler
//! "charges" by appending `key fence amount` to a ledger file, which is not the idempotency
//! store, and answers 201 with a body made from the charge. A replica's claims have a 3 s lease
//! and a heartbeat; a replica that starts reaps what is stale with a reconciler that looks the
//! key up in the ledger (charged: complete with the response the handler would have given;
//! not: release), and a handler whose claim is a takeover looks the ledger up before charging.
//!
//! The client sends every logical payment's attempts to random replicas: some attempts give up
//! after a few milliseconds (the response is lost; the handler runs on), some send half a
//! request and hang up (the request is lost), some go out twice at once, and every payment
//! also gets an attempt with another amount under its key. Meanwhile replicas are killed with
//! SIGKILL at random moments and restarted under the same owner name.
//!
//! Checked: every payment charged exactly once, with its own amount; no charge of another
//! amount; every success the client saw, first or replayed, byte-identical to the first; and at
//! the end every payment replays. The counts are printed.

#![cfg(feature = "postgres")]

use idemdb::http::{Claimed, IdempotencyLayer};
use idemdb::{Resolution, Response, Store};
use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const REPLICAS: usize = 4;
/// How long clients start new payments; each one started is then finished.
const RUN: Duration = Duration::from_secs(12);
const CLIENTS: usize = 16;
const LEASE: Duration = Duration::from_secs(3);

/// The response a charge gets: from the handler, or from a reconciler that found it in the
/// ledger. The same bytes either way.
fn receipt(key: &str, amount: u64, fence: u64) -> String {
    format!(r#"{{"payment":"{key}","amount":{amount},"charged_under_fence":{fence}}}"#)
}

/// One line of the ledger: `key fence amount`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Charge {
    key: String,
    fence: u64,
    amount: u64,
}

fn read_ledger(path: &Path) -> Vec<Charge> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|line| {
            let mut parts = line.split(' ');
            let (key, fence, amount) = (parts.next(), parts.next(), parts.next());
            Charge {
                key: key.unwrap().to_owned(),
                fence: fence.unwrap().parse().unwrap(),
                amount: amount.unwrap().parse().unwrap(),
            }
        })
        .collect()
}

fn charged(ledger: &Path, key: &str) -> Option<Charge> {
    read_ledger(ledger).into_iter().find(|c| c.key == key)
}

fn amount_of(body: &[u8]) -> u64 {
    let v: serde_json::Value = serde_json::from_slice(body).expect("a JSON body");
    v["amount"].as_u64().expect("an amount")
}

fn event(path: &Path, what: &str) {
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .unwrap();
    f.write_all(format!("{what}\n").as_bytes()).unwrap();
}

// ---------------------------------------------------------------------------------------------
// A replica.

/// One replica (a child process): serves until it is killed. Run alone (`cargo test --
/// --ignored` runs every ignored test), without the variables its parent sets, it says so and
/// passes.
#[test]
#[ignore = "a child process of a_fleet_of_replicas_under_kill_9_charges_every_payment_exactly_once"]
fn fleet_replica() {
    let Ok(id) = std::env::var("IDEMDB_FLEET_REPLICA") else {
        eprintln!(
            "fleet_replica is a child process of \
             a_fleet_of_replicas_under_kill_9_charges_every_payment_exactly_once, run by it \
             (IDEMDB_FLEET_REPLICA is not set): nothing to do alone"
        );
        return;
    };
    let id: usize = id.parse().unwrap();
    let port: u16 = std::env::var("IDEMDB_FLEET_PORT").unwrap().parse().unwrap();
    let schema = std::env::var("IDEMDB_FLEET_SCHEMA").unwrap();
    let ledger = PathBuf::from(std::env::var("IDEMDB_FLEET_LEDGER").unwrap());
    let events = PathBuf::from(std::env::var("IDEMDB_FLEET_EVENTS").unwrap());
    let store = Store::builder()
        .schema(schema)
        .owner(format!("replica-{id}"))
        .lease(LEASE)
        .connect(&std::env::var("IDEMDB_PG_URL").unwrap())
        .unwrap();
    // At startup: what this replica left when it was killed (its orphans), and whatever else
    // is stale, is settled from the ledger.
    let reaped = store
        .reap(|stale| match charged(&ledger, &stale.key) {
            Some(c) => Resolution::Complete(
                Response::new(201, receipt(&c.key, c.amount, c.fence))
                    .with_header("content-type", "application/json"),
            ),
            None => Resolution::Release,
        })
        .unwrap();
    event(&events, &format!("reaped {reaped}"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let layer = IdempotencyLayer::builder(store, |parts| {
        parts
            .headers
            .get("x-tenant")?
            .to_str()
            .ok()
            .map(str::to_owned)
    })
    .spawner(|handler| {
        tokio::spawn(handler);
    })
    .heartbeat(Duration::from_millis(500))
    .build();
    let app = axum::Router::new()
        .route(
            "/pay",
            axum::routing::post(
                move |axum::Extension(claimed): axum::Extension<Claimed>,
                      body: axum::body::Bytes| {
                    let (ledger, events) = (ledger.clone(), events.clone());
                    async move {
                        let json = [(axum::http::header::CONTENT_TYPE, "application/json")];
                        if claimed.takeover.is_some() {
                            event(&events, "takeover");
                            // An earlier attempt may have charged: look before charging.
                            if let Some(c) = charged(&ledger, &claimed.key) {
                                let body = receipt(&c.key, c.amount, c.fence);
                                return (axum::http::StatusCode::CREATED, json, body);
                            }
                        }
                        let amount = amount_of(&body);
                        tokio::time::sleep(Duration::from_millis(fastrand_ms(50))).await;
                        event(
                            &ledger,
                            &format!("{} {} {amount}", claimed.key, claimed.fence),
                        );
                        tokio::time::sleep(Duration::from_millis(fastrand_ms(50))).await;
                        let body = receipt(&claimed.key, amount, claimed.fence);
                        (axum::http::StatusCode::CREATED, json, body)
                    }
                },
            ),
        )
        .layer(layer);
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        event(
            &PathBuf::from(std::env::var("IDEMDB_FLEET_EVENTS").unwrap()),
            &format!("up {id}"),
        );
        axum::serve(listener, app).await.unwrap();
    });
}

/// A few random milliseconds, below `max`.
fn fastrand_ms(max: u64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(max);
    h.finish() % max
}

// ---------------------------------------------------------------------------------------------
// The fleet, the killer and the client.

struct Fleet {
    ports: Vec<u16>,
    children: Mutex<Vec<Option<Child>>>,
    schema: String,
    ledger: PathBuf,
    events: PathBuf,
}

impl Fleet {
    fn start_replica(&self, id: usize) -> Child {
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "fleet_replica",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("IDEMDB_FLEET_REPLICA", id.to_string())
            .env("IDEMDB_FLEET_PORT", self.ports[id].to_string())
            .env("IDEMDB_FLEET_SCHEMA", &self.schema)
            .env("IDEMDB_FLEET_LEDGER", &self.ledger)
            .env("IDEMDB_FLEET_EVENTS", &self.events)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap()
    }

    fn kill(&self, id: usize) {
        if let Some(mut child) = self.children.lock().unwrap()[id].take() {
            child.kill().unwrap(); // SIGKILL
            child.wait().unwrap();
        }
    }

    fn restart(&self, id: usize) {
        let child = self.start_replica(id);
        self.children.lock().unwrap()[id] = Some(child);
    }
}

/// What an attempt came back with.
#[derive(Debug)]
enum Answer {
    Status(u16, Vec<u8>),
    /// Nothing: refused, cut, or timed out (the response lost).
    Nothing,
}

/// One attempt: `POST /pay` to the replica on `port`, giving up after `timeout`.
fn attempt(port: u16, key: &str, amount: u64, timeout: Duration) -> Answer {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .max_idle_connections(0)
        .build()
        .into();
    match agent
        .post(&format!("http://127.0.0.1:{port}/pay"))
        .header("x-tenant", "shop")
        .header("Idempotency-Key", key)
        .header("content-type", "application/json")
        .send(format!(r#"{{"amount":{amount}}}"#))
    {
        Ok(mut reply) => {
            let status = reply.status().as_u16();
            let body = reply.body_mut().read_to_vec().unwrap_or_default();
            Answer::Status(status, body)
        }
        Err(_) => Answer::Nothing,
    }
}

/// A request lost on the way: half of it is sent, then the connection is closed.
fn lost_request(port: u16, key: &str) {
    if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
        let _ = s.write_all(
            format!(
                "POST /pay HTTP/1.1\r\nhost: x\r\nx-tenant: shop\r\nidempotency-key: {key}\r\n\
                 content-length: 40\r\n\r\n{{\"amo"
            )
            .as_bytes(),
        );
    }
}

#[derive(Default)]
struct Counts {
    requests: AtomicU64,
    retries: AtomicU64,
    lost_responses: AtomicU64,
    lost_requests: AtomicU64,
    duplicates: AtomicU64,
    reused: AtomicU64,
    kills: AtomicU64,
}

#[test]
fn a_fleet_of_replicas_under_kill_9_charges_every_payment_exactly_once() {
    let url = std::env::var("IDEMDB_PG_URL").expect(
        "IDEMDB_PG_URL is not set: run `scripts/with-postgres cargo test --release --features postgres`",
    );
    let dir = tempfile::tempdir().unwrap();
    let schema = format!("fleet_{}", std::process::id());
    // Created once up front, so that the replicas' first connects do not all migrate at once.
    drop(
        Store::builder()
            .schema(schema.clone())
            .connect(&url)
            .unwrap(),
    );
    let ports: Vec<u16> = (0..REPLICAS)
        .map(|_| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        })
        .collect();
    let fleet = Arc::new(Fleet {
        ports,
        children: Mutex::new((0..REPLICAS).map(|_| None).collect()),
        schema,
        ledger: dir.path().join("ledger"),
        events: dir.path().join("events"),
    });
    std::fs::write(&fleet.ledger, "").unwrap();
    for id in 0..REPLICAS {
        fleet.restart(id);
    }
    let counts = Arc::new(Counts::default());
    let stop_killing = Arc::new(AtomicBool::new(false));
    let killer = {
        let (fleet, counts, stop) = (fleet.clone(), counts.clone(), stop_killing.clone());
        std::thread::spawn(move || {
            let mut rng = idemdb::simulation::SplitMix64::derive(0xdead, 0, 1);
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(300 + rng.below(600)));
                let id = rng.index(REPLICAS);
                fleet.kill(id);
                counts.kills.fetch_add(1, Ordering::Relaxed);
                // Mostly back at once (its restart reaps its orphans); one time in three only
                // after its leases ran out, so that other replicas take its claims over.
                let down = if rng.below(3) == 0 {
                    LEASE + Duration::from_millis(500)
                } else {
                    Duration::from_millis(50 + rng.below(250))
                };
                std::thread::sleep(down);
                fleet.restart(id);
            }
        })
    };

    // The client: every payment until it has its 201, from random replicas.
    let first_success: Arc<Mutex<HashMap<String, Vec<u8>>>> = Arc::default();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let begun = Instant::now();
    let deadline = begun + RUN + Duration::from_secs(60);
    std::thread::scope(|s| {
        for c in 0..CLIENTS {
            let (fleet, counts, first_success, next) = (&fleet, &counts, &first_success, &next);
            s.spawn(move || {
                let mut rng = idemdb::simulation::SplitMix64::derive(0xc11e, 0, c as u64);
                while begun.elapsed() < RUN {
                    let n = next.fetch_add(1, Ordering::SeqCst);
                    let key = format!("pay-{n}");
                    let amount = 1000 + n as u64;
                    let mut tries = 0;
                    loop {
                        assert!(
                            Instant::now() < deadline,
                            "{key}: no 201 within the deadline"
                        );
                        tries += 1;
                        if tries > 1 {
                            counts.retries.fetch_add(1, Ordering::Relaxed);
                        }
                        let port = fleet.ports[rng.index(REPLICAS)];
                        let roll = rng.below(100);
                        counts.requests.fetch_add(1, Ordering::Relaxed);
                        let answer = if roll < 8 {
                            counts.lost_requests.fetch_add(1, Ordering::Relaxed);
                            lost_request(port, &key);
                            Answer::Nothing
                        } else if roll < 20 {
                            counts.lost_responses.fetch_add(1, Ordering::Relaxed);
                            attempt(port, &key, amount, Duration::from_millis(1 + rng.below(15)))
                        } else if roll < 30 {
                            // Two at once, to two replicas.
                            counts.duplicates.fetch_add(1, Ordering::Relaxed);
                            counts.requests.fetch_add(1, Ordering::Relaxed);
                            let other = fleet.ports[rng.index(REPLICAS)];
                            let (a, b) = std::thread::scope(|s| {
                                let a =
                                    s.spawn(|| attempt(port, &key, amount, Duration::from_secs(5)));
                                let b = attempt(other, &key, amount, Duration::from_secs(5));
                                (a.join().unwrap(), b)
                            });
                            if matches!(b, Answer::Status(201, _)) {
                                b
                            } else {
                                a
                            }
                        } else {
                            attempt(port, &key, amount, Duration::from_secs(5))
                        };
                        match answer {
                            Answer::Status(201, body) => {
                                let mut firsts = first_success.lock().unwrap();
                                let first = firsts.entry(key.clone()).or_insert(body.clone());
                                assert_eq!(
                                    *first, body,
                                    "{key}: a success that differs from the first"
                                );
                                break;
                            }
                            // In progress, or the store unreachable: retry.
                            Answer::Status(409 | 503, _) | Answer::Nothing => {
                                std::thread::sleep(Duration::from_millis(5 + rng.below(40)));
                            }
                            Answer::Status(status, body) => panic!(
                                "{key}: unexpected {status}: {}",
                                String::from_utf8_lossy(&body)
                            ),
                        }
                    }
                    // The same key with another amount: never charged.
                    counts.reused.fetch_add(1, Ordering::Relaxed);
                    counts.requests.fetch_add(1, Ordering::Relaxed);
                    let port = fleet.ports[rng.index(REPLICAS)];
                    match attempt(port, &key, amount + 1, Duration::from_secs(5)) {
                        Answer::Status(422 | 409 | 503, _) | Answer::Nothing => {}
                        Answer::Status(status, body) => panic!(
                            "{key}: a reused key with another amount got {status}: {}",
                            String::from_utf8_lossy(&body)
                        ),
                    }
                }
            });
        }
    });
    let payments = next.load(Ordering::SeqCst);
    stop_killing.store(true, Ordering::SeqCst);
    killer.join().unwrap();
    for id in 0..REPLICAS {
        if fleet.children.lock().unwrap()[id].is_none() {
            fleet.restart(id);
        }
    }

    // Every acknowledged completion is still there: each payment replays, byte for byte.
    let firsts = first_success.lock().unwrap().clone();
    for (key, body) in &firsts {
        let started = Instant::now();
        loop {
            let port = fleet.ports[key.len() % REPLICAS];
            match attempt(port, key, amount_of(body), Duration::from_secs(5)) {
                Answer::Status(201, replay) => {
                    assert_eq!(
                        &replay, body,
                        "{key}: the replay differs from the first success"
                    );
                    break;
                }
                _ if started.elapsed() < Duration::from_secs(20) => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                other => panic!("{key}: no replay at the end: {other:?}"),
            }
        }
    }
    for id in 0..REPLICAS {
        fleet.kill(id);
    }

    // Exactly one charge per payment, with its amount; none of another amount.
    let ledger = read_ledger(&fleet.ledger);
    let mut per_key: HashMap<&str, Vec<&Charge>> = HashMap::new();
    for charge in &ledger {
        per_key.entry(&charge.key).or_default().push(charge);
    }
    for n in 0..payments {
        let key = format!("pay-{n}");
        let charges = per_key.get(key.as_str()).cloned().unwrap_or_default();
        assert_eq!(
            charges.len(),
            1,
            "{key} charged {} times: {charges:?}",
            charges.len()
        );
        assert_eq!(
            charges[0].amount,
            1000 + n as u64,
            "{key} charged another amount"
        );
        let body = &firsts[&key];
        assert_eq!(
            body,
            receipt(&key, charges[0].amount, charges[0].fence).as_bytes(),
            "{key}: the response names the charge"
        );
    }
    let events = std::fs::read_to_string(&fleet.events).unwrap_or_default();
    let takeovers = events.lines().filter(|l| *l == "takeover").count();
    let reaped: u64 = events
        .lines()
        .filter_map(|l| l.strip_prefix("reaped "))
        .map(|n| n.parse::<u64>().unwrap())
        .sum();
    let c = &counts;
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    println!(
        "fleet: {REPLICAS} replicas, {payments} payments, {} requests ({} retries, {} lost requests, \
         {} lost responses, {} concurrent duplicates, {} reused keys with another amount), \
         {} kills, {takeovers} takeovers, {reaped} reaped at restarts, {} charges",
        get(&c.requests),
        get(&c.retries),
        get(&c.lost_requests),
        get(&c.lost_responses),
        get(&c.duplicates),
        get(&c.reused),
        get(&c.kills),
        ledger.len()
    );
    assert!(get(&c.kills) >= 3, "the run must kill replicas");
}
