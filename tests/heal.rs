//! A store halted by a failed write or sync heals in place once the disk works again
//! (`src/file/heal.rs`, `StoreBuilder::heal_after`):
//!
//! - on the simulated disk, with writes or syncs failing from a random moment of a random
//!   workload for a while: meanwhile every operation fails and nothing is answered from
//!   memory; then the store heals by itself, every acknowledged operation is there, each failed
//!   one shows its state before or after it and nothing else, tickets from before the heal are
//!   fenced off (`LeaseLost`), and the healed file survives a power loss and a reopen;
//! - a batch whose sync failed is gone after the heal, not read back from the page cache the
//!   failed sync left behind (the cache drop);
//!
//! A real full filesystem (a size-limited tmpfs) is `tests/full_disk.rs`.

use idemdb::simulation::{CrashImage, SimDisk, SplitMix64};
use idemdb::{Claim, EntryState, Error, Fingerprint, Response, Scope, Store, Ticket};
use std::collections::HashMap;
use std::time::{Duration, Instant};

const KEYS: u64 = 16;

fn scope() -> Scope {
    Scope::new("tenant", "POST /v1/payments")
}

fn fp() -> Fingerprint {
    Fingerprint::of(b"pay 5000")
}

fn response(key: &str, fence: u64) -> Response {
    Response::new(201, format!("{key} charged under fence {fence}"))
        .with_header("x-fence", fence.to_string())
}

/// What a key may hold: one state once certain, two after a call that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Absent,
    InProgress(u64),
    Completed(u64),
}

struct Model {
    keys: HashMap<String, Vec<State>>,
    tickets: HashMap<String, Ticket>,
    acknowledged: u64,
    failed: u64,
}

impl Model {
    fn new() -> Model {
        Model {
            keys: HashMap::new(),
            tickets: HashMap::new(),
            acknowledged: 0,
            failed: 0,
        }
    }

    fn certain(&self, key: &str) -> Option<State> {
        match self.keys.get(key).map(Vec::as_slice) {
            None => Some(State::Absent),
            Some([one]) => Some(one.clone()),
            Some(_) => None,
        }
    }

    fn set(&mut self, key: &str, state: State) {
        self.keys.insert(key.to_owned(), vec![state]);
        self.acknowledged += 1;
    }

    fn unsure(&mut self, key: &str, after: State) {
        let states = self
            .keys
            .entry(key.to_owned())
            .or_insert_with(|| vec![State::Absent]);
        if !states.contains(&after) {
            states.push(after);
        }
        self.failed += 1;
    }
}

/// One step on `key`: claim it, or complete or release the claim held on it. Only keys whose
/// state is certain are used, so a failed call leaves at most two possible states.
fn step(store: &Store, model: &mut Model, key: &str, rng: &mut SplitMix64) {
    let Some(before) = model.certain(key) else {
        return;
    };
    if let Some(ticket) = model.tickets.remove(key) {
        let fence = ticket.fence();
        if rng.next_u64().is_multiple_of(4) {
            match store.release(ticket) {
                Ok(()) => model.set(key, State::Absent),
                Err(_) => model.unsure(key, State::Absent),
            }
        } else {
            match store.complete(ticket, response(key, fence)) {
                Ok(()) => model.set(key, State::Completed(fence)),
                Err(_) => model.unsure(key, State::Completed(fence)),
            }
        }
        return;
    }
    match store.claim(&scope(), key, fp()) {
        Ok(Claim::Acquired(ticket)) => {
            assert!(
                matches!(before, State::Absent),
                "{key}: acquired over {before:?}"
            );
            model.set(key, State::InProgress(ticket.fence()));
            model.tickets.insert(key.to_owned(), ticket);
        }
        Ok(Claim::Replay(r)) => match before {
            State::Completed(fence) => assert_eq!(r, response(key, fence), "{key}"),
            other => panic!("{key}: replay while the model says {other:?}"),
        },
        Ok(Claim::InProgress { .. }) => assert!(
            matches!(before, State::InProgress(_)),
            "{key}: in progress while the model says {before:?}"
        ),
        Ok(other) => panic!("{key}: {other:?}"),
        // A claim that failed may have been made, under a fence its caller never saw.
        Err(_) if before == State::Absent => model.unsure(key, State::InProgress(0)),
        Err(_) => model.failed += 1,
    }
}

/// What the store holds for `key`, as the model writes it (a fence the caller never saw is 0).
fn read(store: &Store, key: &str, model: &Model) -> State {
    let entry = store.get(&scope(), key).expect("a healed store reads");
    let Some(entry) = entry else {
        return State::Absent;
    };
    let states = model.keys.get(key).cloned().unwrap_or_default();
    match entry.state {
        EntryState::InProgress { .. } => {
            if states.contains(&State::InProgress(entry.fence)) {
                State::InProgress(entry.fence)
            } else {
                State::InProgress(0)
            }
        }
        EntryState::Completed { response: r, .. } => {
            assert_eq!(
                r,
                response(key, entry.fence),
                "{key}: a response not its own"
            );
            State::Completed(entry.fence)
        }
    }
}

fn check(store: &Store, model: &Model, when: &str) {
    let mut keys: Vec<String> = (0..KEYS).map(|k| format!("key-{k}")).collect();
    keys.extend(model.keys.keys().cloned());
    for key in keys {
        let found = read(store, &key, model);
        let allowed = model
            .keys
            .get(&key)
            .cloned()
            .unwrap_or_else(|| vec![State::Absent]);
        assert!(
            allowed.contains(&found),
            "{when}: {key} holds {found:?}, allowed {allowed:?}"
        );
    }
}

/// Waits until the store answers again (a read of a key no step uses).
fn until_healed(store: &Store, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        match store.get(&scope(), "probe") {
            Ok(_) => return,
            Err(Error::Halted { .. }) => {}
            Err(e) => panic!("while healing: {e:?}"),
        }
        assert!(
            Instant::now() < deadline,
            "the store did not heal within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[derive(Debug, Clone, Copy)]
enum Outage {
    Writes,
    Syncs,
}

/// Returns how many claims were answered (replay or in progress) while the store was halted.
fn outage_then_heal(seed: u64, outage: Outage) -> (usize, usize) {
    let mut rng = SplitMix64::new(seed);
    let disk = SimDisk::new();
    let store = Store::builder()
        .heal_after(Some(Duration::from_millis(1)))
        .open_simulated(&disk)
        .unwrap();
    let mut model = Model::new();
    let key = |rng: &mut SplitMix64| format!("key-{}", rng.next_u64() % KEYS);

    for _ in 0..rng.next_u64() % 120 {
        let k = key(&mut rng);
        step(&store, &mut model, &k, &mut rng);
    }
    let skip = rng.next_u64() % 4;
    match outage {
        Outage::Writes => disk.fail_write_after(skip, true),
        Outage::Syncs => disk.fail_sync_after(skip, true),
    }
    // Steps until the fault fires, then some more while the disk keeps failing (and heals
    // are attempted and fail).
    let mut after_failure = 0;
    let mut steps = 0;
    while after_failure < 12 {
        steps += 1;
        assert!(steps < 100_000, "seed {seed}: the fault never fired");
        let failed = model.failed;
        // Fresh keys now and then, so that there is always something to write.
        let k = if rng.next_u64().is_multiple_of(3) {
            format!("fresh-{steps}")
        } else {
            key(&mut rng)
        };
        step(&store, &mut model, &k, &mut rng);
        if model.failed > failed || after_failure > 0 {
            after_failure += 1;
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    // Still failing: `get` answers nothing, not even from memory.
    match store.get(&scope(), "key-0") {
        Err(Error::Halted { .. }) => {}
        other => panic!("a read while the disk fails: {other:?}"),
    }
    // Claims are answered where they only read what is durable: every key, whatever the model
    // knows of it (a key a failed call touched included), is claimed; each answer is checked
    // against what the healed store holds.
    let mut keys: Vec<String> = (0..KEYS).map(|k| format!("key-{k}")).collect();
    keys.extend(model.keys.keys().cloned());
    let degraded: Vec<(String, Claim)> = keys
        .into_iter()
        .filter_map(|key| match store.claim(&scope(), &key, fp()) {
            Err(Error::Halted { .. }) => None,
            Ok(Claim::Acquired(_)) => panic!("seed {seed}: {key} acquired while halted"),
            Ok(answer) => Some((key, answer)),
            Err(e) => panic!("seed {seed}: {key} while halted: {e:?}"),
        })
        .collect();
    let pre_heal: Vec<(String, Ticket)> = model.tickets.drain().collect();

    disk.clear_faults();
    until_healed(&store, Duration::from_secs(10));
    assert_eq!(store.stats().heals, 1, "seed {seed}");
    for (key, answer) in &degraded {
        let healed = read(&store, key, &model);
        match (answer, &healed) {
            (Claim::Replay(r), State::Completed(fence)) => {
                assert_eq!(
                    *r,
                    response(key, *fence),
                    "seed {seed}: {key} replayed while halted"
                );
            }
            (Claim::InProgress { .. }, State::InProgress(_)) => {}
            _ => panic!(
                "seed {seed}: {key} answered {answer:?} while halted, but the disk holds {healed:?}"
            ),
        }
    }
    check(
        &store,
        &model,
        &format!("seed {seed}, {outage:?}: after the heal"),
    );
    for (key, ticket) in pre_heal {
        match store.complete(ticket, response(&key, 0)) {
            Err(Error::LeaseLost { .. }) => {}
            other => panic!("seed {seed}: a ticket from before the heal: {other:?}"),
        }
    }

    // The healed store works, and what it holds lasts.
    let mut model = Model {
        keys: model.keys,
        ..Model::new()
    };
    for _ in 0..40 {
        let k = key(&mut rng);
        step(&store, &mut model, &k, &mut rng);
    }
    let held: Vec<Ticket> = model.tickets.drain().map(|(_, t)| t).collect();
    std::mem::forget(held);
    drop(store);
    disk.crash(CrashImage::Durable);
    let reopened = Store::builder().open_simulated(&disk).unwrap_or_else(|e| {
        panic!("seed {seed}, {outage:?}: the reopen after a power loss: {e:?}")
    });
    check(
        &reopened,
        &model,
        &format!("seed {seed}, {outage:?}: after a power loss"),
    );
    let replays = degraded
        .iter()
        .filter(|(_, a)| matches!(a, Claim::Replay(_)))
        .count();
    (replays, degraded.len() - replays)
}

/// Runs `seeds`, and shows that claims were answered while halted (the check is not vacuous).
fn outages(seeds: std::ops::Range<u64>, outage: Outage) {
    let (mut replays, mut in_progress) = (0, 0);
    for seed in seeds {
        let (r, i) = outage_then_heal(seed, outage);
        replays += r;
        in_progress += i;
    }
    println!("{outage:?}: {replays} replays and {in_progress} in-progress answers while halted, each as the healed store holds");
    assert!(
        replays > 0 && in_progress > 0,
        "no claim was answered while halted"
    );
}

#[test]
fn a_store_heals_after_syncs_fail_for_a_while_and_keeps_every_acknowledged_operation() {
    outages(0..150, Outage::Syncs);
}

#[test]
fn a_store_heals_after_writes_fail_for_a_while_and_keeps_every_acknowledged_operation() {
    outages(1000..1150, Outage::Writes);
}

/// After a failed sync, the page cache still holds the failed batch (Linux marks its pages
/// clean); reopening through that cache would replay a claim whose call failed, and keep it
/// for good. The heal drops the cache first, so the claim is gone.
#[test]
fn a_batch_whose_sync_failed_is_not_read_back_from_the_page_cache() {
    let disk = SimDisk::new();
    let store = Store::builder()
        .heal_after(Some(Duration::from_millis(1)))
        .open_simulated(&disk)
        .unwrap();
    let Claim::Acquired(kept) = store.claim(&scope(), "acknowledged", fp()).unwrap() else {
        panic!("a new key")
    };
    let fence = kept.fence();
    store
        .complete(kept, response("acknowledged", fence))
        .unwrap();
    let before = store.stats();
    disk.fail_sync_after(0, true);
    assert!(store.claim(&scope(), "failed", fp()).is_err());
    assert!(
        disk.cache_differs_from_disk(),
        "the failed batch should linger in the cache"
    );
    disk.clear_faults();
    until_healed(&store, Duration::from_secs(10));
    assert!(store.get(&scope(), "failed").unwrap().is_none());
    // The counters go on across the heal rather than start again from the new store's.
    let after = store.stats();
    assert!(
        after.commit_batches >= before.commit_batches,
        "{before:?} -> {after:?}"
    );
    assert_eq!(
        (after.acquired, after.completes),
        (before.acquired, before.completes)
    );
    match store.claim(&scope(), "acknowledged", fp()).unwrap() {
        Claim::Replay(r) => assert_eq!(r, response("acknowledged", fence)),
        other => panic!("{other:?}"),
    }
}

/// `heal_after(None)`: the store stays halted, as before healing existed.
#[test]
fn a_store_told_not_to_heal_stays_halted() {
    let disk = SimDisk::new();
    let store = Store::builder()
        .heal_after(None)
        .open_simulated(&disk)
        .unwrap();
    disk.fail_sync_after(0, false);
    assert!(store.claim(&scope(), "a", fp()).is_err());
    std::thread::sleep(Duration::from_millis(50));
    assert!(matches!(
        store.claim(&scope(), "b", fp()),
        Err(Error::Halted { .. })
    ));
    assert_eq!(store.stats().heals, 0);
}

/// An open that meets one failed sync anywhere (after a store halted on a failed sync and was
/// closed, as a heal finds it) either fails or goes on over exactly what the disk holds: never
/// over pages the failed sync lost (Linux keeps them in the page cache, clean). Written while
/// chasing the intermittent "File truncated below stored layout" after a heal (see the heal
/// tests above): it rules out the open's own close-and-reopen as the cause; the cause is open.
#[test]
fn an_open_never_goes_on_over_pages_a_failed_sync_lost() {
    let mut refused = 0;
    for seed in 0..20 {
        // A store that halted on a failed sync, closed while halted, as a heal finds it.
        let disk = SimDisk::new();
        {
            let store = Store::builder()
                .heal_after(None)
                .open_simulated(&disk)
                .unwrap();
            let mut model = Model::new();
            let mut rng = SplitMix64::new(seed);
            for i in 0..rng.next_u64() % 80 {
                step(&store, &mut model, &format!("key-{}", i % 9), &mut rng);
            }
            disk.fail_sync_after(rng.next_u64() % 3, true);
            for i in 0..20 {
                step(&store, &mut model, &format!("fresh-{i}"), &mut rng);
            }
            std::mem::forget(model.tickets);
        }
        disk.clear_faults();
        disk.drop_cache();
        for n in 0..40 {
            let disk = disk.fork();
            disk.fail_sync_after(n, false);
            let opened = Store::builder().heal_after(None).open_simulated(&disk);
            match opened {
                Ok(store) => {
                    assert!(
                        !disk.cache_differs_from_disk(),
                        "seed {seed}: sync {n} of the open failed, yet the open went on over the lost pages"
                    );
                    drop(store);
                }
                Err(Error::Io(_) | Error::Halted { .. }) => refused += 1,
                Err(other) => panic!("seed {seed}, sync {n}: {other:?}"),
            }
        }
    }
    assert!(
        refused > 0,
        "no sync of an open failed: the test tests nothing"
    );
}

/// A heal whose reopen finds the file damaged gives up: no retry can fix that. The store stays
/// halted, every operation's `Halted` says why, and no attempt follows, even once the disk
/// works again; what was acknowledged is still in the file, for the operator to verify or
/// restore.
#[test]
fn a_heal_that_finds_the_file_damaged_gives_up_and_says_why() {
    let disk = SimDisk::new();
    let store = Store::builder()
        .heal_after(Some(Duration::from_millis(5)))
        .open_simulated(&disk)
        .unwrap();
    let Claim::Acquired(t) = store.claim(&scope(), "acknowledged", fp()).unwrap() else {
        panic!("a new key")
    };
    let fence = t.fence();
    store.complete(t, response("acknowledged", fence)).unwrap();
    disk.fail_sync_after(0, false);
    assert!(
        store.claim(&scope(), "lost", fp()).is_err(),
        "the sync fails"
    );
    // What the reopen reads now stands for a damaged page: redb panics on it.
    disk.panic_on_read();
    let deadline = Instant::now() + Duration::from_secs(10);
    let cause = loop {
        match store.claim(&scope(), "during", fp()) {
            Err(Error::Halted { cause }) if cause.contains("could not be reopened") => break cause,
            Err(Error::Halted { .. }) => {
                assert!(Instant::now() < deadline, "the heal never gave up");
                std::thread::sleep(Duration::from_millis(5));
            }
            other => panic!("a store whose heal failed must stay halted: {other:?}"),
        }
    };
    assert!(
        cause.contains("Corrupted") || cause.contains("corrupted"),
        "{cause}"
    );
    disk.clear_faults();
    std::thread::sleep(Duration::from_millis(300));
    match store.get(&scope(), "acknowledged") {
        Err(Error::Halted { cause: again }) => {
            assert_eq!(again, cause, "no attempt after giving up")
        }
        other => panic!("still halted after giving up: {other:?}"),
    }
    assert_eq!(store.stats().heals, 0);
    drop(store);
    // The file is as the last acknowledged commit left it.
    let reopened = Store::builder().open_simulated(&disk).unwrap();
    match reopened.claim(&scope(), "acknowledged", fp()).unwrap() {
        Claim::Replay(r) => assert_eq!(r, response("acknowledged", fence)),
        other => panic!("{other:?}"),
    }
}
