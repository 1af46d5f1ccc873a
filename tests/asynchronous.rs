//! The async API: durable before it resolves, never blocking the polling thread on an fsync,
//! sharing batches, failing with the store, and letting the file go when the store is dropped.

#[macro_use]
mod engines;

use idemdb::simulation::SimDisk;
use idemdb::{Claim, Error, Fingerprint, Response, Scope, Store};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

/// Wakes by setting a flag; the single-threaded executor below polls whatever was woken.
struct Flag(AtomicBool, std::thread::Thread);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
        self.1.unpark();
    }
}

/// Polls every future on this one thread until all are done; returns their outputs and how
/// many times the thread found nothing ready and parked (it never blocks inside a poll).
fn run_all<F: Future>(futures: Vec<F>) -> (Vec<F::Output>, usize) {
    let flag = Arc::new(Flag(AtomicBool::new(true), std::thread::current()));
    let waker = Waker::from(flag.clone());
    let mut cx = Context::from_waker(&waker);
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    let mut parks = 0;
    while outputs.iter().any(Option::is_none) {
        if !flag.0.swap(false, Ordering::SeqCst) {
            std::thread::park_timeout(std::time::Duration::from_millis(100));
            parks += 1;
            continue;
        }
        for (f, out) in futures.iter_mut().zip(outputs.iter_mut()) {
            if out.is_none() {
                if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                    *out = Some(v);
                }
            }
        }
    }
    (outputs.into_iter().map(Option::unwrap).collect(), parks)
}

fn scope() -> Scope {
    Scope::new("tenant", "POST /v1/payments")
}

fn assert_send<T: Send>(_: &T) {}

/// How long a withdrawn claim may hold its key: none on the file engine (the index changes
/// at once), one round trip on PostgreSQL (the withdrawal is a statement).
const FREED_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);

on_every_engine! {
    fn many_async_claims_on_one_thread_share_fsyncs(b: Backend) {
        let store = b.store();
        let keys: Vec<String> = (0..64).map(|i| format!("key-{i}")).collect();
        let scope = scope();
        let fp = Fingerprint::of(b"req");
        let claims: Vec<_> = keys
            .iter()
            .map(|k| store.claim_async(&scope, k, fp))
            .collect();
        assert_send(&claims[0]);
        let (outcomes, _) = run_all(claims);
        let tickets: Vec<_> = outcomes
            .into_iter()
            .map(|c| match c.unwrap() {
                Claim::Acquired(t) => t,
                other => panic!("{other:?}"),
            })
            .collect();
        let stats = store.stats();
        assert_eq!(stats.acquired, 64);
        assert!(
            stats.commit_batches < 64,
            "64 claims polled together on one thread share batches: {stats:?}"
        );
        let completes: Vec<_> = tickets
            .into_iter()
            .map(|t| {
                let body = format!("paid {}", t.fence());
                store.complete_async(t, Response::new(201, body))
            })
            .collect();
        let (done, _) = run_all(completes);
        assert!(done.iter().all(Result::is_ok));
        drop(store);
        // Dropping the store let go of the file at once, flusher thread or not; and every
        // acknowledged completion is there.
        let store = b.store();
        for k in &keys {
            assert!(matches!(
                store.claim(&scope, k, fp).unwrap(),
                Claim::Replay(r) if r.status() == 201
            ));
        }
    }
}

on_every_engine! {
    fn async_and_blocking_callers_mix(b: Backend) {
        let store = b.store();
        let scope = scope();
        let fp = Fingerprint::of(b"req");
        std::thread::scope(|s| {
            for t in 0..4 {
                let (store, scope) = (&store, &scope);
                s.spawn(move || {
                    for i in 0..25 {
                        let key = format!("sync-{t}-{i}");
                        let Claim::Acquired(ticket) = store.claim(scope, &key, fp).unwrap() else {
                            panic!()
                        };
                        store.release(ticket).unwrap();
                    }
                });
            }
            let futures: Vec<_> = (0..100)
                .map(|i| {
                    let (store, scope) = (&store, &scope);
                    async move {
                        let key = format!("async-{i}");
                        let Claim::Acquired(ticket) = store.claim_async(scope, &key, fp).await? else {
                            panic!()
                        };
                        store
                            .extend_async(&ticket, std::time::Duration::from_secs(90))
                            .await?;
                        store.release_async(ticket).await
                    }
                })
                .collect();
            let (results, _) = run_all(futures);
            assert!(results.iter().all(Result::is_ok), "{results:?}");
        });
        let stats = store.stats();
        assert_eq!(stats.acquired, 200);
        assert_eq!(stats.releases, 200);
        assert_eq!(store.record_count().unwrap(), 0);
    }
}

#[test]
fn a_failed_commit_fails_every_async_waiter() {
    let disk = SimDisk::new();
    let store = Store::builder().open_simulated(&disk).unwrap();
    disk.fail_sync_after(0, true);
    let scope = scope();
    let fp = Fingerprint::of(b"req");
    let keys: Vec<String> = (0..8).map(|i| format!("k{i}")).collect();
    let (results, _) = run_all(
        keys.iter()
            .map(|k| store.claim_async(&scope, k, fp))
            .collect(),
    );
    assert!(results.iter().all(Result::is_err), "{results:?}");
    assert!(matches!(
        store.claim(&scope, "later", fp),
        Err(Error::Halted { .. })
    ));
}

/// Polls `future` once, with a waker that does nothing, and returns it still pending.
fn poll_once<F: Future>(future: F) -> Pin<Box<F>> {
    let mut future = Box::pin(future);
    let mut cx = Context::from_waker(Waker::noop());
    assert!(
        future.as_mut().poll(&mut cx).is_pending(),
        "the claim waits for its fsync"
    );
    future
}

on_every_engine! {
    /// Regression: a `claim_async` future dropped while its claim was being made durable (the HTTP
    /// request of a client that hung up) left the claim in progress with nobody holding its
    /// ticket, so every retry got `InProgress` until the lease ran out. A claim nobody received
    /// cannot have started a side effect: it is withdrawn, and the next claim acquires the key
    /// afresh, without a takeover.
    fn a_claim_future_dropped_before_it_returns_does_not_hold_the_key(b: Backend) {
        let store = b.store();
        let fp = Fingerprint::of(b"req");
        for i in 0..20 {
            let key = format!("dropped-{i}");
            drop(poll_once(store.claim_async(&scope(), &key, fp)));
            // Freed at once on the file; within a round trip on PostgreSQL.
            assert!(store.wait(&scope(), &key, FREED_WITHIN).unwrap());
            match store.claim(&scope(), &key, fp).unwrap() {
                Claim::Acquired(ticket) => {
                    assert!(ticket.takeover().is_none(), "nothing to reconcile");
                    store.complete(ticket, Response::new(201, "ok")).unwrap();
                }
                other => panic!("{key}: the key is free again, got {other:?}"),
            }
        }
        // One more, left withdrawn when the store closes: its release still lands.
        drop(poll_once(store.claim_async(&scope(), "last", fp)));
        assert!(store.wait(&scope(), "last", FREED_WITHIN).unwrap());
        let stats = store.stats();
        assert_eq!(stats.withdrawn, 21);
        assert_eq!(
            stats.acquired, 20,
            "a withdrawn claim was never acquired by anyone"
        );
        drop(store);
        let store = b.store();
        let mut orphans = 0;
        store
            .reap(|_| {
                orphans += 1;
                idemdb::Resolution::Keep
            })
            .unwrap();
        assert_eq!(orphans, 0, "no withdrawn claim survives as an orphan");
        assert!(matches!(
            store.claim(&scope(), "last", fp).unwrap(),
            Claim::Acquired(_)
        ));
        assert!(matches!(
            store.claim(&scope(), "dropped-3", fp).unwrap(),
            Claim::Replay(_)
        ));
    }
}

on_every_engine! {
    /// Regression: on PostgreSQL, the operation a caller made right after dropping a
    /// `claim_async` future could run in the same batch as the dropped claim, pipelined before
    /// the claim's withdrawal, and see the key still held (a read: in progress; a claim:
    /// `InProgress`), although a claim nobody received never holds its key. Jobs queued after
    /// the dropped claim's barrier now wait for the batch before it to end.
    fn the_next_operation_after_a_dropped_claim_future_sees_it_withdrawn(b: Backend) {
        let store = b.store();
        let fp = Fingerprint::of(b"req");
        for i in 0..40 {
            let key = format!("next-{i}");
            drop(poll_once(store.claim_async(&scope(), &key, fp)));
            if i % 2 == 0 {
                let entry = store.get(&scope(), &key).unwrap();
                assert!(entry.is_none(), "{key}: a withdrawn claim is still there: {entry:?}");
            } else {
                match store.claim(&scope(), &key, fp).unwrap() {
                    Claim::Acquired(ticket) => assert!(ticket.takeover().is_none()),
                    other => panic!("{key}: the next claim must acquire the key, got {other:?}"),
                }
            }
        }
    }
}

on_every_engine! {
    /// A takeover nobody received is not released (the attempt it replaced may have acted): its
    /// lease ends at once, so the next claim takes the key over again and is told to reconcile.
    fn a_dropped_takeover_future_leaves_the_key_to_the_next_takeover(b: Backend) {
        let clock = idemdb::ManualClock::new();
        let store = b.open(
            Store::builder()
                .lease(std::time::Duration::from_secs(60))
                .clock(clock.clone()),
        );
        let fp = Fingerprint::of(b"req");
        let Claim::Acquired(first) = store.claim(&scope(), "k", fp).unwrap() else {
            panic!("a new key is acquired")
        };
        let first_fence = first.fence();
        std::mem::forget(first); // a holder that vanished without a trace
        clock.advance(std::time::Duration::from_secs(61));
        drop(poll_once(store.claim_async(&scope(), "k", fp)));
        assert!(store.wait(&scope(), "k", FREED_WITHIN).unwrap());
        assert_eq!(store.stats().withdrawn, 1);
        match store.claim(&scope(), "k", fp).unwrap() {
            Claim::Acquired(ticket) => {
                let takeover = ticket.takeover().expect("still a takeover");
                assert!(takeover.previous_fence > first_fence);
            }
            other => panic!("the stale key is taken over again, got {other:?}"),
        }
    }
}

on_every_engine! {
    /// Regression (PostgreSQL): duplicates of one key queued together were taken one per
    /// statement (a statement changes a row once), and past 64 of them the batch gave up with
    /// an error. A retry storm on one key is answered whole: one claim acquires, every
    /// duplicate hears it is in progress, nobody gets an error.
    fn a_retry_storm_of_hundreds_of_duplicates_on_one_key_is_answered_whole(b: Backend) {
        let store = b.store();
        let scope = scope();
        let fp = Fingerprint::of(b"req");
        let (outcomes, _) = run_all((0..300).map(|_| store.claim_async(&scope, "hot", fp)).collect());
        let mut acquired = 0;
        for outcome in outcomes {
            match outcome.unwrap() {
                Claim::Acquired(_) => acquired += 1,
                Claim::InProgress { lease_remaining, .. } => assert!(!lease_remaining.is_zero()),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(acquired, 1);
    }
}
