//! What tests/metrics.rs and tests/tracing.rs drive a store through, each then reading what
//! the store reported: a store on a manual clock, and a halt followed by its heal.

use idemdb::simulation::SimDisk;
use idemdb::{Claim, Error, Fingerprint, ManualClock, Scope, Store, Ticket};
use std::time::{Duration, Instant};

pub(crate) fn scope() -> Scope {
    Scope::new("tenant", "POST /x")
}

pub(crate) fn fp() -> Fingerprint {
    Fingerprint::of(b"x")
}

/// A store in memory named `name`, on `clock`: 60 s leases, a one-hour TTL.
pub(crate) fn on_clock(name: &str, clock: &ManualClock) -> Store {
    Store::builder()
        .name(name)
        .lease(Duration::from_secs(60))
        .ttl(Duration::from_secs(3600))
        .clock(clock.clone())
        .in_memory()
        .unwrap()
}

/// Claims `key`, which must be acquired.
pub(crate) fn acquire(store: &Store, key: &str) -> Ticket {
    match store.claim(&scope(), key, fp()).unwrap() {
        Claim::Acquired(ticket) => ticket,
        other => panic!("{key}: {other:?}"),
    }
}

/// A store on a simulated disk named `name` that claims "a", halts on a failed sync (a claim
/// of "b" fails), and heals once the disk works again; returned healed.
pub(crate) fn halted_then_healed(name: &str) -> Store {
    let disk = SimDisk::new();
    let store = Store::builder()
        .name(name)
        .heal_after(Some(Duration::from_millis(1)))
        .open_simulated(&disk)
        .unwrap();
    drop(acquire(&store, "a"));
    disk.fail_sync_after(0, true);
    assert!(store.claim(&scope(), "b", fp()).is_err());
    disk.clear_faults();
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Err(e) = store.get(&scope(), "probe") {
        assert!(matches!(e, Error::Halted { .. }), "{e:?}");
        assert!(Instant::now() < deadline, "no heal within 10 s");
        std::thread::sleep(Duration::from_millis(2));
    }
    store
}
