//! The agent tool-call gateway: one side effect per logical tool call, whatever the model, the
//! network or the process does.

#[macro_use]
mod engines;

use engines::Backend;
use idemdb::agent::{ArgumentPolicy, Gateway, Outcome, ToolCallKey};
use idemdb::{Attempt, Failure, ManualClock, Resolution, Store};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

/// A store whose clock the test moves, with a 60 s lease.
fn store_with_manual_clock(backend: &Backend) -> (ManualClock, Store) {
    let clock = ManualClock::new();
    let store = backend.open(
        Store::builder()
            .clock(clock.clone())
            .lease(Duration::from_secs(60)),
    );
    (clock, store)
}

fn ok(body: &str) -> Outcome {
    Outcome::Executed {
        result: Ok(body.as_bytes().to_vec()),
        takeover: None,
    }
}

on_every_engine! {
    fn a_retry_with_the_same_arguments_replays_without_running(b: Backend) {
        let gw = Gateway::new(b.store());
        let key = ToolCallKey::new("task-1", 4, "create_incident");
        let runs = AtomicU32::new(0);
        let tool = |_: &Attempt| {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(b"INC-1".to_vec())
        };
        assert_eq!(gw.call("agent", &key, b"{}", tool).unwrap(), ok("INC-1"));
        assert_eq!(
            gw.call("agent", &key, b"{}", tool).unwrap(),
            Outcome::Replayed {
                result: Ok(b"INC-1".to_vec()),
                arguments_changed: false
            }
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}

on_every_engine! {
    fn reworded_arguments_collapse_and_say_so(b: Backend) {
        let gw = Gateway::new(b.store());
        let key = ToolCallKey::new("task-1", 4, "create_incident");
        let args: &[u8] = br#"{"title":"DB down"}"#;
        let first = gw
            .call("agent", &key, args, |_| Ok(b"INC-1".to_vec()))
            .unwrap();
        assert_eq!(first, ok("INC-1"));
        let retry = gw
            .call(
                "agent",
                &key,
                br#"{"title":"The database is down"}"#,
                |_| panic!("a reworded retry must not run the tool again"),
            )
            .unwrap();
        assert_eq!(
            retry,
            Outcome::Replayed {
                result: Ok(b"INC-1".to_vec()),
                arguments_changed: true
            }
        );
    }
}

on_every_engine! {
    fn strict_policy_refuses_changed_arguments(b: Backend) {
        let gw = Gateway::builder(b.store())
            .argument_policy(ArgumentPolicy::Strict)
            .build();
        let key = ToolCallKey::new("task-1", 1, "transfer");
        assert_eq!(
            gw.call("agent", &key, b"100", |_| Ok(b"done".to_vec()))
                .unwrap(),
            ok("done")
        );
        assert_eq!(
            gw.call("agent", &key, b"1000", |_| panic!("must not run"))
                .unwrap(),
            Outcome::Mismatch { completed: true }
        );
        assert!(matches!(
            gw.call("agent", &key, b"100", |_| panic!("must not run"))
                .unwrap(),
            Outcome::Replayed {
                arguments_changed: false,
                ..
            }
        ));
    }
}

on_every_engine! {
    fn transient_failures_release_and_deterministic_ones_are_replayed(b: Backend) {
        let gw = Gateway::new(b.store());
        let key = ToolCallKey::new("task-1", 2, "send_email");
        let out = gw
            .call("agent", &key, b"x", |_| {
                Err(Failure::Transient(b"tool server: 503".to_vec()))
            })
            .unwrap();
        assert_eq!(
            out,
            Outcome::Released {
                error: b"tool server: 503".to_vec()
            }
        );
        // Released: the next attempt runs the tool again, and this time it fails for good.
        let out = gw
            .call("agent", &key, b"x", |_| {
                Err(Failure::Deterministic(b"invalid recipient".to_vec()))
            })
            .unwrap();
        assert_eq!(
            out,
            Outcome::Executed {
                result: Err(b"invalid recipient".to_vec()),
                takeover: None
            }
        );
        let out = gw
            .call("agent", &key, b"x", |_| {
                panic!("a stored failure is replayed")
            })
            .unwrap();
        assert_eq!(
            out,
            Outcome::Replayed {
                result: Err(b"invalid recipient".to_vec()),
                arguments_changed: false
            }
        );
    }
}

on_every_engine! {
    fn concurrent_duplicates_run_the_tool_once(b: Backend) {
        for wait in [Duration::ZERO, Duration::from_secs(5)] {
            let gw = Gateway::builder(b.store())
                .wait_for_in_flight(wait)
                .build();
            // One task per round: both rounds share the store.
            let task = format!("task-9-{}", wait.as_secs());
            let key = ToolCallKey::new(&task, 1, "create_ticket");
            let runs = Arc::new(AtomicU32::new(0));
            let threads = 8;
            let barrier = Arc::new(Barrier::new(threads));
            let outcomes: Vec<Outcome> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..threads)
                    .map(|_| {
                        let (gw, key, runs, barrier) = (&gw, &key, runs.clone(), barrier.clone());
                        s.spawn(move || {
                            barrier.wait();
                            gw.call("agent", key, b"{}", |_| {
                                runs.fetch_add(1, Ordering::SeqCst);
                                std::thread::sleep(Duration::from_millis(50));
                                Ok(b"T-1".to_vec())
                            })
                            .unwrap()
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert_eq!(
                runs.load(Ordering::SeqCst),
                1,
                "wait {wait:?}: {outcomes:?}"
            );
            for o in &outcomes {
                match o {
                    Outcome::Executed { .. } => {}
                    Outcome::Replayed { result, .. } => {
                        assert!(!wait.is_zero() || result.is_ok());
                        assert_eq!(result.as_deref().unwrap(), b"T-1");
                    }
                    Outcome::InProgress { .. } => assert!(wait.is_zero(), "waited: {o:?}"),
                    other => panic!("{other:?}"),
                }
            }
            if !wait.is_zero() {
                assert!(
                    outcomes
                        .iter()
                        .all(|o| !matches!(o, Outcome::InProgress { .. })),
                    "in wait mode every duplicate gets the replay"
                );
            }
        }
    }
}

on_every_engine! {
    fn a_resumed_agent_replays_its_steps_across_a_restart(b: Backend) {
        let side_effects = AtomicU32::new(0);
        let run_steps = |gw: &Gateway| {
            (1..=3)
                .map(|step| {
                    let key = ToolCallKey::new("run-77", step, "create_incident");
                    gw.call("agent", &key, format!("step {step}").as_bytes(), |_| {
                        side_effects.fetch_add(1, Ordering::SeqCst);
                        Ok(format!("INC-{step}").into_bytes())
                    })
                    .unwrap()
                })
                .collect::<Vec<_>>()
        };
        let first = run_steps(&Gateway::new(b.store()));
        assert!(first
            .iter()
            .all(|o| matches!(o, Outcome::Executed { result: Ok(_), .. })));
        // The process restarts; the agent resumes from a checkpoint and replays steps 1..=3.
        let resumed = run_steps(&Gateway::new(b.store()));
        for (step, o) in resumed.iter().enumerate() {
            assert_eq!(
                o,
                &Outcome::Replayed {
                    result: Ok(format!("INC-{}", step + 1).into_bytes()),
                    arguments_changed: false
                }
            );
        }
        assert_eq!(side_effects.load(Ordering::SeqCst), 3);
    }
}

on_every_engine! {
    fn a_tool_that_died_mid_call_is_taken_over_with_a_reconcile_flag(b: Backend) {
        let (clock, store) = store_with_manual_clock(&b);
        let gw = Gateway::new(store);
        let key = ToolCallKey::new("task-3", 5, "charge");
        let died = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            gw.call("agent", &key, b"{}", |_| panic!("the tool process died"))
        }));
        assert!(died.is_err());
        // Within the lease, the call is in flight: nothing runs twice at once.
        assert!(matches!(
            gw.call("agent", &key, b"{}", |_| panic!("must not run"))
                .unwrap(),
            Outcome::InProgress { .. }
        ));
        clock.advance(Duration::from_secs(60));
        let out = gw
            .call("agent", &key, b"{}", |attempt| {
                let takeover = attempt.takeover().expect("the abandoned attempt is reported");
                assert!(takeover.previous_fence < attempt.fence());
                Ok(b"reconciled: charge found, not repeated".to_vec())
            })
            .unwrap();
        let Outcome::Executed {
            result: Ok(_),
            takeover: Some(takeover),
        } = out
        else {
            panic!("a takeover says so: {out:?}")
        };
        assert!(
            takeover.orphan,
            "its holder is gone: the ticket dropped as the tool panicked"
        );
    }
}

on_every_engine! {
    fn colliding_step_numbers_and_tools_of_two_tasks_stay_apart(b: Backend) {
        let gw = Gateway::new(b.store());
        let a = ToolCallKey::new("task-a", 1, "create_incident");
        let b = ToolCallKey::new("task-b", 1, "create_incident");
        assert_eq!(
            gw.call("agent", &a, b"{}", |_| Ok(b"A".to_vec())).unwrap(),
            ok("A")
        );
        assert_eq!(
            gw.call("agent", &b, b"{}", |_| Ok(b"B".to_vec())).unwrap(),
            ok("B")
        );
        // Separator games cannot make two tasks collide either.
        let c = ToolCallKey::new("task:1", 2, "x");
        let d = ToolCallKey::new("task", 1, "2:x");
        assert_ne!(c, d);
        assert_eq!(
            gw.call("agent", &c, b"{}", |_| Ok(b"C".to_vec())).unwrap(),
            ok("C")
        );
        assert_eq!(
            gw.call("agent", &d, b"{}", |_| Ok(b"D".to_vec())).unwrap(),
            ok("D")
        );
        // And one key under two tenants is two records.
        assert_eq!(
            gw.call("other-agent", &a, b"{}", |_| Ok(b"A2".to_vec()))
                .unwrap(),
            ok("A2")
        );
    }
}

on_every_engine! {
    fn an_oversize_result_releases_the_key(b: Backend) {
        let gw = Gateway::new(
            b.open(Store::builder()
                .max_response_bytes(1024)),
        );
        let key = ToolCallKey::new("t", 1, "dump");
        let err = gw
            .call("agent", &key, b"", |_| Ok(vec![0; 4096]))
            .unwrap_err();
        assert!(
            matches!(err, idemdb::Error::ResponseTooLarge { .. }),
            "{err}"
        );
        assert_eq!(
            gw.call("agent", &key, b"", |_| Ok(b"small".to_vec()))
                .unwrap(),
            ok("small")
        );
    }
}

on_every_engine! {
    fn an_ambiguous_failure_is_reconciled_not_repeated(b: Backend) {
        let (clock, store) = store_with_manual_clock(&b);
        let gw = Gateway::new(store);
        let key = ToolCallKey::new("task-5", 1, "create_incident");
        // The tool server timed out after the request was sent: the incident may exist.
        let out = gw
            .call("agent", &key, b"{}", |_| {
                Err(Failure::Ambiguous(b"timed out after sending".to_vec()))
            })
            .unwrap();
        assert!(matches!(out, Outcome::Unresolved { .. }), "{out:?}");
        assert!(matches!(
            gw.call("agent", &key, b"{}", |_| panic!(
                "must not run while unresolved"
            ))
            .unwrap(),
            Outcome::InProgress { .. }
        ));
        clock.advance(Duration::from_secs(60));
        let out = gw
            .call("agent", &key, b"{}", |attempt| {
                assert!(
                    attempt.takeover().is_some(),
                    "the next attempt is told to reconcile"
                );
                Ok(b"INC-1 (found, not recreated)".to_vec())
            })
            .unwrap();
        assert!(matches!(
            out,
            Outcome::Executed {
                result: Ok(_),
                takeover: Some(_)
            }
        ));
    }
}

on_every_engine! {
    fn a_slow_tool_extends_its_lease_and_is_not_taken_over(b: Backend) {
        let (clock, store) = store_with_manual_clock(&b);
        let gw = Gateway::new(store);
        let key = ToolCallKey::new("task-6", 1, "long_export");
        let out = gw
            .call("agent", &key, b"{}", |attempt| {
                for _ in 0..3 {
                    clock.advance(Duration::from_secs(50));
                    attempt.extend_lease(Duration::from_secs(60)).unwrap();
                    // A duplicate arriving now finds the call in flight, not stale.
                    assert!(matches!(
                        gw.call("agent", &key, b"{}", |_| panic!("must not run twice"))
                            .unwrap(),
                        Outcome::InProgress { .. }
                    ));
                }
                Ok(b"done".to_vec())
            })
            .unwrap();
        assert_eq!(out, ok("done"));
    }
}

on_every_engine! {
    /// `Gateway::reap` resolves abandoned calls: a call found executed replays as the tool's
    /// result (not as changed arguments, which the reaper cannot know), one found not executed is
    /// released and runs again, an undecided one stays in progress, and claims that are not tool
    /// calls (an HTTP endpoint in the same store) are never offered.
    fn reap_resolves_abandoned_calls_and_a_resolved_call_replays_as_the_tools_result(b: Backend) {
        let (clock, store) = store_with_manual_clock(&b);
        let gw = Gateway::new(store.clone());
        let ambiguous = |_: &Attempt| Err(Failure::Ambiguous(b"timeout".to_vec()));
        let done = ToolCallKey::new("task-9", 1, "create_incident");
        let not_done = ToolCallKey::new("task-9", 2, "send_email");
        let unknown = ToolCallKey::new("task-9", 3, "transfer");
        for key in [&done, &not_done, &unknown] {
            let out = gw.call("agent", key, br#"{"a":1}"#, ambiguous).unwrap();
            assert!(matches!(out, Outcome::Unresolved { .. }), "{out:?}");
        }
        // An HTTP claim in the same store, also abandoned: not the gateway's to resolve.
        let scope = idemdb::Scope::new("agent", "POST /v1/payments");
        let idemdb::Claim::Acquired(http) = store
            .claim(&scope, "pay-1", idemdb::Fingerprint::of(b"x"))
            .unwrap()
        else {
            panic!("new key")
        };
        drop(http);
        clock.advance(Duration::from_secs(61));
        let mut offered = Vec::new();
        let resolved = gw
            .reap(|call| {
                assert_eq!(call.scope.tenant(), "agent");
                offered.push(call.key.clone());
                if call.key == done.as_str() {
                    Resolution::Complete(Ok(b"INC-7".to_vec()))
                } else if call.key == not_done.as_str() {
                    Resolution::Release
                } else {
                    Resolution::Keep
                }
            })
            .unwrap();
        assert_eq!(resolved, 2);
        offered.sort();
        let mut expected = vec![
            done.as_str().to_owned(),
            not_done.as_str().to_owned(),
            unknown.as_str().to_owned(),
        ];
        expected.sort();
        assert_eq!(offered, expected, "only the gateway's calls are offered");
        // Reworded arguments on retry: still the tool's result, not flagged as changed.
        assert_eq!(
            gw.call("agent", &done, br#"{"a":2}"#, |_| panic!("must not run"))
                .unwrap(),
            Outcome::Replayed {
                result: Ok(b"INC-7".to_vec()),
                arguments_changed: false
            }
        );
        assert_eq!(
            gw.call("agent", &not_done, br#"{"a":1}"#, |attempt| {
                assert!(attempt.takeover().is_none(), "released: a clean run");
                Ok(b"sent".to_vec())
            })
            .unwrap(),
            ok("sent")
        );
        // Undecided: still abandoned; the next attempt takes it over and reconciles itself.
        assert!(matches!(
            gw.call("agent", &unknown, br#"{"a":1}"#, |attempt| {
                assert!(attempt.takeover().is_some());
                Ok(b"found".to_vec())
            })
            .unwrap(),
            Outcome::Executed {
                takeover: Some(_),
                ..
            }
        ));
        // The HTTP claim is untouched: still stale, taken over by its own next claim.
        match store
            .claim(&scope, "pay-1", idemdb::Fingerprint::of(b"x"))
            .unwrap()
        {
            idemdb::Claim::Acquired(t) => assert!(t.takeover().is_some()),
            other => panic!("{other:?}"),
        }
    }
}

on_every_engine! {
    /// A resolver that finds the tool failed for good (`Complete(Err(..))`) stores the failure:
    /// later attempts replay it as the tool's deterministic failure, and the tool does not run.
    fn a_call_reaped_as_failed_replays_the_failure(b: Backend) {
        let (clock, store) = store_with_manual_clock(&b);
        let gw = Gateway::new(store);
        let key = ToolCallKey::new("task-10", 1, "transfer");
        let out = gw
            .call("agent", &key, b"{}", |_| {
                Err(Failure::Ambiguous(b"timeout".to_vec()))
            })
            .unwrap();
        assert!(matches!(out, Outcome::Unresolved { .. }), "{out:?}");
        clock.advance(Duration::from_secs(61));
        let resolved = gw
            .reap(|_| Resolution::Complete(Err(b"account closed".to_vec())))
            .unwrap();
        assert_eq!(resolved, 1);
        assert_eq!(
            gw.call("agent", &key, b"{}", |_| panic!("must not run"))
                .unwrap(),
            Outcome::Replayed {
                result: Err(b"account closed".to_vec()),
                arguments_changed: false
            }
        );
    }
}

on_every_engine! {
    /// Under `StalePolicy::Keep` a call lost mid-way is never run again by the store: a retry
    /// is told at once that the earlier attempt was lost (`Orphaned`), without sitting out the
    /// duplicate wait for a holder that will never come back, before its lease ends and after
    /// it. (It waited the whole `wait_for_in_flight` and answered `InProgress` before.)
    fn a_call_abandoned_in_a_store_that_keeps_it_is_answered_orphaned_at_once(b: Backend) {
        let clock = ManualClock::new();
        let store = b.open(
            Store::builder()
                .clock(clock.clone())
                .lease(Duration::from_secs(60))
                .stale_policy(idemdb::StalePolicy::Keep),
        );
        let gw = Gateway::builder(store)
            .wait_for_in_flight(Duration::from_secs(30))
            .build();
        let key = ToolCallKey::new("task-11", 1, "create_incident");
        let out = gw
            .call("agent", &key, b"{}", |_| Err(Failure::Ambiguous(Vec::new())))
            .unwrap();
        assert!(matches!(out, Outcome::Unresolved { .. }), "{out:?}");
        for advance in [0, 61] {
            clock.advance(Duration::from_secs(advance));
            let started = std::time::Instant::now();
            let retry = gw
                .call("agent", &key, b"{}", |_| panic!("must not run"))
                .unwrap();
            assert_eq!(retry, Outcome::Orphaned, "{advance} s after");
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "answered without waiting for the in-flight bound"
            );
        }
        // A holder that is merely slow is not an orphan: its duplicate waits, then hears
        // it is in progress.
        let slow = ToolCallKey::new("task-11", 2, "create_incident");
        let gw_now = Gateway::new(gw.store().clone());
        let out = gw_now
            .call("agent", &slow, b"{}", |_| {
                let dup = gw_now
                    .call("agent", &slow, b"{}", |_| panic!("must not run"))
                    .unwrap();
                assert!(matches!(dup, Outcome::InProgress { .. }), "{dup:?}");
                Ok(b"done".to_vec())
            })
            .unwrap();
        assert_eq!(out, ok("done"));
    }
}

on_every_engine! {
    /// A tool that deduplicates by the key may be asked again after its call was lost:
    /// `release_lost` frees a lost claim (and only a lost one), and the next call runs.
    fn release_lost_frees_only_a_lost_call(b: Backend) {
        let store = b.open(Store::builder().stale_policy(idemdb::StalePolicy::Keep));
        let gw = Gateway::new(store);
        let key = ToolCallKey::new("task-12", 1, "charge");
        assert!(!gw.release_lost("agent", &key).unwrap(), "no record");
        let out = gw
            .call("agent", &key, b"{}", |attempt| {
                assert!(
                    !gw.release_lost("agent", &key).unwrap(),
                    "a live holder's claim is not lost"
                );
                let _ = attempt;
                Err(Failure::Ambiguous(Vec::new()))
            })
            .unwrap();
        assert!(matches!(out, Outcome::Unresolved { .. }), "{out:?}");
        assert!(gw.release_lost("agent", &key).unwrap());
        let runs = AtomicU32::new(0);
        let again = gw
            .call("agent", &key, b"{}", |_| {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok(b"ch_1".to_vec())
            })
            .unwrap();
        assert_eq!(again, ok("ch_1"));
        assert!(!gw.release_lost("agent", &key).unwrap(), "a completion is not lost");
        assert_eq!(
            gw.call("agent", &key, b"{}", |_| panic!("must not run")).unwrap(),
            Outcome::Replayed {
                result: Ok(b"ch_1".to_vec()),
                arguments_changed: false
            }
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}
