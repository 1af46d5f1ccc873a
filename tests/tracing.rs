//! The `tracing` feature: a collector installed as the process's subscriber records every span
//! and event with its fields, and the tests read them back. A claim's span names its tenant,
//! endpoint, decision and fence, and nothing recorded ever holds a request body, a fingerprint
//! or a stored response; takeovers, reaps, halts, heals, checkpoints and recoveries are events.
//!
//! Every test names its store, so that it reads only what its own store reported (`store`
//! field) from the one subscriber the process has.
#![cfg(feature = "tracing")]

use idemdb::{Claim, Fingerprint, ManualClock, Resolution, Response, Scope, Store};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

mod observed;

/// A span or an event as recorded.
#[derive(Debug, Clone)]
struct Recorded {
    name: String,
    level: Level,
    fields: BTreeMap<String, String>,
}

impl Recorded {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

#[derive(Default)]
struct Collected {
    /// By span id, in the order they were made.
    spans: Vec<Recorded>,
    ids: HashMap<u64, usize>,
    events: Vec<Recorded>,
}

/// Records everything, at every level.
#[derive(Default, Clone)]
struct Collector {
    next: Arc<AtomicU64>,
    seen: Arc<Mutex<Collected>>,
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl Subscriber for Collector {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let mut recorded = Recorded {
            name: span.metadata().name().to_owned(),
            level: *span.metadata().level(),
            fields: BTreeMap::new(),
        };
        span.record(&mut Fields(&mut recorded.fields));
        let mut seen = self.seen.lock().unwrap();
        let at = seen.spans.len();
        seen.spans.push(recorded);
        seen.ids.insert(id, at);
        Id::from_u64(id)
    }

    fn record(&self, span: &Id, values: &Record<'_>) {
        let mut seen = self.seen.lock().unwrap();
        let at = seen.ids[&span.into_u64()];
        values.record(&mut Fields(&mut seen.spans[at].fields));
    }

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut recorded = Recorded {
            name: event.metadata().name().to_owned(),
            level: *event.metadata().level(),
            fields: BTreeMap::new(),
        };
        event.record(&mut Fields(&mut recorded.fields));
        self.seen.lock().unwrap().events.push(recorded);
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// The process's collector, installed by the first test that asks.
fn collector() -> &'static Collector {
    static COLLECTOR: OnceLock<Collector> = OnceLock::new();
    COLLECTOR.get_or_init(|| {
        let collector = Collector::default();
        tracing::subscriber::set_global_default(collector.clone()).expect("no other subscriber");
        collector
    })
}

/// The spans and events the store named `store` reported.
fn reported(store: &str) -> (Vec<Recorded>, Vec<Recorded>) {
    let seen = collector().seen.lock().unwrap();
    let mine = |r: &&Recorded| r.field("store") == Some(store);
    (
        seen.spans.iter().filter(mine).cloned().collect(),
        seen.events.iter().filter(mine).cloned().collect(),
    )
}

fn message(event: &Recorded) -> &str {
    event.field("message").unwrap_or_default()
}

const BODY: &[u8] = br#"{"card":"4242-SECRET-BODY","amount":5000}"#;
const STORED: &str = "ch_SECRET-RESPONSE";

#[test]
fn a_claim_span_names_tenant_endpoint_decision_and_fence_and_never_the_body() {
    const STORE: &str = "spans";
    collector();
    let store = Store::builder().name(STORE).in_memory().unwrap();
    let scope = Scope::new("tenant_7", "POST /v1/payments");
    let fp = Fingerprint::of(BODY);
    let Claim::Acquired(ticket) = store.claim(&scope, "key-1", fp).unwrap() else {
        panic!("a new key")
    };
    let fence = ticket.fence();
    assert!(matches!(
        store.claim(&scope, "key-1", fp).unwrap(),
        Claim::InProgress { .. }
    ));
    store.complete(ticket, Response::new(201, STORED)).unwrap();
    assert!(matches!(
        store.claim(&scope, "key-1", fp).unwrap(),
        Claim::Replay(_)
    ));
    assert!(matches!(
        store
            .claim(&scope, "key-1", Fingerprint::of(b"other"))
            .unwrap(),
        Claim::Mismatch { .. }
    ));
    assert!(store.claim(&scope, "bad\nkey", fp).is_err());

    let (spans, events) = reported(STORE);
    let claims: Vec<_> = spans.iter().filter(|s| s.name == "claim").collect();
    let decisions: Vec<_> = claims.iter().map(|s| s.field("decision")).collect();
    assert_eq!(
        decisions,
        [
            Some("acquired"),
            Some("in_progress"),
            Some("replay"),
            Some("mismatch"),
            Some("error")
        ]
    );
    for claim in &claims {
        assert_eq!(claim.level, Level::DEBUG);
        assert_eq!(claim.field("tenant"), Some("tenant_7"));
        assert_eq!(claim.field("endpoint"), Some("POST /v1/payments"));
    }
    assert_eq!(claims[0].field("fence"), Some(fence.to_string().as_str()));
    assert_eq!(claims[0].field("takeover"), Some("false"));
    assert!(claims[4].field("error").is_some());
    let complete = spans.iter().find(|s| s.name == "complete").expect("a span");
    assert_eq!(complete.field("fence"), Some(fence.to_string().as_str()));
    assert_eq!(complete.field("tenant"), Some("tenant_7"));

    // Nothing recorded holds the body, the fingerprint, the key or the stored response.
    let fingerprint = format!("{fp:?}");
    let hex: String = fp.as_bytes().iter().map(|b| format!("{b:02x}")).collect();
    let hex = &hex[..16];
    let fingerprint = fingerprint
        .trim_start_matches("Fingerprint(")
        .trim_end_matches(')');
    for recorded in spans.iter().chain(&events) {
        for (name, value) in &recorded.fields {
            for secret in ["SECRET", "key-1", hex, fingerprint] {
                assert!(
                    !value.contains(secret),
                    "{}.{name} = {value:?} holds {secret:?}",
                    recorded.name
                );
            }
        }
    }
}

#[test]
fn takeovers_and_reaps_are_events() {
    const STORE: &str = "takeover";
    collector();
    let clock = ManualClock::new();
    let store = observed::on_clock(STORE, &clock);
    let first = observed::acquire(&store, "a");
    let previous = first.fence();
    drop(first);
    drop(observed::acquire(&store, "b"));
    clock.advance(Duration::from_secs(61));
    let second = observed::acquire(&store, "a");
    assert_eq!(store.reap(|_| Resolution::Release).unwrap(), 1);
    store.release(second).unwrap();

    let (spans, events) = reported(STORE);
    let takeover = events
        .iter()
        .find(|e| message(e).starts_with("takeover"))
        .expect("a takeover event");
    assert_eq!(takeover.level, Level::WARN);
    assert_eq!(
        takeover.field("previous_fence"),
        Some(previous.to_string().as_str())
    );
    assert_eq!(takeover.field("orphan"), Some("true"));
    let reap = spans
        .iter()
        .find(|s| s.name == "reap")
        .expect("a reap span");
    assert_eq!(reap.field("count"), Some("1"));
    let reaped = events
        .iter()
        .find(|e| message(e).starts_with("reaped"))
        .expect("a reap event");
    assert_eq!(reaped.level, Level::INFO);
    assert_eq!(reaped.field("resolved"), Some("1"));
    assert!(spans.iter().any(|s| s.name == "release"));
}

#[test]
fn a_reopen_reports_what_it_recovered_and_checkpoints_are_events() {
    const STORE: &str = "recovery";
    collector();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("recovery.idem");
    let (scope, fp) = (observed::scope(), observed::fp());
    let open = || {
        Store::builder()
            .name(STORE)
            .journal_size(4096)
            .open(&path)
            .unwrap()
    };
    {
        let store = open();
        // Enough batches to fill a 4 KiB journal more than once.
        for i in 0..100 {
            let Claim::Acquired(t) = store.claim(&scope, &format!("k{i}"), fp).unwrap() else {
                panic!()
            };
            store.complete(t, Response::new(200, "ok")).unwrap();
        }
        let Claim::Acquired(orphan) = store.claim(&scope, "orphan", fp).unwrap() else {
            panic!()
        };
        std::mem::forget(orphan);
    }
    let (_, events) = reported(STORE);
    let checkpoint = events
        .iter()
        .find(|e| message(e).starts_with("checkpoint"))
        .expect("a checkpoint event");
    assert_eq!(checkpoint.level, Level::DEBUG);
    drop(open());
    let (_, events) = reported(STORE);
    let recovered = events
        .iter()
        .find(|e| message(e).starts_with("recovered"))
        .expect("a recovery event");
    assert_eq!(recovered.level, Level::INFO);
    assert_eq!(recovered.field("orphans"), Some("1"));
    assert_eq!(recovered.field("records"), Some("101"));
}

#[test]
fn a_halt_is_an_error_and_its_heal_an_info_event() {
    const STORE: &str = "halt";
    collector();
    let _healed = observed::halted_then_healed(STORE);
    let (_, events) = reported(STORE);
    let event = |starts: &str| {
        events
            .iter()
            .find(|e| message(e).starts_with(starts))
            .unwrap_or_else(|| panic!("no {starts} event"))
    };
    let halted = event("halted");
    assert_eq!(halted.level, Level::ERROR);
    assert!(halted.field("cause").is_some());
    assert_eq!(event("healed").level, Level::INFO);
}
