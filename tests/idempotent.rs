//! Idempotent functions (`IdempotentFn`): a closure runs at most once per key, whatever the
//! threads, tasks, failures, panics and restarts around it, and every later call gets what it
//! returned.

#[macro_use]
mod engines;

use engines::Backend;
use idemdb::{
    CallOutcome, EntryState, Error, Failure, IdempotentFn, ManualClock, Scope, Store, Takeover,
};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

const LEASE: Duration = Duration::from_secs(60);

fn scope() -> Scope {
    Scope::new("ledger", "credit")
}

/// A function on a store whose clock the test moves, with a 60 s lease.
fn with_manual_clock(b: &Backend) -> (ManualClock, IdempotentFn) {
    let clock = ManualClock::new();
    let store = b.open(Store::builder().clock(clock.clone()).lease(LEASE));
    (clock, IdempotentFn::new(store, scope()))
}

fn executed(body: &[u8]) -> CallOutcome<Vec<u8>, Vec<u8>> {
    CallOutcome::Executed {
        result: Ok(body.to_vec()),
        takeover: None,
    }
}

fn replayed(result: Result<&[u8], &[u8]>) -> CallOutcome<Vec<u8>, Vec<u8>> {
    CallOutcome::Replayed {
        result: result.map(<[u8]>::to_vec).map_err(<[u8]>::to_vec),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_time()
        .build()
        .unwrap()
}

/// Whether the key's record is a claim in progress whose holder is gone (`Some(true)`), one
/// still held (`Some(false)`), or not in progress at all (`None`).
fn orphaned(f: &IdempotentFn, key: &str) -> Option<bool> {
    match f.store().get(f.scope(), key).unwrap()?.state {
        EntryState::InProgress { orphan, .. } => Some(orphan),
        EntryState::Completed { .. } => None,
    }
}

on_every_engine! {
    fn threads_racing_one_key_run_the_closure_once_and_all_get_its_result(b: Backend) {
        for wait in [Duration::ZERO, Duration::from_secs(10)] {
            let f = IdempotentFn::builder(b.store(), scope())
                .wait_for_in_flight(wait)
                .build();
            let key = format!("evt-{}", wait.as_secs());
            let runs = AtomicU32::new(0);
            let threads = 8;
            let barrier = Barrier::new(threads);
            let outcomes: Vec<_> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..threads)
                    .map(|i| {
                        let (f, key, runs, barrier) = (&f, &key, &runs, &barrier);
                        s.spawn(move || {
                            barrier.wait();
                            f.call(key, b"+50", |_| {
                                runs.fetch_add(1, Ordering::SeqCst);
                                std::thread::sleep(Duration::from_millis(50));
                                Ok(format!("credited by {i}").into_bytes())
                            })
                            .unwrap()
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert_eq!(runs.load(Ordering::SeqCst), 1, "wait {wait:?}: {outcomes:?}");
            let executed: Vec<_> = outcomes
                .iter()
                .filter_map(|o| match o {
                    CallOutcome::Executed { result, .. } => Some(result.clone()),
                    _ => None,
                })
                .collect();
            assert_eq!(executed.len(), 1, "{outcomes:?}");
            for o in &outcomes {
                match o {
                    CallOutcome::Executed { .. } => {}
                    CallOutcome::Replayed { result } => assert_eq!(result, &executed[0]),
                    CallOutcome::InProgress { .. } => assert!(wait.is_zero(), "waited: {o:?}"),
                    other => panic!("{other:?}"),
                }
            }
        }
    }
}

on_every_engine! {
    fn a_transient_failure_releases_the_key_and_the_next_call_runs(b: Backend) {
        let f = IdempotentFn::new(b.store(), scope());
        let out = f
            .call("evt-1", b"+50", |_| Err(Failure::Transient(b"bank: 503".to_vec())))
            .unwrap();
        assert_eq!(out, CallOutcome::Released { error: b"bank: 503".to_vec() });
        assert!(f.store().get(f.scope(), "evt-1").unwrap().is_none(), "released");
        assert_eq!(f.call("evt-1", b"+50", |_| Ok(b"ok".to_vec())).unwrap(), executed(b"ok"));
        assert_eq!(
            f.call("evt-1", b"+50", |_| panic!("ran twice")).unwrap(),
            replayed(Ok(b"ok"))
        );
    }
}

on_every_engine! {
    fn a_deterministic_failure_is_stored_and_replayed_as_that_error(b: Backend) {
        let f = IdempotentFn::new(b.store(), scope());
        let runs = AtomicU32::new(0);
        let fail = |_: &idemdb::Attempt| {
            runs.fetch_add(1, Ordering::SeqCst);
            Err(Failure::Deterministic(b"account closed".to_vec()))
        };
        assert_eq!(
            f.call("evt-2", b"+50", fail).unwrap(),
            CallOutcome::Executed { result: Err(b"account closed".to_vec()), takeover: None }
        );
        for _ in 0..3 {
            assert_eq!(f.call("evt-2", b"+50", fail).unwrap(), replayed(Err(b"account closed")));
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}

on_every_engine! {
    fn an_ambiguous_failure_stays_in_progress_then_is_taken_over_after_the_lease(b: Backend) {
        let (clock, f) = with_manual_clock(&b);
        let mut first_fence = 0;
        let out = f
            .call("evt-3", b"+50", |attempt| {
                first_fence = attempt.fence();
                Err(Failure::Ambiguous(b"bank: timeout after send".to_vec()))
            })
            .unwrap();
        assert_eq!(out, CallOutcome::Unresolved { error: b"bank: timeout after send".to_vec() });
        assert_eq!(orphaned(&f, "evt-3"), Some(true), "left in progress, its holder gone");
        // Within the lease nothing runs: the effect may have happened.
        assert!(matches!(
            f.call("evt-3", b"+50", |_| panic!("ran within the lease")).unwrap(),
            CallOutcome::InProgress { .. }
        ));
        clock.advance(LEASE + Duration::from_secs(1));
        let mut seen: Option<Takeover> = None;
        let out = f
            .call("evt-3", b"+50", |attempt| {
                seen = attempt.takeover().cloned();
                assert!(attempt.fence() > first_fence, "a takeover's fence is larger");
                Ok(b"reconciled: credit found, not repeated".to_vec())
            })
            .unwrap();
        let seen = seen.expect("the closure sees the takeover");
        assert_eq!(seen.previous_fence, first_fence);
        assert!(seen.orphan);
        assert_eq!(
            out,
            CallOutcome::Executed {
                result: Ok(b"reconciled: credit found, not repeated".to_vec()),
                takeover: Some(seen),
            }
        );
    }
}

on_every_engine! {
    fn a_reused_key_with_another_input_is_a_mismatch(b: Backend) {
        let f = IdempotentFn::new(b.store(), scope());
        // In progress with another input.
        let _ = f.call("evt-4", b"+50", |_| Err(Failure::Ambiguous(vec![]))).unwrap();
        assert_eq!(
            f.call("evt-4", b"+70", |_| panic!("must not run")).unwrap(),
            CallOutcome::Mismatch { completed: false }
        );
        // Completed with another input.
        f.call("evt-5", b"+50", |_| Ok(b"ok".to_vec())).unwrap().into_result().unwrap().unwrap();
        assert_eq!(
            f.call("evt-5", b"+70", |_| panic!("must not run")).unwrap(),
            CallOutcome::Mismatch { completed: true }
        );
        assert_eq!(f.call("evt-5", b"+50", |_| panic!("must not run")).unwrap(), replayed(Ok(b"ok")));
    }
}

on_every_engine! {
    fn a_panic_releases_the_key_and_resumes_in_the_caller(b: Backend) {
        let f = IdempotentFn::new(b.store(), scope());
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            f.call("evt-6", b"+50", |_| panic!("bug in the closure"))
        }))
        .expect_err("the panic resumes in the caller");
        assert_eq!(panicked.downcast_ref::<&str>(), Some(&"bug in the closure"));
        assert!(f.store().get(f.scope(), "evt-6").unwrap().is_none(), "released");
        assert_eq!(f.call("evt-6", b"+50", |_| Ok(b"ok".to_vec())).unwrap(), executed(b"ok"));
    }
}

on_every_engine! {
    fn a_slow_closure_extends_its_lease_and_is_not_taken_over(b: Backend) {
        let (clock, f) = with_manual_clock(&b);
        let out = f
            .call("evt-7", b"", |attempt| {
                for _ in 0..3 {
                    attempt.extend_lease(LEASE).unwrap();
                    clock.advance(Duration::from_secs(45));
                    // 135 s after the claim, past its first lease: a duplicate still waits.
                    let dup = std::thread::scope(|s| {
                        s.spawn(|| f.call("evt-7", b"", |_| panic!("taken over"))).join().unwrap()
                    });
                    assert!(matches!(dup.unwrap(), CallOutcome::InProgress { .. }));
                }
                Ok(b"slow but once".to_vec())
            })
            .unwrap();
        assert_eq!(out, executed(b"slow but once"));
    }
}

on_every_engine! {
    fn results_are_replayed_after_the_store_is_reopened(b: Backend) {
        {
            let f = IdempotentFn::new(b.store(), scope());
            assert_eq!(f.call("evt-8", b"+50", |_| Ok(b"credited".to_vec())).unwrap(), executed(b"credited"));
            let failed = f.call("evt-9", b"+50", |_| Err(Failure::Deterministic(b"closed".to_vec())));
            assert!(matches!(failed.unwrap(), CallOutcome::Executed { result: Err(_), .. }));
        }
        // The process restarts on the same store.
        let f = IdempotentFn::new(b.store(), scope());
        assert_eq!(f.call("evt-8", b"+50", |_| panic!("ran after restart")).unwrap(), replayed(Ok(b"credited")));
        assert_eq!(f.call("evt-9", b"+50", |_| panic!("ran after restart")).unwrap(), replayed(Err(b"closed")));
    }
}

on_every_engine! {
    fn invalid_keys_are_refused_before_anything_runs(b: Backend) {
        let f = IdempotentFn::new(b.store(), scope());
        let err = f.call("has space", b"", |_| panic!("must not run")).unwrap_err();
        assert!(matches!(err, Error::InvalidKey { .. }), "{err}");
    }
}

// Async.

on_every_engine! {
    fn tasks_racing_one_key_run_the_async_closure_once(b: Backend) {
        let f = Arc::new(
            IdempotentFn::builder(b.store(), scope())
                .wait_for_in_flight(Duration::from_secs(10))
                .build(),
        );
        let runs = Arc::new(AtomicU32::new(0));
        let outcomes = runtime().block_on(async {
            let tasks: Vec<_> = (0..8)
                .map(|_| {
                    let (f, runs) = (f.clone(), runs.clone());
                    tokio::spawn(async move {
                        f.call_async("evt-10", b"+50", |_| async move {
                            runs.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            Ok(b"credited".to_vec())
                        })
                        .await
                        .unwrap()
                    })
                })
                .collect();
            let mut outcomes = Vec::new();
            for t in tasks {
                outcomes.push(t.await.unwrap());
            }
            outcomes
        });
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{outcomes:?}");
        for o in outcomes {
            assert_eq!(o.into_result(), Some(Ok(b"credited".to_vec())));
        }
    }
}

on_every_engine! {
    fn a_dropped_async_call_leaves_its_claim_to_a_takeover_not_a_release(b: Backend) {
        let (clock, f) = with_manual_clock(&b);
        let rt = runtime();
        let started = Arc::new(AtomicU32::new(0));
        let call = f.call_async("evt-11", b"+50", |_| {
            let started = started.clone();
            async move {
                started.fetch_add(1, Ordering::SeqCst);
                // The side effect is under way when the caller gives up.
                std::future::pending::<Result<Vec<u8>, Failure<Vec<u8>>>>().await
            }
        });
        let timed_out =
            rt.block_on(async { tokio::time::timeout(Duration::from_millis(200), call).await });
        assert!(timed_out.is_err(), "the future was dropped mid-closure");
        assert_eq!(started.load(Ordering::SeqCst), 1);
        assert_eq!(orphaned(&f, "evt-11"), Some(true), "not released: an orphan");
        let dup = rt.block_on(f.call_async("evt-11", b"+50", |_| async { panic!("ran twice") }));
        assert!(matches!(dup.unwrap(), CallOutcome::InProgress { .. }));
        clock.advance(LEASE + Duration::from_secs(1));
        let out = rt
            .block_on(f.call_async("evt-11", b"+50", |attempt| async move {
                assert!(attempt.takeover().is_some_and(|t| t.orphan));
                Ok(b"reconciled".to_vec())
            }))
            .unwrap();
        assert!(matches!(
            out,
            CallOutcome::Executed { result: Ok(_), takeover: Some(Takeover { orphan: true, .. }) }
        ));
    }
}

on_every_engine! {
    fn an_async_panic_releases_the_key_and_resumes(b: Backend) {
        let f = IdempotentFn::new(b.store(), scope());
        let rt = runtime();
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            rt.block_on(f.call_async("evt-12", b"", |_| async {
                tokio::task::yield_now().await;
                panic!("bug in the future")
            }))
        }));
        assert!(panicked.is_err());
        assert!(f.store().get(f.scope(), "evt-12").unwrap().is_none(), "released");
        let out = rt.block_on(f.call_async("evt-12", b"", |_| async { Ok(b"ok".to_vec()) }));
        assert_eq!(out.unwrap(), executed(b"ok"));
    }
}

on_every_engine! {
    fn an_async_ambiguous_failure_stays_in_progress_and_a_transient_one_releases(b: Backend) {
        let f = IdempotentFn::new(b.store(), scope());
        let rt = runtime();
        let out = rt.block_on(f.call_async("evt-18", b"", |_| async {
            Err(Failure::Ambiguous(b"timeout after send".to_vec()))
        }));
        assert_eq!(out.unwrap(), CallOutcome::Unresolved { error: b"timeout after send".to_vec() });
        assert_eq!(orphaned(&f, "evt-18"), Some(true), "left in progress, its holder gone");
        let out = rt.block_on(f.call_async("evt-19", b"", |_| async {
            Err(Failure::Transient(b"503".to_vec()))
        }));
        assert_eq!(out.unwrap(), CallOutcome::Released { error: b"503".to_vec() });
        assert!(f.store().get(f.scope(), "evt-19").unwrap().is_none(), "released");
    }
}

on_every_engine! {
    fn an_attempt_moved_out_of_the_closure_stops_renewing_once_it_returned(b: Backend) {
        let f = IdempotentFn::new(b.store(), scope());
        let kept = Mutex::new(None);
        let rt = runtime();
        let out = rt.block_on(f.call_async("evt-13", b"", |attempt| {
            let kept = &kept;
            async move {
                attempt.extend_lease_async(LEASE).await.unwrap();
                *kept.lock().unwrap() = Some(attempt);
                Ok(b"ok".to_vec())
            }
        }));
        assert_eq!(out.unwrap(), executed(b"ok"));
        let attempt = kept.lock().unwrap().take().unwrap();
        let err = attempt.extend_lease(LEASE).unwrap_err();
        assert!(matches!(err, Error::LeaseLost { fence } if fence == attempt.fence()), "{err}");
    }
}

// Serde.

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Credit {
    account: String,
    cents: u64,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Receipt {
    id: String,
    balance_cents: i64,
    lines: Vec<(String, u64)>,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
enum Refused {
    AccountClosed { account: String },
    Limit(u64),
}

on_every_engine! {
    fn a_struct_result_round_trips_through_serde_across_a_restart(b: Backend) {
        let credit = Credit { account: "acct-1".into(), cents: 5000 };
        let receipt = Receipt {
            id: "rcpt-1".into(),
            balance_cents: -12,
            lines: vec![("credit \"quoted\" ü".into(), 5000)],
        };
        {
            let f = IdempotentFn::new(b.store(), scope());
            let out = f.call_json("evt-14", &credit, |_| Ok::<_, Failure<Refused>>(receipt.clone())).unwrap();
            assert_eq!(out, CallOutcome::Executed { result: Ok(receipt.clone()), takeover: None });
            let out = f
                .call_json("evt-15", &credit, |_| {
                    Err::<Receipt, _>(Failure::Deterministic(Refused::AccountClosed { account: "acct-1".into() }))
                })
                .unwrap();
            assert!(matches!(out, CallOutcome::Executed { result: Err(_), .. }));
        }
        let f = IdempotentFn::new(b.store(), scope());
        let never = |_: &idemdb::Attempt| -> Result<Receipt, Failure<Refused>> { panic!("ran twice") };
        assert_eq!(f.call_json("evt-14", &credit, never).unwrap(), CallOutcome::Replayed { result: Ok(receipt) });
        assert_eq!(
            f.call_json("evt-15", &credit, never).unwrap(),
            CallOutcome::Replayed { result: Err(Refused::AccountClosed { account: "acct-1".into() }) }
        );
        let other = Credit { cents: 7000, ..credit };
        assert_eq!(f.call_json("evt-14", &other, never).unwrap(), CallOutcome::Mismatch { completed: true });
    }
}

on_every_engine! {
    fn async_serde_calls_replay_what_sync_ones_stored(b: Backend) {
        let f = IdempotentFn::new(b.store(), scope());
        let first = f.call_json("evt-16", &("acct-2", 10), |_| Ok::<_, Failure<Refused>>(vec![1u64, 2, 3])).unwrap();
        let again = runtime()
            .block_on(f.call_json_async("evt-16", &("acct-2", 10), |_| async {
                Err::<Vec<u64>, _>(Failure::Transient(Refused::Limit(1)))
            }))
            .unwrap();
        assert_eq!(again, CallOutcome::Replayed { result: first.into_result().unwrap() });
    }
}

on_every_engine! {
    fn a_stored_result_that_no_longer_decodes_is_a_typed_error(b: Backend) {
        let f = IdempotentFn::new(b.store(), scope());
        let stored = f.call_json("evt-17", &1, |_| Ok::<u64, Failure<String>>(5)).unwrap();
        assert_eq!(stored.into_result(), Some(Ok(5)));
        let err = f
            .call_json("evt-17", &1, |_| -> Result<Receipt, Failure<String>> { panic!("ran twice") })
            .unwrap_err();
        assert!(matches!(err, Error::ResultEncoding { what: "stored result", .. }), "{err}");
        assert!(std::error::Error::source(&err).is_some());
    }
}
