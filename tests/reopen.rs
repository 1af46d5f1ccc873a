//! A reopen test for every state a record can be in: each must come back exactly as it was
//! acknowledged.

#[macro_use]
mod engines;

use idemdb::{Claim, EntryState, Fingerprint, ManualClock, Resolution, Response, Scope, Store};
use std::time::Duration;

on_every_engine! {
    fn every_state_survives_reopen(b: Backend) {
        let clock = ManualClock::new();
        let open = || {
            b.open(
                Store::builder()
                    .clock(clock.clone())
                    .lease(Duration::from_secs(60))
                    .ttl(Duration::from_secs(3600)),
            )
        };
        let scope = Scope::new("t", "POST /x");
        let fp = Fingerprint::of(b"req");
        let acquire = |store: &Store, key: &str| match store.claim(&scope, key, fp).unwrap() {
            Claim::Acquired(t) => t,
            other => panic!("{key}: {other:?}"),
        };

        // t0: claims that will be in progress, taken over or reaped; one record to purge.
        let store = open();
        let in_progress = acquire(&store, "in-progress");
        let extended = acquire(&store, "extended");
        let _abandoned = acquire(&store, "taken-over");
        let _reaped_done = acquire(&store, "reaped-complete");
        let _reaped_gone = acquire(&store, "reaped-release");
        let purged = acquire(&store, "purged");
        store.complete(purged, Response::new(200, "old")).unwrap();

        // t0 + 1 h: "purged" expired and is purged; "expired" completes (expires at t0 + 2 h).
        clock.advance(Duration::from_secs(3600));
        assert_eq!(store.purge_expired().unwrap(), 1);
        let expiring = acquire(&store, "expired");
        store.complete(expiring, Response::new(200, "old")).unwrap();
        store
            .extend(&extended, Duration::from_secs(3 * 3600))
            .unwrap();

        // t0 + 2 h: "expired" is expired but not purged; the rest is made now.
        clock.advance(Duration::from_secs(3600));
        let completed = acquire(&store, "completed");
        store
            .complete(completed, Response::new(201, "done").with_header("a", "b"))
            .unwrap();
        let released = acquire(&store, "released");
        store.release(released).unwrap();
        let successor = acquire(&store, "taken-over");
        assert!(successor.takeover().is_some());
        let mut offered = Vec::new();
        store
            .reap(|s| {
                offered.push(s.key.clone());
                match s.key.as_str() {
                    "reaped-complete" => Resolution::Complete(Response::new(200, "reconciled")),
                    "reaped-release" => Resolution::Release,
                    _ => Resolution::Keep,
                }
            })
            .unwrap();
        offered.sort();
        assert_eq!(
            offered,
            ["in-progress", "reaped-complete", "reaped-release"],
            "the extended and the taken-over claims are live"
        );
        let before = store.stats();
        let highest_fence = successor.fence();
        drop(store);

        let store = open();
        assert_eq!(store.stats().live_records, before.live_records);
        let state = |key: &str| store.get(&scope, key).unwrap().map(|e| e.state);
        assert!(matches!(
            state("in-progress"),
            Some(EntryState::InProgress { orphan: true, .. })
        ));
        assert_eq!(
            store.get(&scope, "in-progress").unwrap().unwrap().fence,
            in_progress.fence()
        );
        match state("extended") {
            Some(EntryState::InProgress {
                lease_deadline,
                orphan: true,
            }) => assert_eq!(lease_deadline, extended.lease_deadline()),
            other => panic!("{other:?}"),
        }
        match state("completed") {
            Some(EntryState::Completed { response, .. }) => {
                assert_eq!(response, Response::new(201, "done").with_header("a", "b"))
            }
            other => panic!("{other:?}"),
        }
        match state("reaped-complete") {
            Some(EntryState::Completed { response, .. }) => assert_eq!(response.body(), b"reconciled"),
            other => panic!("{other:?}"),
        }
        assert_eq!(state("released"), None);
        assert_eq!(state("reaped-release"), None);
        assert_eq!(state("purged"), None);
        assert_eq!(state("expired"), None, "expired, not yet purged");
        let taken = store.get(&scope, "taken-over").unwrap().unwrap();
        assert_eq!(taken.fence, successor.fence());
        assert!(matches!(
            taken.state,
            EntryState::InProgress { orphan: true, .. }
        ));
        assert_eq!(
            store.purge_expired().unwrap(),
            1,
            "the expired record is purged after reopen"
        );
        let next = acquire(&store, "new");
        assert!(next.fence() > highest_fence);
    }
}

on_every_engine! {
    fn completed_and_reaped_responses_replay_after_reopen(b: Backend) {
        let scope = Scope::new("t", "POST /x");
        let fp = Fingerprint::of(b"req");
        let store = b.store();
        let Claim::Acquired(t) = store.claim(&scope, "a", fp).unwrap() else {
            panic!()
        };
        store.complete(t, Response::new(201, "a")).unwrap();
        let Claim::Acquired(_orphaned) = store.claim(&scope, "b", fp).unwrap() else {
            panic!()
        };
        drop(store);
        let store = b.store();
        let resolved = store
            .reap(|s| {
                assert!(s.orphan);
                Resolution::Complete(Response::new(202, "b"))
            })
            .unwrap();
        assert_eq!(resolved, 1);
        drop(store);
        let store = b.store();
        for (key, status) in [("a", 201), ("b", 202)] {
            match store.claim(&scope, key, fp).unwrap() {
                Claim::Replay(r) => {
                    assert_eq!(r.status(), status);
                    assert_eq!(r.body(), key.as_bytes());
                }
                other => panic!("{key}: {other:?}"),
            }
        }
    }
}

/// A store dropped and opened again while another thread spawns processes: each fork shares
/// the store's open files (and the locks on them) until its exec closes them, so the reopen
/// could find its own store's lock held and answer `AlreadyOpen` (seen once in CI, in the CLI
/// tests, which spawn the `idemdb` binary while other tests reopen stores). The open waits a
/// moment for a lock held that briefly.
#[test]
fn reopening_while_other_threads_spawn_processes_is_never_already_open() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.idem");
    drop(idemdb::Store::open(&path).unwrap());
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let spawners: Vec<_> = (0..2)
        .map(|_| {
            let stop = std::sync::Arc::clone(&stop);
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let _ = std::process::Command::new("true").status();
                }
            })
        })
        .collect();
    let mut refused = 0;
    for _ in 0..100 {
        match idemdb::Store::open(&path) {
            Ok(store) => drop(store),
            Err(idemdb::Error::AlreadyOpen) => refused += 1,
            Err(e) => panic!("{e}"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    for s in spawners {
        s.join().unwrap();
    }
    assert_eq!(refused, 0, "reopens refused as AlreadyOpen");
}
