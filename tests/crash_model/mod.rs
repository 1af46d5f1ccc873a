//! A workload, and a reference model of what the store acknowledged, for crash testing. Shared
//! by `tests/crash.rs` (the power-loss sweep and the proptest) and the `crash_recovery` fuzz
//! target, which includes this file by path.
//!
//! The model is built from observations, not predictions: each acknowledged call records what
//! the disk must now hold for its key. A call that failed (the power went, a write failed) may
//! or may not have landed, so its keys accept either state. After a crash and reopen, [`Model::
//! check`] compares every key with what is allowed.

#![allow(dead_code)]
// Test arithmetic on small counts and millisecond times; the lint guards the on-disk format.
#![allow(clippy::cast_possible_truncation)]

use idemdb::simulation::{CrashImage, SimDisk, SplitMix64};
use idemdb::{
    Claim, EntryState, Error, Fingerprint, ManualClock, Resolution, Response, Scope, Store, Ticket,
};
use std::collections::BTreeMap;
use std::future::Future;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub(crate) const LEASE: Duration = Duration::from_secs(60);
pub(crate) const TTL: Duration = Duration::from_secs(600);
pub(crate) const TENANTS: [&str; 3] = ["acme", "globex", "initech"];
pub(crate) const ENDPOINTS: [&str; 2] = ["POST /v1/payments", "POST /v1/refunds"];
pub(crate) const KEYS: usize = 6;

/// One (tenant, endpoint, key).
pub(crate) type Id = (usize, usize, usize);

pub(crate) fn scope(id: Id) -> Scope {
    Scope::new(TENANTS[id.0], ENDPOINTS[id.1])
}

pub(crate) fn key(id: Id) -> String {
    format!("key-{}", id.2)
}

pub(crate) fn fingerprint(variant: bool) -> Fingerprint {
    Fingerprint::of(if variant { b"request B" } else { b"request A" })
}

/// A response whose bytes depend on the key, the fence and `size`, so a misplaced or stale
/// response cannot pass for the right one.
pub(crate) fn response(id: Id, fence: u64, size: usize) -> Response {
    let mut body = format!("{}/{}/{}/{fence}:", TENANTS[id.0], ENDPOINTS[id.1], id.2).into_bytes();
    body.extend((0..size).map(|i| (i as u64 ^ fence).to_le_bytes()[0]));
    Response::new(200 + (fence % 7) as u16, body)
        .with_header("x-fence", fence.to_string())
        .with_header("set-cookie", "a=1")
        .with_header("set-cookie", "b=2")
}

/// What the disk may hold for one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum State {
    Absent,
    /// `fence: None` is an unacknowledged claim whose fence the caller never saw.
    InProgress {
        fence: Option<u64>,
        lease_until: u64,
    },
    Completed {
        fence: u64,
        response: Response,
        expires_at: u64,
    },
}

/// One step of a workload, with its parameters drawn from a seed.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Step {
    Claim {
        id: Id,
        variant: bool,
    },
    /// A claim whose caller went away before it returned: a `claim_async` future polled once
    /// (its claim queued) and dropped, so the claim is withdrawn.
    AbandonClaim {
        id: Id,
        variant: bool,
    },
    Complete {
        pick: usize,
        size: usize,
    },
    Release {
        pick: usize,
    },
    Extend {
        pick: usize,
        secs: u64,
    },
    Advance {
        secs: u64,
    },
    Purge,
    Reap {
        seed: u64,
    },
}

/// A fixed workload of `len` steps drawn from `seed`.
pub(crate) fn workload(seed: u64, len: usize) -> Vec<Step> {
    let mut rng = SplitMix64::new(seed);
    (0..len)
        .map(|_| {
            let r = rng.next_u64();
            let pick = (r >> 16) as usize;
            match r % 100 {
                0..=35 => Step::Claim {
                    id: (
                        pick % TENANTS.len(),
                        (pick >> 4) % ENDPOINTS.len(),
                        (pick >> 8) % KEYS,
                    ),
                    variant: (r >> 40).is_multiple_of(10),
                },
                36..=39 => Step::AbandonClaim {
                    id: (
                        pick % TENANTS.len(),
                        (pick >> 4) % ENDPOINTS.len(),
                        (pick >> 8) % KEYS,
                    ),
                    variant: (r >> 40).is_multiple_of(10),
                },
                40..=64 => Step::Complete {
                    pick,
                    size: match (r >> 40) % 8 {
                        0 => 0,
                        1 => 5000,
                        n => (n as usize) * 150,
                    },
                },
                65..=74 => Step::Release { pick },
                75..=79 => Step::Extend {
                    pick,
                    secs: (r >> 40) % 200,
                },
                80..=89 => Step::Advance {
                    secs: 1 + (r >> 40) % 90,
                },
                90..=94 => Step::Purge,
                _ => Step::Reap { seed: r },
            }
        })
        .collect()
}

fn ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// What the store acknowledged, key by key, and the tickets still held.
pub(crate) struct Model {
    pub clock: ManualClock,
    /// Allowed states per key: one when certain, two when the call that touched it failed.
    pub keys: BTreeMap<Id, Vec<State>>,
    pub tickets: Vec<(Id, Ticket)>,
    pub max_fence: u64,
    pub acknowledged: u64,
    /// The journal size every open uses; `None`: the simulated disk's default.
    pub journal_bytes: Option<u64>,
}

/// Why a workload stopped.
#[derive(Debug)]
pub(crate) enum Stop {
    /// Every step ran.
    Done,
    /// A call failed with this error (the disk is gone or faulty).
    Failed(Error),
}

impl Model {
    pub(crate) fn new(clock: ManualClock) -> Model {
        Model {
            clock,
            keys: BTreeMap::new(),
            tickets: Vec::new(),
            max_fence: 0,
            acknowledged: 0,
            journal_bytes: None,
        }
    }

    pub(crate) fn now(&self) -> u64 {
        use idemdb::Clock;
        ms(self.clock.now())
    }

    fn certain(&self, id: Id) -> State {
        let states = self
            .keys
            .get(&id)
            .cloned()
            .unwrap_or_else(|| vec![State::Absent]);
        assert_eq!(
            states.len(),
            1,
            "{id:?} is uncertain: the run should have stopped"
        );
        states.into_iter().next().unwrap()
    }

    fn set(&mut self, id: Id, state: State) {
        self.keys.insert(id, vec![state]);
        self.acknowledged += 1;
    }

    /// The call on `id` failed, or was abandoned: it may have landed (`after`) or not.
    fn unsure(&mut self, id: Id, after: State) {
        let states = self.keys.entry(id).or_insert_with(|| vec![State::Absent]);
        if !states.contains(&after) {
            states.push(after);
        }
    }

    pub(crate) fn builder(&self) -> idemdb::StoreBuilder {
        let builder = Store::builder()
            .lease(LEASE)
            .ttl(TTL)
            .clock(self.clock.clone());
        match self.journal_bytes {
            Some(bytes) => builder.journal_size(bytes),
            None => builder,
        }
    }

    /// Runs `steps` until one fails for a reason other than a lost lease.
    pub(crate) fn run(&mut self, store: &Store, steps: &[Step]) -> Stop {
        for step in steps {
            if let Err(e) = self.step(store, *step) {
                return Stop::Failed(e);
            }
        }
        Stop::Done
    }

    fn take_ticket(&mut self, pick: usize) -> Option<(Id, Ticket)> {
        if self.tickets.is_empty() {
            return None;
        }
        let i = pick % self.tickets.len();
        Some(self.tickets.swap_remove(i))
    }

    fn step(&mut self, store: &Store, step: Step) -> Result<(), Error> {
        match step {
            Step::Claim { id, variant } => {
                match store.claim(&scope(id), &key(id), fingerprint(variant)) {
                    Ok(Claim::Acquired(t)) => self.acquired(id, t),
                    Ok(_) => {}
                    Err(e) => {
                        let lease_until = self.now() + LEASE.as_millis() as u64;
                        self.unsure(
                            id,
                            State::InProgress {
                                fence: None,
                                lease_until,
                            },
                        );
                        return Err(e);
                    }
                }
            }
            Step::AbandonClaim { id, variant } => self.abandon_claim(store, id, variant)?,
            Step::Complete { pick, size } => {
                let Some((id, t)) = self.take_ticket(pick) else {
                    return Ok(());
                };
                let fence = t.fence();
                let r = response(id, fence, size);
                let after = State::Completed {
                    fence,
                    response: r.clone(),
                    expires_at: self.now() + TTL.as_millis() as u64,
                };
                match store.complete(t, r) {
                    Ok(()) => self.set(id, after),
                    Err(Error::LeaseLost { .. }) => {}
                    Err(e) => {
                        self.unsure(id, after);
                        return Err(e);
                    }
                }
            }
            Step::Release { pick } => {
                let Some((id, t)) = self.take_ticket(pick) else {
                    return Ok(());
                };
                match store.release(t) {
                    Ok(()) => self.set(id, State::Absent),
                    Err(Error::LeaseLost { .. }) => {}
                    Err(e) => {
                        self.unsure(id, State::Absent);
                        return Err(e);
                    }
                }
            }
            Step::Extend { pick, secs } => {
                if self.tickets.is_empty() {
                    return Ok(());
                }
                let i = pick % self.tickets.len();
                let (id, t) = &self.tickets[i];
                let (id, fence) = (*id, t.fence());
                let lease_until = self.now() + secs * 1000;
                let after = State::InProgress {
                    fence: Some(fence),
                    lease_until,
                };
                match store.extend(t, Duration::from_secs(secs)) {
                    Ok(()) => self.set(id, after),
                    Err(Error::LeaseLost { .. }) => {
                        drop(self.tickets.swap_remove(i));
                    }
                    Err(e) => {
                        self.unsure(id, after);
                        return Err(e);
                    }
                }
            }
            Step::Advance { secs } => self.clock.advance(Duration::from_secs(secs)),
            Step::Purge => {
                let now = self.now();
                let due: Vec<Id> = self
                    .keys
                    .iter()
                    .filter(|(_, s)| {
                        matches!(s[..], [State::Completed { expires_at, .. }] if expires_at <= now)
                    })
                    .map(|(id, _)| *id)
                    .collect();
                match store.purge_expired() {
                    Ok(n) => {
                        assert_eq!(n, due.len(), "purge count");
                        for id in due {
                            self.set(id, State::Absent);
                        }
                    }
                    Err(e) => {
                        for id in due {
                            self.unsure(id, State::Absent);
                        }
                        return Err(e);
                    }
                }
            }
            Step::Reap { seed } => {
                let now = self.now();
                let mut decided = Vec::new();
                let result = store.reap(|stale| {
                    let id = id_of(&stale.scope, &stale.key);
                    let resolution = match SplitMix64::new(seed ^ stale.fence).next_u64() % 3 {
                        0 => Resolution::Release,
                        1 => Resolution::Complete(response(id, stale.fence, 100)),
                        _ => Resolution::Keep,
                    };
                    let after = match &resolution {
                        Resolution::Release => Some(State::Absent),
                        Resolution::Complete(r) => Some(State::Completed {
                            fence: stale.fence,
                            response: r.clone(),
                            expires_at: now + TTL.as_millis() as u64,
                        }),
                        Resolution::Keep => None,
                    };
                    if let Some(after) = after {
                        decided.push((id, after));
                    }
                    resolution
                });
                match result {
                    Ok(n) => {
                        assert_eq!(n, decided.len(), "reap count");
                        for (id, after) in decided {
                            self.set(id, after);
                        }
                    }
                    Err(e) => {
                        for (id, after) in decided {
                            self.unsure(id, after);
                        }
                        return Err(e);
                    }
                }
            }
        }
        Ok(())
    }

    /// A `claim_async` future polled once and dropped. If it queued a claim, the claim is
    /// withdrawn: a fresh one is released behind it (a crash may still find it on disk, an
    /// orphan with a fence above every acknowledged one, only while no later batch landed); a
    /// takeover keeps its record, with its lease ended in memory, so the disk holds either the
    /// claim it took over or the takeover's own record, whose fence `get` tells.
    fn abandon_claim(&mut self, store: &Store, id: Id, variant: bool) -> Result<(), Error> {
        let lease_until = self.now() + LEASE.as_millis() as u64;
        let (scope, key) = (scope(id), key(id));
        let mut future = Box::pin(store.claim_async(&scope, &key, fingerprint(variant)));
        match future
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
        {
            Poll::Ready(Ok(Claim::Acquired(t))) => {
                // Durable at once (no journal to wait for): an ordinary claim.
                self.acquired(id, t);
            }
            Poll::Ready(Ok(_)) => {}
            Poll::Ready(Err(e)) => {
                self.unsure(
                    id,
                    State::InProgress {
                        fence: None,
                        lease_until,
                    },
                );
                return Err(e);
            }
            Poll::Pending => {
                drop(future);
                let takeover = match store.get(&scope, &key) {
                    Ok(Some(entry)) if entry.fence > self.max_fence => Some(entry.fence),
                    _ => None,
                };
                self.unsure(
                    id,
                    State::InProgress {
                        fence: takeover,
                        lease_until,
                    },
                );
                if takeover.is_none() {
                    // The release landed too, and with it the expired record the claim replaced.
                    self.unsure(id, State::Absent);
                }
            }
        }
        Ok(())
    }

    fn acquired(&mut self, id: Id, t: Ticket) {
        assert!(t.fence() > self.max_fence, "fence reissued");
        self.max_fence = t.fence();
        let state = State::InProgress {
            fence: Some(t.fence()),
            lease_until: ms(t.lease_deadline()),
        };
        self.set(id, state);
        self.tickets.push((id, t));
    }

    /// Checks a reopened store against what was acknowledged; returns how many keys it checked.
    /// Panics with the difference on the first violation.
    pub(crate) fn check(&self, store: &Store) -> usize {
        let now = self.now();
        let mut live_min = 0;
        let mut live_max = 0;
        let mut checked = 0;
        for t in 0..TENANTS.len() {
            for e in 0..ENDPOINTS.len() {
                for k in 0..KEYS {
                    let id = (t, e, k);
                    let allowed = self
                        .keys
                        .get(&id)
                        .cloned()
                        .unwrap_or_else(|| vec![State::Absent]);
                    let entry = store
                        .get(&scope(id), &key(id))
                        .unwrap_or_else(|e| panic!("{id:?}: get failed after reopen: {e}"));
                    let ok = allowed
                        .iter()
                        .any(|s| matches_state(s, entry.as_ref(), now, self.max_fence));
                    assert!(
                        ok,
                        "{id:?}: the store holds {entry:?}, but only {allowed:?} was acknowledged"
                    );
                    let on_disk = |s: &State| !matches!(s, State::Absent);
                    live_min += usize::from(allowed.iter().all(on_disk));
                    live_max += usize::from(allowed.iter().any(on_disk));
                    checked += 1;
                }
            }
        }
        let live = store.record_count().unwrap() as usize;
        assert!(
            (live_min..=live_max).contains(&live),
            "{live} records on disk, expected {live_min}..={live_max}: a record appeared that was never claimed, or one vanished"
        );
        // Every orphan the reaper sees is a key of the workload, in progress as acknowledged.
        store
            .reap(|stale| {
                assert!(stale.orphan);
                let id = id_of(&stale.scope, &stale.key);
                let allowed = &self.keys[&id];
                assert!(
                    allowed.iter().any(|s| matches!(s, State::InProgress { fence, .. } if fence.is_none_or(|f| f == stale.fence))),
                    "{id:?}: orphan fence {} not acknowledged: {allowed:?}",
                    stale.fence
                );
                Resolution::Keep
            })
            .unwrap();
        checked
    }
}

fn id_of(scope: &Scope, key: &str) -> Id {
    let t = TENANTS
        .iter()
        .position(|t| *t == scope.tenant())
        .expect("known tenant");
    let e = ENDPOINTS
        .iter()
        .position(|e| *e == scope.endpoint())
        .expect("known endpoint");
    let k = key
        .strip_prefix("key-")
        .and_then(|k| k.parse().ok())
        .expect("known key");
    (t, e, k)
}

fn matches_state(state: &State, entry: Option<&idemdb::Entry>, now: u64, max_fence: u64) -> bool {
    match (state, entry) {
        (State::Absent, None) => true,
        (State::Completed { expires_at, .. }, None) => *expires_at <= now,
        (
            State::Completed {
                fence,
                response,
                expires_at,
            },
            Some(e),
        ) => {
            *expires_at > now
                && e.fence == *fence
                && matches!(&e.state, EntryState::Completed { response: r, .. } if r == response)
        }
        (State::InProgress { fence, lease_until }, Some(e)) => match &e.state {
            EntryState::InProgress {
                lease_deadline,
                orphan,
            } => {
                *orphan
                    && match fence {
                        Some(f) => e.fence == *f && ms(*lease_deadline) == *lease_until,
                        None => e.fence > max_fence,
                    }
            }
            EntryState::Completed { .. } => false,
        },
        _ => false,
    }
}

/// Runs `steps` on `disk` from its current state (opening the store on it), stops at the first
/// failure, and returns the model and why it stopped. The store is dropped before returning.
pub(crate) fn run_on(disk: &SimDisk, clock: ManualClock, steps: &[Step]) -> (Model, Stop) {
    let mut model = Model::new(clock);
    let store = match model.builder().open_simulated(disk) {
        Ok(store) => store,
        Err(e) => return (model, Stop::Failed(e)),
    };
    let stop = model.run(&store, steps);
    drop(store);
    (model, stop)
}

/// Crashes `disk` with `image`, checks redb's integrity, reopens the store and checks it
/// against `model`. Then checks that fences keep growing and that a pre-crash ticket is fenced
/// off. Returns the number of keys checked.
pub(crate) fn crash_and_check(disk: &SimDisk, image: CrashImage, model: &Model) -> usize {
    crash_and_check_open(disk, image, model).0
}

/// [`crash_and_check`], returning the reopened store too, for checks that need no fresh
/// reopen of their own.
pub(crate) fn crash_and_check_open(
    disk: &SimDisk,
    image: CrashImage,
    model: &Model,
) -> (usize, Store) {
    disk.crash(image);
    match disk.redb_integrity() {
        Ok(true) => {}
        Ok(false) => panic!("redb repaired the file after a crash with {image:?}"),
        Err(e) => panic!("redb cannot open the file after a crash with {image:?}: {e}"),
    }
    let store = model
        .builder()
        .open_simulated(disk)
        .unwrap_or_else(|e| panic!("reopen after a crash with {image:?} failed: {e}"));
    let checked = model.check(&store);
    let fresh = (0, 0, KEYS + 1);
    match store.claim(&scope(fresh), &key(fresh), fingerprint(false)) {
        Ok(Claim::Acquired(t)) => assert!(
            t.fence() > model.max_fence,
            "fence {} reissued after a crash (highest acknowledged {})",
            t.fence(),
            model.max_fence
        ),
        other => panic!("fresh claim after reopen: {other:?}"),
    }
    (checked, store)
}

/// After a crash, a ticket from before it can change nothing.
pub(crate) fn old_ticket_is_fenced_off(model: &mut Model, store: &Store) {
    if let Some((_, t)) = model.tickets.pop() {
        let fence = t.fence();
        match store.complete(t, Response::new(200, "late")) {
            Err(Error::LeaseLost { fence: f }) => assert_eq!(f, fence),
            other => panic!("a pre-crash ticket completed after the crash: {other:?}"),
        }
    }
}
