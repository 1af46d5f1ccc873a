//! `Store::wait` and `Store::wait_async`: a waiter wakes when the claim holding its key ends
//! (completion made durable, release, reap, withdrawal, lease end by the store's clock), not
//! at a polling interval, and never later than its timeout.
//!
//! Each wake-up is checked against a timeout far longer than the test allows (30 s against a
//! bound of a few seconds), so a waiter that only returned at its timeout fails the test.

#[macro_use]
mod engines;

use idemdb::simulation::SimDisk;
use idemdb::{Claim, Error, Fingerprint, ManualClock, Resolution, Response, Scope, StalePolicy};
use idemdb::{Store, Ticket};
use std::future::Future;
use std::sync::mpsc;
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::{Duration, Instant};

const LONG: Duration = Duration::from_secs(30);
/// What "at once" may take on a loaded shared machine.
const PROMPT: Duration = Duration::from_secs(3);

fn scope() -> Scope {
    Scope::new("tenant", "POST /v1/payments")
}

fn fp() -> Fingerprint {
    Fingerprint::of(b"request")
}

fn acquire(store: &Store, key: &str) -> Ticket {
    match store.claim(&scope(), key, fp()).unwrap() {
        Claim::Acquired(t) => t,
        other => panic!("{key} is new: {other:?}"),
    }
}

/// Runs `wait` for `key` on another thread; returns a receiver of (answer, time taken).
fn waiter(store: &Store, key: &str, timeout: Duration) -> mpsc::Receiver<(bool, Duration)> {
    let (tx, rx) = mpsc::channel();
    let (store, key) = (store.clone(), key.to_owned());
    thread::spawn(move || {
        let started = Instant::now();
        let answer = store.wait(&scope(), &key, timeout).unwrap();
        tx.send((answer, started.elapsed())).unwrap();
    });
    rx
}

/// Asserts the waiter is still waiting (it has not answered within 100 ms).
fn still_waiting(rx: &mpsc::Receiver<(bool, Duration)>) {
    assert!(
        rx.recv_timeout(Duration::from_millis(100)).is_err(),
        "the waiter must wait while the claim holds the key"
    );
}

fn woke(rx: &mpsc::Receiver<(bool, Duration)>) {
    let (answer, _) = rx.recv_timeout(PROMPT).expect("woken promptly");
    assert!(answer, "the claim ended");
}

on_every_engine! {
    fn a_key_nobody_holds_returns_at_once(b: Backend) {
        let store = b.store();
        assert!(store.wait(&scope(), "absent", LONG).unwrap());
        let t = acquire(&store, "done");
        store.complete(t, Response::new(200, "ok")).unwrap();
        assert!(store.wait(&scope(), "done", LONG).unwrap());
    }
}

on_every_engine! {
    fn a_waiter_wakes_when_the_holder_completes_and_the_retry_replays(b: Backend) {
        let store = b.store();
        let t = acquire(&store, "k");
        let rx = waiter(&store, "k", LONG);
        still_waiting(&rx);
        store.complete(t, Response::new(201, "paid")).unwrap();
        woke(&rx);
        assert!(matches!(
            store.claim(&scope(), "k", fp()).unwrap(),
            Claim::Replay(_)
        ));
    }
}

on_every_engine! {
    fn a_waiter_wakes_when_the_holder_releases(b: Backend) {
        let store = b.store();
        let t = acquire(&store, "k");
        let rx = waiter(&store, "k", LONG);
        still_waiting(&rx);
        store.release(t).unwrap();
        woke(&rx);
    }
}

on_every_engine! {
    fn a_waiter_gives_up_at_its_timeout(b: Backend) {
        let store = b.store();
        let _t = acquire(&store, "k");
        let started = Instant::now();
        assert!(!store
            .wait(&scope(), "k", Duration::from_millis(150))
            .unwrap());
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(150), "{took:?}");
        assert!(took < PROMPT, "{took:?}");
    }
}

on_every_engine! {
    /// The lease's end is read from the store's clock: a test that moves a `ManualClock` past it
    /// wakes the waiter, which finds the claim stale (taken over by the next claim).
    fn a_waiter_wakes_when_a_manual_clock_moves_past_the_lease(b: Backend) {
        let clock = ManualClock::new();
        let store = b.open(Store::builder()
            .lease(Duration::from_secs(60))
            .clock(clock.clone()));
        let _t = acquire(&store, "k");
        let rx = waiter(&store, "k", LONG);
        still_waiting(&rx);
        clock.advance(Duration::from_secs(30));
        still_waiting(&rx);
        clock.advance(Duration::from_secs(31));
        woke(&rx);
        match store.claim(&scope(), "k", fp()).unwrap() {
            Claim::Acquired(t) => assert!(t.takeover().is_some()),
            other => panic!("stale: taken over, got {other:?}"),
        }
    }
}

on_every_engine! {
    /// With the real clock, a waiter sleeps until the lease's end and no longer.
    fn a_waiter_wakes_at_the_lease_end_on_the_system_clock(b: Backend) {
        let store = b.open(Store::builder()
            .lease(Duration::from_millis(300)));
        let _t = acquire(&store, "k");
        let rx = waiter(&store, "k", LONG);
        let (answer, took) = rx.recv_timeout(PROMPT).expect("woken at the lease end");
        assert!(answer);
        assert!(took >= Duration::from_millis(250), "{took:?}");
    }
}

on_every_engine! {
    /// Under `StalePolicy::Keep` a stale claim holds the key until it is reaped: the waiter
    /// sleeps through the lease's end and wakes at the reap.
    fn under_keep_a_waiter_wakes_at_the_reap_not_at_the_lease_end(b: Backend) {
        let clock = ManualClock::new();
        let store = b.open(Store::builder()
            .lease(Duration::from_secs(60))
            .stale_policy(StalePolicy::Keep)
            .clock(clock.clone()));
        let _t = acquire(&store, "k");
        let rx = waiter(&store, "k", LONG);
        clock.advance(Duration::from_secs(61));
        still_waiting(&rx);
        assert_eq!(store.reap(|_| Resolution::Release).unwrap(), 1);
        woke(&rx);
    }
}

/// A store that halts (a failed fsync) wakes its waiters with the error.
#[test]
fn a_halting_store_wakes_its_waiters_with_the_error() {
    let disk = SimDisk::new();
    let store = Store::builder().open_simulated(&disk).unwrap();
    let t = acquire(&store, "k");
    let (tx, rx) = mpsc::channel();
    {
        let store = store.clone();
        thread::spawn(move || tx.send(store.wait(&scope(), "k", LONG)).unwrap());
    }
    thread::sleep(Duration::from_millis(100));
    disk.fail_sync_after(0, true);
    assert!(store.complete(t, Response::new(200, "ok")).is_err());
    let answer = rx.recv_timeout(PROMPT).expect("woken by the halt");
    assert!(matches!(answer, Err(Error::Halted { .. })), "{answer:?}");
}

on_every_engine! {
    fn many_waiters_on_many_keys_each_wake_for_their_own_key(b: Backend) {
        let store = b.store();
        let tickets: Vec<Ticket> = (0..8).map(|i| acquire(&store, &format!("k{i}"))).collect();
        let waiters: Vec<_> = (0..8)
            .flat_map(|i| (0..3).map(move |_| i))
            .map(|i| (i, waiter(&store, &format!("k{i}"), LONG)))
            .collect();
        let mut tickets: Vec<Option<Ticket>> = tickets.into_iter().map(Some).collect();
        for i in [3, 0, 7, 1, 6, 2, 5, 4] {
            for (_, rx) in waiters.iter().filter(|(k, _)| *k == i) {
                still_waiting(rx);
            }
            let t = tickets[i].take().unwrap();
            store
                .complete(t, Response::new(200, format!("{i}")))
                .unwrap();
            for (_, rx) in waiters.iter().filter(|(k, _)| *k == i) {
                woke(rx);
            }
        }
    }
}

on_every_engine! {
    /// The async form: woken by the completion itself; the polling thread never blocks.
    fn wait_async_is_woken_by_the_completion(b: Backend) {
        let store = b.store();
        let t = acquire(&store, "k");
        let mut future = Box::pin(store.wait_async(&scope(), "k", LONG));
        let (wake, woken) = mpsc::channel::<()>();
        let waker = Waker::from(std::sync::Arc::new(Signal(std::sync::Mutex::new(wake))));
        let mut cx = Context::from_waker(&waker);
        assert!(future.as_mut().poll(&mut cx).is_pending());
        let completer = {
            let store = store.clone();
            thread::spawn(move || store.complete(t, Response::new(201, "paid")).unwrap())
        };
        woken
            .recv_timeout(PROMPT)
            .expect("the completion wakes the future");
        let mut answer = future.as_mut().poll(&mut cx);
        // The wake may come from the timer or the clock first; poll until answered.
        let started = Instant::now();
        while answer.is_pending() && started.elapsed() < PROMPT {
            let _ = woken.recv_timeout(Duration::from_millis(50));
            answer = future.as_mut().poll(&mut cx);
        }
        assert!(matches!(answer, Poll::Ready(Ok(true))), "{answer:?}");
        completer.join().unwrap();
    }
}

on_every_engine! {
    fn wait_async_times_out(b: Backend) {
        let store = b.store();
        let _t = acquire(&store, "k");
        let started = Instant::now();
        let answer = block_on(store.wait_async(&scope(), "k", Duration::from_millis(120)));
        assert!(!answer.unwrap());
        assert!(started.elapsed() >= Duration::from_millis(120));
    }
}

on_every_engine! {
    fn wait_checks_its_input(b: Backend) {
        let store = b.store();
        assert!(matches!(
            store.wait(&scope(), "", LONG),
            Err(Error::InvalidKey { .. })
        ));
    }
}

struct Signal(std::sync::Mutex<mpsc::Sender<()>>);

impl std::task::Wake for Signal {
    fn wake(self: std::sync::Arc<Self>) {
        let _ = self.0.lock().unwrap().send(());
    }
}

/// A minimal executor: parks the thread between polls.
fn block_on<F: Future>(future: F) -> F::Output {
    struct Unpark(thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(std::sync::Arc::new(Unpark(thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = Box::pin(future);
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        thread::park();
    }
}
