//! Bounded resources: one tenant cannot fill the store (`max_live_records_per_tenant`), and the
//! store refuses new keys before its records pass `max_store_bytes`. Each test is named after
//! the rule it checks; most run on both engines (on PostgreSQL the claim statement enforces
//! them, so that replicas cannot race past them).

mod engines;

use idemdb::{
    Claim, Error, Fingerprint, ManualClock, Resolution, Response, Scope, StalePolicy, Store, Ticket,
};
use std::future::Future as _;
use std::time::Duration;

fn scope(tenant: &str) -> Scope {
    Scope::new(tenant, "POST /v1/payments")
}

fn fp() -> Fingerprint {
    Fingerprint::of(b"pay 5000")
}

fn acquired(claim: idemdb::Result<Claim>) -> Ticket {
    match claim {
        Ok(Claim::Acquired(t)) => t,
        other => panic!("expected an acquired claim, got {other:?}"),
    }
}

fn refused(claim: idemdb::Result<Claim>, tenant: &str, limit: u64) {
    match claim {
        Err(Error::TenantFull {
            tenant: t,
            limit: l,
        }) => {
            assert_eq!((t.as_str(), l), (tenant, limit));
        }
        other => panic!("expected TenantFull for {tenant}, got {other:?}"),
    }
}

on_every_engine! {
fn a_tenant_at_its_limit_is_refused_nothing_is_stored_and_other_tenants_are_served(b: Backend) {
    let store = b.open(Store::builder().max_live_records_per_tenant(3));
    let held: Vec<Ticket> = (0..3)
        .map(|i| acquired(store.claim(&scope("a"), &format!("k{i}"), fp())))
        .collect();
    refused(store.claim(&scope("a"), "k3", fp()), "a", 3);
    assert!(
        store.get(&scope("a"), "k3").unwrap().is_none(),
        "a refusal stores nothing"
    );
    assert_eq!(store.record_count().unwrap(), 3);
    // Another tenant, on the same endpoint and the same key.
    let other = acquired(store.claim(&scope("b"), "k3", fp()));
    // The full tenant's own keys still answer: in progress, and once completed, replays.
    assert!(matches!(
        store.claim(&scope("a"), "k0", fp()),
        Ok(Claim::InProgress { .. })
    ));
    let mut held = held.into_iter();
    store
        .complete(held.next().unwrap(), Response::new(201, "paid"))
        .unwrap();
    assert!(matches!(
        store.claim(&scope("a"), "k0", fp()),
        Ok(Claim::Replay(_))
    ));
    // A release makes room for one more.
    store.release(held.next().unwrap()).unwrap();
    let again = acquired(store.claim(&scope("a"), "k3", fp()));
    refused(store.claim(&scope("a"), "k4", fp()), "a", 3);
    drop((again, other, held));
}
}

on_every_engine! {
fn purging_expired_records_and_reaping_stale_claims_make_room_and_a_takeover_needs_none(b: Backend) {
    let clock = ManualClock::new();
    let store = b.open(
        Store::builder()
            .max_live_records_per_tenant(2)
            .ttl(Duration::from_secs(60))
            .lease(Duration::from_secs(10))
            .stale_policy(StalePolicy::TakeOver)
            .clock(clock.clone()),
    );
    let done = acquired(store.claim(&scope("a"), "done", fp()));
    store.complete(done, Response::new(201, "paid")).unwrap();
    std::mem::forget(acquired(store.claim(&scope("a"), "stale", fp())));
    refused(store.claim(&scope("a"), "new", fp()), "a", 2);

    // The stale claim's lease runs out: taking it over replaces its record, so it is allowed.
    clock.advance(Duration::from_secs(11));
    let takeover = acquired(store.claim(&scope("a"), "stale", fp()));
    assert!(takeover.takeover().is_some());
    std::mem::forget(takeover);
    refused(store.claim(&scope("a"), "new", fp()), "a", 2);

    // An expired completion counts until it is purged; then its room is free.
    clock.advance(Duration::from_secs(60));
    refused(store.claim(&scope("a"), "new", fp()), "a", 2);
    assert_eq!(store.purge_expired().unwrap(), 1);
    std::mem::forget(acquired(store.claim(&scope("a"), "new", fp())));
    refused(store.claim(&scope("a"), "newer", fp()), "a", 2);

    // A stale claim the resolver releases frees its room too.
    clock.advance(Duration::from_secs(11));
    let released = store.reap(|_| Resolution::Release).unwrap();
    assert_eq!(released, 2);
    std::mem::forget(acquired(store.claim(&scope("a"), "newer", fp())));
}
}

on_every_engine! {
/// A file counts its tenants' records at open; PostgreSQL keeps them counted in the database.
fn the_counts_hold_when_the_store_is_opened_again_with_a_limit(b: Backend) {
    {
        let store = b.store();
        for i in 0..5 {
            let t = acquired(store.claim(&scope("a"), &format!("k{i}"), fp()));
            store.complete(t, Response::new(201, "paid")).unwrap();
        }
        let t = acquired(store.claim(&scope("b"), "k0", fp()));
        store.complete(t, Response::new(201, "paid")).unwrap();
    }
    // A limit below what the file already holds for `a`: its new keys are refused, its old
    // ones replay, and `b` has room.
    let store = b.open(Store::builder().max_live_records_per_tenant(3));
    refused(store.claim(&scope("a"), "k9", fp()), "a", 3);
    assert!(matches!(
        store.claim(&scope("a"), "k4", fp()),
        Ok(Claim::Replay(_))
    ));
    for i in 1..3 {
        std::mem::forget(acquired(store.claim(&scope("b"), &format!("k{i}"), fp())));
    }
    refused(store.claim(&scope("b"), "k3", fp()), "b", 3);
}
}

on_every_engine! {
fn a_withdrawn_claim_gives_its_room_back(b: Backend) {
    let store = b.open(Store::builder().max_live_records_per_tenant(1));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let s = scope("a");
        let mut claim = Box::pin(store.claim_async(&s, "k0", fp()));
        // Polled once (the claim is queued), then dropped: the claim is withdrawn.
        let _ = claim
            .as_mut()
            .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()));
        drop(claim);
    });
    // Whether it landed and was deleted, or never landed, the tenant has its room.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        match store.claim(&scope("a"), "k1", fp()) {
            Ok(Claim::Acquired(t)) => {
                std::mem::forget(t);
                break;
            }
            Err(Error::TenantFull { .. }) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            other => panic!("after a withdrawal: {other:?}"),
        }
    }
}
}

on_every_engine! {
/// Many callers (and on PostgreSQL two replicas) claiming new keys of one tenant at once: the
/// limit is exact, never passed by a race.
fn concurrent_claims_never_pass_a_tenants_limit(b: Backend) {
    let store = b.open(Store::builder().max_live_records_per_tenant(25));
    let other = b
        .replica(Store::builder().max_live_records_per_tenant(25), "replica-2")
        .unwrap_or_else(|| store.clone());
    let acquired: usize = std::thread::scope(|s| {
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let store = if t % 2 == 0 { store.clone() } else { other.clone() };
                s.spawn(move || {
                    let mut won = 0;
                    for i in 0..10 {
                        match store.claim(&scope("a"), &format!("t{t}-{i}"), fp()) {
                            Ok(Claim::Acquired(t)) => {
                                std::mem::forget(t);
                                won += 1;
                            }
                            Err(Error::TenantFull { limit: 25, .. }) => {}
                            other => panic!("{other:?}"),
                        }
                    }
                    won
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).sum()
    });
    assert_eq!(acquired, 25, "80 new keys of one tenant, a limit of 25");
    assert_eq!(store.record_count().unwrap(), 25);
}
}

on_every_engine! {
fn a_full_store_refuses_new_keys_only_and_purging_makes_room(b: Backend) {
    let clock = ManualClock::new();
    let store = b.open(
        Store::builder()
            .max_store_bytes(40_000)
            .ttl(Duration::from_secs(60))
            .clock(clock.clone()),
    );
    let body = vec![b'r'; 2_000];
    let mut paid = 0;
    let (held, full) = loop {
        let key = format!("k{paid}");
        let t = match store.claim(&scope("a"), &key, fp()) {
            Ok(Claim::Acquired(t)) => t,
            Err(Error::StoreFull { bytes, limit }) => {
                assert_eq!(limit, 40_000);
                assert!(bytes > 30_000, "refused at {bytes} bytes");
                break (None, key);
            }
            other => panic!("{key}: {other:?}"),
        };
        if paid == 15 {
            // One claim stays in progress while the store fills.
            paid += 1;
            break (Some(t), String::new());
        }
        store.complete(t, Response::new(201, body.clone())).unwrap();
        paid += 1;
    };
    let (held, full) = match (held, full) {
        (Some(held), _) => loop {
            let key = format!("k{paid}");
            match store.claim(&scope("a"), &key, fp()) {
                Ok(Claim::Acquired(t)) => {
                    store.complete(t, Response::new(201, body.clone())).unwrap();
                    paid += 1;
                }
                Err(Error::StoreFull { .. }) => break (held, key),
                other => panic!("{key}: {other:?}"),
            }
        },
        (None, _) => panic!("the store filled before one claim could be held"),
    };
    assert!(
        store.get(&scope("a"), &full).unwrap().is_none(),
        "a refusal stores nothing"
    );
    // Past the limit by at most the completion of the last claim admitted below it; every
    // tenant is refused a new key; existing keys still replay.
    let full_at = match store.claim(&scope("b"), "new", fp()) {
        Err(Error::StoreFull { bytes, .. }) => bytes,
        other => panic!("{other:?}"),
    };
    assert!((40_000..40_000 + 2_500).contains(&full_at), "{full_at}");
    assert!(matches!(
        store.claim(&scope("a"), "k0", fp()),
        Ok(Claim::Replay(_))
    ));
    // The claim in progress completes, past the limit: its side effect happened.
    store
        .complete(held, Response::new(201, body.clone()))
        .unwrap();
    match store.claim(&scope("b"), "new", fp()) {
        Err(Error::StoreFull { bytes, .. }) => assert!(bytes > full_at + 1_900, "{bytes}"),
        other => panic!("{other:?}"),
    }
    // Once the completions expire and are purged, there is room again.
    clock.advance(Duration::from_secs(61));
    assert_eq!(store.purge_expired().unwrap(), paid);
    std::mem::forget(acquired(store.claim(&scope("b"), "new", fp())));
}
}

/// The records' bytes are counted as the store runs (each commit adds what it wrote and takes
/// away what it replaced or deleted) and again from the file at open: the two agree.
#[test]
fn the_stored_bytes_counted_as_the_store_runs_match_a_fresh_count_at_open() {
    let clock = ManualClock::new();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("payments.idem");
    let open = || {
        Store::builder()
            .ttl(Duration::from_secs(60))
            .lease(Duration::from_secs(5))
            .journal_size(64 << 10)
            .clock(clock.clone())
            .open(&path)
            .unwrap()
    };
    let store = open();
    let mut rng = 7u64;
    let mut next = |n: u64| {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (rng >> 33) % n
    };
    for i in 0..600 {
        let key = format!("k{}", next(80));
        match store.claim(&scope("a"), &key, fp()) {
            Ok(Claim::Acquired(t)) => match next(4) {
                0 => store.release(t).unwrap(),
                1 => std::mem::forget(t),
                _ => {
                    let size = usize::try_from(next(3000)).unwrap();
                    store
                        .complete(t, Response::new(201, vec![b'x'; size]))
                        .unwrap();
                }
            },
            Ok(_) => {}
            Err(e) => panic!("{e:?}"),
        }
        if i % 100 == 99 {
            clock.advance(Duration::from_secs(20));
            store.purge_expired().unwrap();
        }
    }
    let counted = store.stats().stored_bytes;
    assert!(counted > 0);
    drop(store);
    assert_eq!(open().stats().stored_bytes, counted);
}
