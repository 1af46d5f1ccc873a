//! One test (or more) for every numbered semantic of the core engine, on real files.

use idemdb::{
    Claim, Damaged, EntryState, Error, Fingerprint, InputProblem, ManualClock, Resolution,
    Response, Scope, StalePolicy, Store, Ticket,
};
#[macro_use]
mod engines;

use engines::Backend;
use std::path::PathBuf;
use std::sync::{Arc, Barrier};
use std::time::Duration;

const LEASE: Duration = Duration::from_secs(60);
const TTL: Duration = Duration::from_secs(24 * 3600);

struct Fixture {
    backend: Backend,
    path: PathBuf,
    clock: ManualClock,
    policy: StalePolicy,
}

impl Fixture {
    fn new(backend: Backend) -> Fixture {
        Fixture::with_policy(backend, StalePolicy::TakeOver)
    }

    /// A fixture on a store file, for the tests of the file engine alone.
    fn file() -> Fixture {
        Fixture::new(Backend::file())
    }

    fn with_policy(backend: Backend, policy: StalePolicy) -> Fixture {
        let path = if backend.is_file() {
            backend.path()
        } else {
            PathBuf::new()
        };
        Fixture {
            backend,
            path,
            clock: ManualClock::new(),
            policy,
        }
    }

    fn open(&self) -> Store {
        self.backend.open(
            Store::builder()
                .lease(LEASE)
                .ttl(TTL)
                .stale_policy(self.policy)
                .clock(self.clock.clone()),
        )
    }
}

fn pay() -> Scope {
    Scope::new("tenant_a", "POST /v1/payments")
}

fn fp(body: &str) -> Fingerprint {
    Fingerprint::of(body.as_bytes())
}

fn acquire(store: &Store, scope: &Scope, key: &str, body: &str) -> Ticket {
    match store.claim(scope, key, fp(body)).unwrap() {
        Claim::Acquired(t) => t,
        other => panic!("expected Acquired for {key}, got {other:?}"),
    }
}

fn replay(store: &Store, scope: &Scope, key: &str, body: &str) -> Response {
    match store.claim(scope, key, fp(body)).unwrap() {
        Claim::Replay(r) => r,
        other => panic!("expected Replay for {key}, got {other:?}"),
    }
}

fn assert_in_progress(claim: Claim) -> Duration {
    match claim {
        Claim::InProgress { retry_after, .. } => retry_after,
        other => panic!("expected InProgress, got {other:?}"),
    }
}

fn rich_response() -> Response {
    Response::new(201, b"{\"id\":\"pay_1\",\"bin\":\"\x00\xff\"}".to_vec())
        .with_header("Content-Type", "application/json")
        .with_header("set-cookie", "a=1")
        .with_header("X-Trace", b"\x80raw".to_vec())
        .with_header("set-cookie", "b=2")
}

// 1. A new key is acquired, durably; concurrent claims: exactly one acquires.

on_every_engine! {
    fn new_key_is_acquired_and_survives_reopen(b: Backend) {
        let f = Fixture::new(b);
        let store = f.open();
        let ticket = acquire(&store, &pay(), "k1", "a");
        assert!(ticket.takeover().is_none());
        drop(store);
        let store = f.open();
        assert_in_progress(store.claim(&pay(), "k1", fp("a")).unwrap());
        drop(ticket);
    }
}

on_every_engine! {
    fn concurrent_claims_of_one_key_acquire_exactly_once(b: Backend) {
        let f = Fixture::new(b);
        let store = f.open();
        let threads = 32;
        for round in 0..5 {
            let key = format!("race-{round}");
            let barrier = Arc::new(Barrier::new(threads));
            let outcomes: Vec<Claim> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..threads)
                    .map(|_| {
                        let (store, barrier, key) = (store.clone(), barrier.clone(), key.clone());
                        s.spawn(move || {
                            barrier.wait();
                            store.claim(&pay(), &key, fp("a")).unwrap()
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let acquired = outcomes
                .iter()
                .filter(|c| matches!(c, Claim::Acquired(_)))
                .count();
            assert_eq!(acquired, 1, "round {round}: {outcomes:?}");
            for c in outcomes {
                if let Claim::InProgress { retry_after, .. } = c {
                    assert!(retry_after > Duration::ZERO);
                } else {
                    assert!(matches!(c, Claim::Acquired(_)));
                }
            }
        }
    }
}

// 2. Replay is byte-identical, and survives reopen.

on_every_engine! {
    fn completed_key_replays_byte_identical_response(b: Backend) {
        let f = Fixture::new(b);
        let store = f.open();
        let t = acquire(&store, &pay(), "k1", "a");
        store.complete(t, rich_response()).unwrap();
        let r = replay(&store, &pay(), "k1", "a");
        assert_eq!(r, rich_response());
        assert_eq!(r.headers()[1].0, "set-cookie");
        assert_eq!(r.headers()[3].1, b"b=2");
        drop(store);
        let store = f.open();
        assert_eq!(replay(&store, &pay(), "k1", "a"), rich_response());
        assert_eq!(store.stats().replays, 1);
    }
}

// 3. A different fingerprint is a mismatch, in progress or completed; nothing changes.

on_every_engine! {
    fn different_fingerprint_is_a_mismatch_and_changes_nothing(b: Backend) {
        let f = Fixture::new(b);
        let store = f.open();
        let t = acquire(&store, &pay(), "k1", "amount=5000");
        let before = store.get(&pay(), "k1").unwrap();
        match store.claim(&pay(), "k1", fp("amount=500000")).unwrap() {
            Claim::Mismatch { completed } => assert!(!completed),
            other => panic!("{other:?}"),
        }
        assert_eq!(store.get(&pay(), "k1").unwrap(), before);
        store.complete(t, Response::new(201, "paid")).unwrap();
        let before = store.get(&pay(), "k1").unwrap();
        match store.claim(&pay(), "k1", fp("amount=500000")).unwrap() {
            Claim::Mismatch { completed } => assert!(completed),
            other => panic!("{other:?}"),
        }
        assert_eq!(store.get(&pay(), "k1").unwrap(), before);
        assert_eq!(replay(&store, &pay(), "k1", "amount=5000").body(), b"paid");
        assert_eq!(store.stats().mismatches, 2);
    }
}

// 4. Release deletes durably; the next claim acquires.

on_every_engine! {
    fn release_frees_the_key_durably(b: Backend) {
        let f = Fixture::new(b);
        let store = f.open();
        let t = acquire(&store, &pay(), "k1", "a");
        store.release(t).unwrap();
        assert!(store.get(&pay(), "k1").unwrap().is_none());
        drop(store);
        let store = f.open();
        assert!(store.get(&pay(), "k1").unwrap().is_none());
        let t = acquire(&store, &pay(), "k1", "b");
        store.complete(t, Response::new(200, "second")).unwrap();
        assert_eq!(replay(&store, &pay(), "k1", "b").body(), b"second");
    }
}

// 5. Scopes are (tenant, endpoint, key), encoded without ambiguity.

on_every_engine! {
    fn scopes_are_independent_and_unambiguous(b: Backend) {
        let f = Fixture::new(b);
        let store = f.open();
        let ab_c = Scope::new("ab", "c");
        let a_bc = Scope::new("a", "bc");
        let t1 = acquire(&store, &ab_c, "k", "x");
        let t2 = acquire(&store, &a_bc, "k", "x");
        store.complete(t1, Response::new(200, "ab/c")).unwrap();
        assert_in_progress(store.claim(&a_bc, "k", fp("x")).unwrap());
        store.complete(t2, Response::new(200, "a/bc")).unwrap();
        assert_eq!(replay(&store, &ab_c, "k", "x").body(), b"ab/c");
        assert_eq!(replay(&store, &a_bc, "k", "x").body(), b"a/bc");

        // Same key, other tenant: a fresh record, never the first tenant's response.
        let other_tenant = Scope::new("tenant_b", "POST /v1/payments");
        let t = acquire(&store, &pay(), "shared-key", "x");
        store
            .complete(t, Response::new(201, "secret of a"))
            .unwrap();
        let tb = acquire(&store, &other_tenant, "shared-key", "x");
        assert!(store.get(&other_tenant, "shared-key").unwrap().is_some());
        store.release(tb).unwrap();
        assert_eq!(
            replay(&store, &pay(), "shared-key", "x").body(),
            b"secret of a"
        );
        let other_endpoint = Scope::new("tenant_a", "POST /v1/refunds");
        let _t = acquire(&store, &other_endpoint, "shared-key", "x");
    }
}

// 6. TTL: expired records are absent before purge; purge removes them in time order.

on_every_engine! {
    fn expired_record_is_absent_before_purge(b: Backend) {
        let f = Fixture::new(b);
        let store = f.open();
        let t = acquire(&store, &pay(), "k1", "a");
        store.complete(t, Response::new(200, "old")).unwrap();
        f.clock.advance(TTL - Duration::from_millis(1));
        assert_eq!(replay(&store, &pay(), "k1", "a").body(), b"old");
        f.clock.advance(Duration::from_millis(1));
        assert!(store.get(&pay(), "k1").unwrap().is_none());
        // Expired: even another fingerprint acquires (the old record is gone for every read).
        let t = acquire(&store, &pay(), "k1", "different");
        store.complete(t, Response::new(200, "new")).unwrap();
        assert_eq!(replay(&store, &pay(), "k1", "different").body(), b"new");
        assert_eq!(
            store.purge_expired().unwrap(),
            0,
            "the re-claimed key is live"
        );
        drop(store);
        let store = f.open();
        assert_eq!(replay(&store, &pay(), "k1", "different").body(), b"new");
    }
}

on_every_engine! {
    /// Which records a purge deletes; no order is promised (the file engine goes index stripe
    /// by stripe).
    fn purge_deletes_exactly_the_expired_records_and_keeps_the_rest(b: Backend) {
        let f = Fixture::new(b);
        let store = f.open();
        for i in 0..10 {
            let t = acquire(&store, &pay(), &format!("k{i}"), "a");
            store.complete(t, Response::new(200, "x")).unwrap();
            f.clock.advance(Duration::from_secs(60));
        }
        let _held = acquire(&store, &pay(), "in-progress", "a");
        assert_eq!(store.purge_expired().unwrap(), 0);
        // k0 completed at t0, k9 at t0 + 9 min: advance so that k0..=k3 expired.
        f.clock.advance(TTL - Duration::from_secs(60 * 6 + 1));
        assert_eq!(store.purge_expired().unwrap(), 4);
        for i in 0..10 {
            let present = store.get(&pay(), &format!("k{i}")).unwrap().is_some();
            assert_eq!(present, i >= 4, "k{i}");
        }
        assert!(store.get(&pay(), "in-progress").unwrap().is_some());
        assert_eq!(store.purge_expired().unwrap(), 0);
        assert_eq!(store.stats().purged, 4);
        assert_eq!(store.record_count().unwrap(), 7);
        drop(store);
        let store = f.open();
        assert_eq!(store.record_count().unwrap(), 7, "purge is durable");
        f.clock.advance(TTL);
        assert_eq!(
            store.purge_expired().unwrap(),
            6,
            "in-progress claims never expire"
        );
        assert!(store.get(&pay(), "in-progress").unwrap().is_some());
        assert_eq!(store.record_count().unwrap(), 1);
    }
}

on_every_engine! {
    fn purge_handles_more_than_one_chunk(b: Backend) {
        let f = Fixture::new(b);
        let store = f.open();
        let n = 5000;
        std::thread::scope(|s| {
            for t in 0..8 {
                let store = store.clone();
                s.spawn(move || {
                    for i in (t..n).step_by(8) {
                        let ticket = acquire(&store, &pay(), &format!("k{i}"), "a");
                        store.complete(ticket, Response::new(200, "x")).unwrap();
                    }
                });
            }
        });
        f.clock.advance(TTL);
        assert_eq!(store.purge_expired().unwrap(), n);
        assert_eq!(store.record_count().unwrap(), 0);
    }
}

// 7. Leases: extend renews; stale claims are taken over (default) or kept for reap.

on_every_engine! {
    fn extend_renews_the_lease(b: Backend) {
        let f = Fixture::new(b);
        let store = f.open();
        let t = acquire(&store, &pay(), "k1", "a");
        f.clock.advance(Duration::from_secs(50));
        store.extend(&t, Duration::from_secs(60)).unwrap();
        f.clock.advance(Duration::from_secs(50));
        // 100 s after the claim, past the original lease, but within the extension.
        assert_in_progress(store.claim(&pay(), "k1", fp("a")).unwrap());
        assert_eq!(store.reap(|_| Resolution::Release).unwrap(), 0);
        drop(store);
        let store = f.open();
        match store.get(&pay(), "k1").unwrap().unwrap().state {
            EntryState::InProgress { lease_deadline, .. } => {
                assert_eq!(lease_deadline, t.lease_deadline(), "extension is durable")
            }
            other => panic!("{other:?}"),
        }
    }
}

on_every_engine! {
    fn stale_claim_is_taken_over_and_the_old_ticket_is_fenced_off(b: Backend) {
        let f = Fixture::new(b);
        let store = f.open();
        let old = acquire(&store, &pay(), "k1", "a");
        f.clock.advance(LEASE - Duration::from_millis(1));
        let retry = assert_in_progress(store.claim(&pay(), "k1", fp("a")).unwrap());
        assert!(retry <= Duration::from_millis(1));
        f.clock.advance(Duration::from_millis(1));
        let new = acquire(&store, &pay(), "k1", "a");
        let takeover = new.takeover().expect("a takeover says so");
        assert_eq!(takeover.previous_fence, old.fence());
        assert!(!takeover.orphan);
        assert!(new.fence() > old.fence());
        assert_eq!(store.stats().takeovers, 1);
        // The abandoned attempt wakes up late: it can change nothing.
        assert!(matches!(
            store.extend(&old, LEASE),
            Err(Error::LeaseLost { .. })
        ));
        assert!(matches!(
            store.complete(old, Response::new(200, "late")),
            Err(Error::LeaseLost { .. })
        ));
        store.complete(new, Response::new(200, "new")).unwrap();
        assert_eq!(replay(&store, &pay(), "k1", "a").body(), b"new");
    }
}

on_every_engine! {
    fn stale_claim_with_another_fingerprint_is_a_mismatch_not_a_takeover(b: Backend) {
        let f = Fixture::new(b);
        let store = f.open();
        let _old = acquire(&store, &pay(), "k1", "a");
        f.clock.advance(LEASE);
        assert!(matches!(
            store.claim(&pay(), "k1", fp("b")).unwrap(),
            Claim::Mismatch { completed: false }
        ));
    }
}

on_every_engine! {
    /// `Store::resolve` settles one stale claim as a reap's resolver would: released, the next
    /// claim executes afresh; completed, retries replay the response. The holder it fenced off
    /// can change nothing, and `stats().reaped` counts both.
    fn resolve_releases_or_completes_one_stale_claim(b: Backend) {
        let f = Fixture::new(b);
        let store = f.open();
        let released = acquire(&store, &pay(), "r1", "a");
        let completed = acquire(&store, &pay(), "r2", "a");
        f.clock.advance(LEASE);
        assert!(store
            .resolve(&pay(), "r1", released.fence(), Resolution::Release)
            .unwrap());
        let charged = rich_response();
        assert!(store
            .resolve(&pay(), "r2", completed.fence(), Resolution::Complete(charged.clone()))
            .unwrap());
        assert_eq!(store.stats().reaped, 2);
        assert!(matches!(
            store.complete(released, Response::new(200, "late")),
            Err(Error::LeaseLost { .. })
        ));
        assert!(matches!(
            store.release(completed),
            Err(Error::LeaseLost { .. })
        ));
        let again = acquire(&store, &pay(), "r1", "a");
        assert!(again.takeover().is_none(), "a released key is new again");
        assert_eq!(replay(&store, &pay(), "r2", "a"), charged);
        // Durable: a reopen sees both resolutions.
        drop((again, store));
        let store = f.open();
        assert_eq!(replay(&store, &pay(), "r2", "a"), charged);
    }
}

on_every_engine! {
    /// `Store::resolve` changes nothing unless the key holds a stale claim with that very fence:
    /// a live claim, another fence, a completion, an absent key and `Keep` all answer `false`;
    /// an oversize response and a bad key are typed errors.
    fn resolve_changes_nothing_but_the_stale_claim_it_names(b: Backend) {
        let f = Fixture::new(b);
        let store = f.open();
        let live = acquire(&store, &pay(), "live", "a");
        assert!(!store
            .resolve(&pay(), "live", live.fence(), Resolution::Release)
            .unwrap(), "a claim whose lease runs is its holder's");
        let done = acquire(&store, &pay(), "done", "a");
        let done_fence = done.fence();
        store.complete(done, Response::new(201, "ok")).unwrap();
        let stale = acquire(&store, &pay(), "stale", "a");
        f.clock.advance(LEASE);
        for (key, fence, resolution) in [
            ("done", done_fence, Resolution::Release),
            ("stale", stale.fence() + 1, Resolution::Release),
            ("stale", stale.fence(), Resolution::Keep),
            ("absent", 1, Resolution::Release),
        ] {
            assert!(
                !store.resolve(&pay(), key, fence, resolution.clone()).unwrap(),
                "{key} fence {fence} {resolution:?}"
            );
        }
        let huge = Response::new(200, vec![0u8; 2 << 20]);
        assert!(matches!(
            store.resolve(&pay(), "stale", stale.fence(), Resolution::Complete(huge)),
            Err(Error::ResponseTooLarge { ticket: None, .. })
        ));
        assert!(matches!(
            store.resolve(&pay(), "has space", 1, Resolution::Keep),
            Err(Error::InvalidKey { .. })
        ));
        assert_eq!(store.stats().reaped, 0);
        assert_eq!(replay(&store, &pay(), "done", "a").body(), b"ok");
        // The stale claim is still there to be taken over, and the live one still held.
        let taken = acquire(&store, &pay(), "stale", "a");
        assert_eq!(taken.takeover().map(|t| t.previous_fence), Some(stale.fence()));
        store.complete(live, Response::new(200, "mine")).unwrap();
    }
}

on_every_engine! {
    fn keep_policy_leaves_stale_claims_to_reap(b: Backend) {
        let f = Fixture::with_policy(b, StalePolicy::Keep);
        let store = f.open();
        let old = acquire(&store, &pay(), "k1", "a");
        let _other = acquire(&store, &pay(), "k2", "a");
        f.clock.advance(LEASE * 2);
        assert_in_progress(store.claim(&pay(), "k1", fp("a")).unwrap());
        let mut seen = Vec::new();
        let resolved = store
            .reap(|stale| {
                seen.push((stale.key.clone(), stale.fence, stale.orphan));
                if stale.key == "k1" {
                    Resolution::Complete(Response::new(200, "reconciled"))
                } else {
                    Resolution::Keep
                }
            })
            .unwrap();
        seen.sort();
        assert_eq!(resolved, 1);
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0], ("k1".into(), old.fence(), false));
        assert_eq!(replay(&store, &pay(), "k1", "a").body(), b"reconciled");
        assert!(matches!(
            store.complete(old, Response::new(200, "late")),
            Err(Error::LeaseLost { .. })
        ));
        // Kept: offered again on the next reap.
        assert_eq!(store.reap(|_| Resolution::Release).unwrap(), 1);
        let _t = acquire(&store, &pay(), "k2", "a");
        assert_eq!(store.stats().reaped, 2);
    }
}

on_every_engine! {
    fn reap_sees_stale_claims_under_the_takeover_policy_too(b: Backend) {
        let f = Fixture::new(b);
        let store = f.open();
        let t = acquire(&store, &pay(), "k1", "a");
        let _live = acquire(&store, &pay(), "k2", "a");
        f.clock.advance(LEASE);
        let _fresh = acquire(&store, &pay(), "k3", "a");
        let mut keys = Vec::new();
        store
            .reap(|s| {
                keys.push(s.key.clone());
                Resolution::Keep
            })
            .unwrap();
        keys.sort();
        assert_eq!(keys, ["k1", "k2"]);
        assert_eq!(store.reap(|_| Resolution::Release).unwrap(), 2);
        assert!(matches!(store.release(t), Err(Error::LeaseLost { .. })));
    }
}

// 8. After reopen, in-progress records are orphans: reap sees them at once; claims wait out
//    the lease.

on_every_engine! {
    fn orphans_are_reaped_at_once_but_claims_wait_for_the_lease(b: Backend) {
        let f = Fixture::new(b);
        let store = f.open();
        let before = acquire(&store, &pay(), "k1", "a");
        let before_fence = before.fence();
        let _t2 = acquire(&store, &pay(), "k2", "a");
        drop(store);
        let store = f.open();
        assert_in_progress(store.claim(&pay(), "k1", fp("a")).unwrap());
        let mut orphans = Vec::new();
        store
            .reap(|s| {
                assert!(s.orphan);
                orphans.push(s.key.clone());
                if s.key == "k2" {
                    Resolution::Release
                } else {
                    Resolution::Keep
                }
            })
            .unwrap();
        orphans.sort();
        assert_eq!(orphans, ["k1", "k2"]);
        let _t = acquire(&store, &pay(), "k2", "a");
        f.clock.advance(LEASE);
        let t = acquire(&store, &pay(), "k1", "a");
        let takeover = t.takeover().unwrap();
        assert!(takeover.orphan);
        assert_eq!(takeover.previous_fence, before_fence);
        // The pre-reopen ticket is from another store instance: fenced off.
        assert!(matches!(
            store.complete(before, Response::new(200, "")),
            Err(Error::LeaseLost { .. })
        ));
    }
}

on_every_engine! {
    /// A dropped ticket is a holder gone, as a crash is: its claim is an orphan at once. Reap
    /// offers it straight away; duplicates are told to come back when the lease ends (nobody is
    /// left to finish it sooner), not after the usual one-second hint; the lease still holds the
    /// key, since the side effect may have happened.
fn a_dropped_ticket_is_an_orphan_reaped_at_once_and_duplicates_hear_the_lease_end(b: Backend) {
        let f = Fixture::new(b);
        let store = f.open();
        let ticket = acquire(&store, &pay(), "k1", "a");
        let live = acquire(&store, &pay(), "k2", "a");
        f.clock.advance(Duration::from_secs(20));
        let Claim::InProgress { retry_after, .. } = store.claim(&pay(), "k1", fp("a")).unwrap() else {
            panic!("held")
        };
        assert_eq!(
            retry_after,
            Duration::from_secs(1),
            "a live holder: the hint"
        );
        drop(ticket);
        let Claim::InProgress {
            retry_after,
            lease_remaining,
            orphan,
        } = store.claim(&pay(), "k1", fp("a")).unwrap()
        else {
            panic!("the lease still holds the key")
        };
        assert_eq!(retry_after, Duration::from_secs(40), "the holder is gone");
        assert_eq!(lease_remaining, retry_after);
        assert!(orphan, "a dropped ticket's claim is an orphan");
        let mut offered = Vec::new();
        store
            .reap(|s| {
                offered.push((s.key.clone(), s.orphan));
                Resolution::Keep
            })
            .unwrap();
        assert_eq!(
            offered,
            [("k1".to_owned(), true)],
            "only the abandoned claim"
        );
        store.complete(live, Response::new(201, "ok")).unwrap();
        f.clock.advance(Duration::from_secs(40));
        let taker = acquire(&store, &pay(), "k1", "a");
        assert!(taker.takeover().unwrap().orphan);
    }
}

// 9. Fencing tokens only grow, across restarts.

on_every_engine! {
    fn fences_grow_across_reopens(b: Backend) {
        let f = Fixture::new(b);
        let mut last = 0;
        for round in 0..4 {
            let store = f.open();
            for i in 0..5 {
                let t = acquire(&store, &pay(), &format!("r{round}-{i}"), "a");
                assert!(t.fence() > last, "fence {} after {last}", t.fence());
                last = t.fence();
                if i % 2 == 0 {
                    store.release(t).unwrap();
                } else {
                    store.complete(t, Response::new(200, "")).unwrap();
                }
            }
        }
    }
}

on_every_engine! {
    fn released_or_completed_tickets_are_lost(b: Backend) {
        let f = Fixture::new(b);
        let store = f.open();
        let t = acquire(&store, &pay(), "k1", "a");
        let fence = t.fence();
        store.release(t).unwrap();
        let t2 = acquire(&store, &pay(), "k1", "a");
        assert!(t2.fence() > fence);
        store.complete(t2, Response::new(200, "x")).unwrap();
        // A ticket of another store never matches, even with the same key.
        let other = Store::in_memory().unwrap();
        let foreign = acquire(&other, &pay(), "k1", "a");
        assert!(matches!(
            store.release(foreign),
            Err(Error::LeaseLost { .. })
        ));
        assert_eq!(replay(&store, &pay(), "k1", "a").body(), b"x");
    }
}

// 10. Input is validated; bad input stores nothing.

on_every_engine! {
    fn invalid_keys_are_refused_and_store_nothing(b: Backend) {
        let f = Fixture::new(b);
        let store = f.open();
        let long = "k".repeat(256);
        for key in ["", "has space", "tab\t", "é", "nul\0", long.as_str()] {
            match store.claim(&pay(), key, fp("a")) {
                Err(Error::InvalidKey { .. }) => {}
                other => panic!("{key:?}: {other:?}"),
            }
            assert!(matches!(
                store.get(&pay(), key),
                Err(Error::InvalidKey { .. })
            ));
        }
        assert!(matches!(
            store.claim(&pay(), &long, fp("a")),
            Err(Error::InvalidKey {
                reason: InputProblem::TooLong { len: 256, max: 255 }
            })
        ));
        for scope in [
            Scope::new("", "POST /x"),
            Scope::new("t", ""),
            Scope::new("t".repeat(256), "POST /x"),
            Scope::new("t", "e".repeat(1025)),
        ] {
            assert!(matches!(
                store.claim(&scope, "k", fp("a")),
                Err(Error::InvalidScope { .. })
            ));
        }
        assert_eq!(store.record_count().unwrap(), 0);
        assert_eq!(store.stats().commit_batches, 0);
        let _ok = acquire(
            &store,
            &Scope::new("t".repeat(255), "e".repeat(1024)),
            &"~".repeat(255),
            "a",
        );
    }
}

on_every_engine! {
    fn oversize_response_is_refused_and_the_claim_stays_held(b: Backend) {
        let f = Fixture::new(b);
        let store = f.backend.open(
            Store::builder()
                .max_response_bytes(1024)
                .clock(f.clock.clone()),
        );
        let t = acquire(&store, &pay(), "k1", "a");
        let err = store
            .complete(t, Response::new(200, vec![0u8; 2000]))
            .unwrap_err();
        assert!(err.to_string().contains("1024"), "{err}");
        let Error::ResponseTooLarge {
            limit: 1024,
            ticket: Some(t),
            ..
        } = err
        else {
            panic!("{err:?}")
        };
        assert_in_progress(store.claim(&pay(), "k1", fp("a")).unwrap());
        let t = *t;
        store
            .complete(t, Response::new(200, vec![0u8; 900]))
            .unwrap();
    }
}

// 12. A corrupt record is never served: the request that needs it gets `Corrupted`, naming the
// key. (The open reads heads, not records, so it no longer meets the damage; `idemdb verify`
// reads every record.)

/// Completes one record, flips one bit of it at `at(value length)`, opens the store (which
/// works: nothing else is damaged) and retries the key, which must be refused with `Corrupted`;
/// returns what the error says.
fn retry_after_damage(at: impl Fn(usize) -> usize) -> (Damaged, String) {
    let f = Fixture::file();
    let store = f.open();
    let t = acquire(&store, &pay(), "victim-key", "a");
    store.complete(t, Response::new(200, "paid")).unwrap();
    drop(store);
    // A reopen checkpoints the journal into the store file; damage done after that has no
    // intact copy left in the journal to recover from.
    drop(f.open());
    flip_a_bit_in_every_record(&f.path, at);
    let store = f.open();
    match store.claim(&pay(), "victim-key", fp("a")) {
        Err(Error::Corrupted { damaged, reason }) => (damaged, reason),
        other => panic!("expected Corrupted, got {other:?}"),
    }
}

#[test]
fn a_corrupt_record_is_refused_to_its_retry_naming_the_key() {
    let (damaged, reason) = retry_after_damage(|len| len - 10);
    let Damaged::Record {
        fence: Some(_),
        key: Some(key),
    } = &damaged
    else {
        panic!("a record, named by its fence and key: {damaged:?}")
    };
    assert!(key.contains("victim-key"), "{key}");
    assert!(reason.contains("crc32"), "{reason}");
}

#[test]
fn a_corrupt_record_whose_key_is_damaged_names_its_place() {
    // Byte 0 is the format, 1..3 the key length: flip a bit of the key length.
    let (damaged, reason) = retry_after_damage(|_| 1);
    assert!(
        matches!(
            damaged,
            Damaged::Record {
                fence: Some(_),
                key: None
            }
        ),
        "the record's place, its key unreadable: {damaged:?}"
    );
    assert!(reason.contains("crc32"), "{reason}");
}

#[test]
fn a_second_open_of_the_same_file_is_refused() {
    let f = Fixture::file();
    let _store = f.open();
    match Store::open(&f.path) {
        Err(Error::AlreadyOpen) => {}
        other => panic!("expected AlreadyOpen, got {other:?}"),
    }
}

#[test]
fn a_file_that_is_not_a_store_is_refused() {
    let f = Fixture::file();
    std::fs::write(&f.path, b"this is not a redb file, just some text").unwrap();
    assert!(Store::open(&f.path).is_err());
}

/// Flips one bit in the middle of every stored record value, the way a damaged sector would.
fn flip_a_bit_in_every_record(path: &std::path::Path, at: impl Fn(usize) -> usize) {
    use redb::ReadableTable as _;
    let records: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("records");
    let db = redb::Database::open(path).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let mut table = txn.open_table(records).unwrap();
        let entries: Vec<(u64, Vec<u8>)> = table
            .iter()
            .unwrap()
            .map(|e| {
                let (k, v) = e.unwrap();
                (k.value(), v.value().to_vec())
            })
            .collect();
        assert!(!entries.is_empty());
        for (fence, mut value) in entries {
            let at = at(value.len());
            value[at] ^= 0x01;
            table.insert(fence, value.as_slice()).unwrap();
        }
    }
    txn.commit().unwrap();
}

#[test]
fn creating_a_store_leaves_only_the_store_file_its_journal_and_its_reserve() {
    let f = Fixture::file();
    drop(f.open());
    let store = f.path.file_name().unwrap().to_str().unwrap();
    assert_eq!(
        files_beside(&f.path),
        [
            store.to_owned(),
            format!("{store}-journal"),
            format!("{store}-reserve")
        ]
    );
    // Made with its blocks: three journals of the default 16 MiB.
    let reserve = f.path.with_file_name(format!("{store}-reserve"));
    assert_eq!(std::fs::metadata(reserve).unwrap().len(), 48 << 20);
}

/// `reserve_size(0)` keeps no reserve: no file is made (and no claim is refused for space).
#[test]
fn a_store_without_a_reserve_makes_no_reserve_file() {
    let f = Fixture::file();
    let store = Store::builder().reserve_size(0).open(&f.path).unwrap();
    let t = acquire(&store, &pay(), "k", "{}");
    store.complete(t, Response::new(200, "ok")).unwrap();
    assert!(!store.stats().disk_full);
    drop(store);
    let name = f.path.file_name().unwrap().to_str().unwrap();
    assert_eq!(
        files_beside(&f.path),
        [name.to_owned(), format!("{name}-journal")]
    );
}

/// The names of the files in the store file's directory, sorted.
fn files_beside(path: &std::path::Path) -> Vec<String> {
    let mut names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// An empty file where a store should be cannot be told from a store truncated to nothing:
/// it is refused, and left as it is, never quietly made into a new, empty store (whose first
/// claims would repeat every payment the lost one held).
#[test]
fn an_empty_store_file_is_refused_and_left_as_it_is() {
    let f = Fixture::file();
    std::fs::File::create(&f.path).unwrap();
    match Store::open(&f.path) {
        Err(Error::Corrupted {
            damaged: Damaged::File,
            reason,
        }) => assert!(reason.contains("empty"), "{reason}"),
        other => panic!("an empty store file: {other:?}"),
    }
    assert_eq!(std::fs::metadata(&f.path).unwrap().len(), 0);
    assert!(!idemdb_journal(&f.path).exists(), "no journal made");
}

fn idemdb_journal(store: &std::path::Path) -> PathBuf {
    let mut name = store.as_os_str().to_owned();
    name.push("-journal");
    name.into()
}

/// Regression: a crash while creating a new store left a half-made redb file at the store's
/// path, which redb then refused to open ("magic number mismatch"), locking the user out of a
/// store that never held anything. Creation now builds the file under a temporary name and links
/// it into place; a leftover temporary file from such a crash does not get in the way.
#[test]
fn a_crash_during_creation_leaves_no_half_made_store() {
    let f = Fixture::file();
    let stray = f.path.with_file_name("store.idem.creating-4242-17");
    std::fs::write(&stray, vec![0u8; 4096]).unwrap();
    let store = f.open();
    let _t = acquire(&store, &pay(), "k1", "a");
    drop(store);
    let store = f.open();
    assert_in_progress(store.claim(&pay(), "k1", fp("a")).unwrap());
    assert!(
        stray.exists(),
        "another creator's temporary file is never touched"
    );
}

/// The journal may hold acknowledged writes that the store file does not have yet, so a store
/// whose file names a journal epoch refuses to open without the journal: when the file is gone,
/// and when the journal is turned off. Opening anyway would silently drop the completion below.
#[test]
fn a_store_refuses_to_open_without_the_journal_its_file_names() {
    let f = Fixture::file();
    let store = f.open();
    let t = acquire(&store, &pay(), "journaled", "a");
    store.complete(t, Response::new(200, "paid")).unwrap();
    drop(store);
    let mut journal = f.path.as_os_str().to_owned();
    journal.push("-journal");
    let saved = std::fs::read(&journal).unwrap();
    std::fs::remove_file(&journal).unwrap();
    for attempt in [
        Store::builder().open(&f.path),
        Store::builder().journal_size(0).open(&f.path),
    ] {
        match attempt {
            Err(Error::Corrupted { reason, .. }) => {
                assert!(reason.contains("journal"), "{reason}");
            }
            other => panic!("expected Corrupted, got {other:?}"),
        }
    }
    // With the journal back, the acknowledged completion is there.
    std::fs::write(&journal, saved).unwrap();
    let store = f.open();
    assert!(matches!(
        store.claim(&pay(), "journaled", fp("a")).unwrap(),
        Claim::Replay(r) if r.body() == b"paid"
    ));
}

// 13. Damaged and mismatched files (issue 11): refused with a typed error, never replayed,
//     never quietly shortened. `tests/damage.rs` sweeps every class; these name each bug.

/// Copies a store's two files while the store is open, as a backup tool or a crash would leave
/// them: the journal holds writes the store file does not have yet.
fn live_copy(from: &std::path::Path, to: &std::path::Path) {
    std::fs::copy(from, to).unwrap();
    std::fs::copy(idemdb_journal(from), idemdb_journal(to)).unwrap();
}

/// A store with `n` more completed keys, and a live copy of it at `copy`.
fn completed_then_copied(f: &Fixture, n: usize, copy: &std::path::Path) -> Store {
    let store = f.open();
    let first = usize::try_from(store.record_count().unwrap()).unwrap();
    for i in first..first + n {
        let t = acquire(&store, &pay(), &format!("k{i}"), "a");
        store
            .complete(t, Response::new(201, format!("paid {i}")))
            .unwrap();
    }
    live_copy(&f.path, copy);
    store
}

fn open_copy(f: &Fixture, copy: &std::path::Path) -> idemdb::Result<Store> {
    Store::builder()
        .lease(LEASE)
        .clock(f.clock.clone())
        .open(copy)
}

/// Regression: a journal cut short made the open stop at the cut, re-extend the file with
/// zeroes and carry on, so every completion since the last checkpoint was gone and the next
/// claim of a completed key was `Acquired`: the payment ran again.
#[test]
fn a_truncated_journal_refuses_the_open_instead_of_losing_completions() {
    let f = Fixture::file();
    let copy = f.path.with_file_name("copy.idem");
    let _store = completed_then_copied(&f, 5, &copy);
    let journal = idemdb_journal(&copy);
    let len = std::fs::metadata(&journal).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&journal)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    match open_copy(&f, &copy) {
        Err(Error::Corrupted {
            damaged: Damaged::Journal,
            reason,
        }) => assert!(reason.contains("truncated"), "{reason}"),
        other => panic!("a truncated journal: {other:?}"),
    }
    assert_eq!(
        std::fs::metadata(&journal).unwrap().len(),
        len / 2,
        "not re-extended"
    );
}

/// Regression: a damaged journal entry ended the replay there, silently dropping every
/// acknowledged entry after it.
#[test]
fn a_damaged_journal_entry_before_intact_ones_refuses_the_open() {
    let f = Fixture::file();
    let copy = f.path.with_file_name("copy.idem");
    let _store = completed_then_copied(&f, 5, &copy);
    let journal = idemdb_journal(&copy);
    let mut bytes = std::fs::read(&journal).unwrap();
    bytes[1024 + 40] ^= 0x20; // inside the first entry (docs/format.md: entries from 1024)
    std::fs::write(&journal, bytes).unwrap();
    match open_copy(&f, &copy) {
        Err(Error::Corrupted {
            damaged: Damaged::Journal,
            reason,
        }) => assert!(reason.contains("intact"), "{reason}"),
        other => panic!("damage before intact entries: {other:?}"),
    }
}

/// Regression: nothing tied a journal to its store, so a store file put beside another store's
/// journal replayed it, and a key this store only held in progress came back `Replay` with a
/// response it never stored.
#[test]
fn another_stores_journal_is_refused_never_replayed() {
    let f = Fixture::file();
    let g = Fixture::file();
    let mine = f.path.with_file_name("mine.idem");
    let theirs = g.path.with_file_name("theirs.idem");
    let _a = completed_then_copied(&f, 3, &mine);
    let _b = completed_then_copied(&g, 6, &theirs);
    std::fs::copy(idemdb_journal(&theirs), idemdb_journal(&mine)).unwrap();
    match open_copy(&f, &mine) {
        Err(Error::JournalMismatch {
            journal_store,
            store,
            ..
        }) => assert_ne!(journal_store, store),
        other => panic!("a foreign journal: {other:?}"),
    }
}

/// Regression: a store file restored from an older backup beside its current journal (or
/// rolled back by redb to its previous commit) is older than the journal; replaying what the
/// journal holds of a later epoch into it, or skipping it, loses acknowledged writes. Refused.
#[test]
fn a_store_file_older_than_its_journal_is_refused() {
    let f = Fixture::file();
    let backup = f.path.with_file_name("backup.idem");
    drop(completed_then_copied(&f, 2, &backup));
    let old_store = std::fs::read(&f.path).unwrap();
    // Two more lives: the store file's epoch moves on at the first one's close, which
    // checkpoints its write. (A life that writes nothing leaves the epoch where it was, and the
    // file as it was: restoring a copy from before it would lose nothing.)
    let copy = f.path.with_file_name("copy.idem");
    let between = f.path.with_file_name("between.idem");
    drop(completed_then_copied(&f, 1, &between));
    let _store = completed_then_copied(&f, 4, &copy);
    std::fs::write(&copy, old_store).unwrap();
    match open_copy(&f, &copy) {
        Err(Error::JournalMismatch {
            journal_epoch,
            store_epoch,
            ..
        }) => assert!(journal_epoch > store_epoch),
        other => panic!("a store file older than its journal: {other:?}"),
    }
}

/// Regression: a `meta` table that lost `journal_epoch` read as epoch 0, and the journal was
/// skipped without a word. Every value is required now.
#[test]
fn a_meta_table_that_lost_a_value_is_refused_not_defaulted() {
    for lost in [
        "journal_epoch",
        "store_id",
        "fence_reserved",
        "journal_bytes",
    ] {
        let f = Fixture::file();
        drop(f.open());
        {
            let db = redb::Database::open(&f.path).unwrap();
            let txn = db.begin_write().unwrap();
            txn.open_table(redb::TableDefinition::<&str, u64>::new("meta"))
                .unwrap()
                .remove(lost)
                .unwrap();
            txn.commit().unwrap();
        }
        match Store::open(&f.path) {
            Err(Error::Corrupted {
                damaged: Damaged::Meta,
                reason,
            }) => assert!(reason.contains(lost), "{reason}"),
            other => panic!("meta without {lost}: {other:?}"),
        }
    }
}
