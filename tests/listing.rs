//! Inspecting a store record by record (`Store::scan`, `Store::list`), and making a new file
//! from an export (`StoreBuilder::import_new`): what the `idemdb` command is built on.

use idemdb::{
    Claim, EntryState, Error, Fingerprint, ManualClock, Query, RecordStatus, Response, Scope, Store,
};
use std::ops::ControlFlow;
use std::time::Duration;

mod engines;

const LEASE: Duration = Duration::from_secs(60);
const TTL: Duration = Duration::from_secs(3600);

fn acquire(store: &Store, scope: &Scope, key: &str) -> idemdb::Ticket {
    match store
        .claim(scope, key, Fingerprint::of(key.as_bytes()))
        .unwrap()
    {
        Claim::Acquired(t) => t,
        other => panic!("{key}: {other:?}"),
    }
}

/// One record of each status: completed, expired, in progress, stale, orphan.
fn every_status(store: &Store, clock: &ManualClock) -> Vec<idemdb::Ticket> {
    let a = Scope::new("acme", "POST /pay");
    let b = Scope::new("bravo", "POST /refund");
    let t = acquire(store, &a, "expired");
    store.complete(t, Response::new(201, "old")).unwrap();
    clock.advance(TTL - Duration::from_secs(1));
    let stale = acquire(store, &b, "stale");
    clock.advance(Duration::from_secs(2)); // "expired" is past its TTL now
    let t = acquire(store, &a, "completed");
    store
        .complete(
            t,
            Response::new(200, vec![0xff, 0x00]).with_header("x-id", "7"),
        )
        .unwrap();
    drop(acquire(store, &b, "orphan")); // a dropped ticket: its holder is gone
    clock.advance(LEASE); // "stale"'s lease ran out; "orphan" is an orphan whatever its lease
    let live = acquire(store, &a, "in-progress");
    vec![stale, live]
}

fn store() -> (Store, ManualClock) {
    let clock = ManualClock::new();
    let store = Store::builder()
        .lease(LEASE)
        .ttl(TTL)
        .clock(clock.clone())
        .in_memory()
        .unwrap();
    (store, clock)
}

on_every_engine! {
    fn a_census_counts_every_status_per_tenant_and_names_the_oldest_claim(b: Backend) {
        let clock = ManualClock::new();
        let store = b.open(Store::builder().lease(LEASE).ttl(TTL).clock(clock.clone()));
        let _held = every_status(&store, &clock);
        let census = store.census().unwrap();
        // RecordStatus::ALL: in progress, stale, orphan, completed, expired.
        assert_eq!(census.by_tenant["acme"], [1, 0, 0, 1, 1]);
        assert_eq!(census.by_tenant["bravo"], [0, 1, 1, 0, 0]);
        assert_eq!(census.by_status(), [1, 1, 1, 1, 1]);
        assert_eq!(census.records(), 5);
        assert_eq!(census.response_bytes, 3 + 2, "\"old\" and the two bytes");
        let all = store.list(&Query::all()).unwrap();
        assert_eq!(
            census.highest_fence,
            all.iter().map(|r| r.entry.fence).max().unwrap()
        );
        let oldest = census.oldest_claim.expect("claims not finished");
        assert_eq!((oldest.scope.tenant(), oldest.key.as_str()), ("bravo", "stale"));
        let stale = all.iter().find(|r| r.key == "stale").unwrap();
        assert_eq!((oldest.fence, oldest.claimed_at), (stale.entry.fence, stale.entry.claimed_at));
    }

    fn a_scan_tells_every_status_apart_and_filters_by_each_field(b: Backend) {
        let clock = ManualClock::new();
        let store = b.open(Store::builder().lease(LEASE).ttl(TTL).clock(clock.clone()));
        let _held = every_status(&store, &clock);
        // A file hands records over in fence order, PostgreSQL in key order.
        let sorted = |mut records: Vec<idemdb::ListedRecord>| {
            records.sort_by_key(|r| r.entry.fence);
            records
        };
        let all = sorted(store.list(&Query::all()).unwrap());
        let statuses: Vec<(String, RecordStatus)> =
            all.iter().map(|r| (r.key.clone(), r.status)).collect();
        assert_eq!(
            statuses,
            [
                ("expired".into(), RecordStatus::Expired),
                ("stale".into(), RecordStatus::Stale),
                ("completed".into(), RecordStatus::Completed),
                ("orphan".into(), RecordStatus::Orphan),
                ("in-progress".into(), RecordStatus::InProgress),
            ]
        );
        let completed = &all[2];
        let EntryState::Completed { response, .. } = &completed.entry.state else {
            panic!("{completed:?}")
        };
        assert_eq!(response.body(), [0xff, 0x00]);
        assert_eq!(response.headers(), [("x-id".to_owned(), b"7".to_vec())]);

        let keys = |q: Query| -> Vec<String> {
            sorted(store.list(&q).unwrap()).into_iter().map(|r| r.key).collect()
        };
        assert_eq!(keys(Query::all().tenant("bravo")), ["stale", "orphan"]);
        assert_eq!(
            keys(Query::all().endpoint("POST /pay")),
            ["expired", "completed", "in-progress"]
        );
        assert_eq!(
            keys(Query::all().status(RecordStatus::Stale).status(RecordStatus::Orphan)),
            ["stale", "orphan"]
        );
        assert_eq!(keys(Query::all().status(RecordStatus::Expired)), ["expired"]);
        assert_eq!(keys(Query::all().tenant("acme").limit(5)).len(), 3);
        assert_eq!(keys(Query::all().tenant("acme").limit(2)).len(), 2);
        assert_eq!(keys(Query::all().limit(0)), Vec::<String>::new());
        let in_progress = all[4].entry.claimed_at;
        assert_eq!(
            keys(Query::all().claimed_before(in_progress)),
            ["expired", "stale", "completed", "orphan"]
        );
        assert_eq!(keys(Query::all().tenant("nobody")), Vec::<String>::new());

        // A callback that breaks stops the scan, and the count says how many it was handed.
        let mut seen = 0;
        let handed = store
            .scan(&Query::all(), |_| {
                seen += 1;
                if seen == 2 {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            })
            .unwrap();
        assert_eq!((seen, handed), (2, 2));
    }
}

/// Each completion here follows its claim at once, so its claim's fence ascends with the fence
/// it is stored at.
#[test]
fn a_file_scan_hands_records_over_in_fence_order() {
    let (store, clock) = store();
    let _held = every_status(&store, &clock);
    let fences: Vec<u64> = store
        .list(&Query::all())
        .unwrap()
        .iter()
        .map(|r| r.entry.fence)
        .collect();
    assert_eq!(fences.len(), 5);
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
}

/// A completion is stored at a fence of its own, taken when it completes, so a file hands
/// completions over in the order they completed, each with its claim's fence (what its ticket
/// and `get` say), and claims in progress in the order they were claimed. Before, the listing
/// named the fence a completion was stored at, not its claim's.
#[test]
fn a_file_scan_hands_completions_over_in_the_order_they_completed_with_their_claims_fences() {
    let (store, _clock) = store();
    let a = Scope::new("acme", "POST /pay");
    let first = acquire(&store, &a, "first");
    let second = acquire(&store, &a, "second");
    let held = acquire(&store, &a, "held");
    let (first_fence, second_fence) = (first.fence(), second.fence());
    store.complete(second, Response::new(201, "2")).unwrap();
    store.complete(first, Response::new(201, "1")).unwrap();
    let listed: Vec<(String, u64)> = store
        .list(&Query::all())
        .unwrap()
        .into_iter()
        .map(|r| (r.key, r.entry.fence))
        .collect();
    let expect = [
        ("held".to_string(), held.fence()),
        ("second".to_string(), second_fence),
        ("first".to_string(), first_fence),
    ];
    assert_eq!(listed, expect);
    for (key, fence) in &listed {
        assert_eq!(store.get(&a, key).unwrap().unwrap().fence, *fence, "{key}");
    }
}

#[test]
fn a_scan_sees_what_purge_and_release_removed_as_gone() {
    let (store, clock) = store();
    let held = every_status(&store, &clock);
    assert_eq!(store.purge_expired().unwrap(), 1);
    for ticket in held {
        store.release(ticket).unwrap();
    }
    let keys: Vec<String> = store
        .list(&Query::all())
        .unwrap()
        .into_iter()
        .map(|r| r.key)
        .collect();
    assert_eq!(keys, ["completed", "orphan"]);
}

#[test]
fn a_scan_may_call_the_store_from_its_callback() {
    let (store, clock) = store();
    let _held = every_status(&store, &clock);
    let mut answers = Vec::new();
    store
        .scan(&Query::all().status(RecordStatus::Completed), |record| {
            answers.push(store.get(&record.scope, &record.key).unwrap().is_some());
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(answers, [true]);
}

#[test]
fn an_import_into_a_new_file_answers_every_claim_as_the_exported_store_did() {
    let dir = tempfile::tempdir().unwrap();
    let (old, clock) = store();
    let _held = every_status(&old, &clock);
    let mut lines = Vec::new();
    assert_eq!(
        old.export(&mut lines).unwrap(),
        4,
        "the expired record is not exported"
    );
    let path = dir.path().join("new.idem");
    let (new, n) = Store::builder()
        .lease(LEASE)
        .clock(clock.clone())
        .import_new(&path, lines.as_slice())
        .unwrap();
    assert_eq!(n, 4);
    let listed = |s: &Store| -> Vec<(String, u64, RecordStatus)> {
        s.list(&Query::all())
            .unwrap()
            .into_iter()
            .map(|r| (r.key, r.entry.fence, r.status))
            .collect()
    };
    let mut expected: Vec<_> = listed(&old)
        .into_iter()
        .filter(|(_, _, s)| *s != RecordStatus::Expired)
        // Claims arrive without their holders: every one is an orphan.
        .map(|(k, f, s)| {
            (
                k,
                f,
                if s.is_claim() {
                    RecordStatus::Orphan
                } else {
                    s
                },
            )
        })
        .collect();
    expected.sort_by_key(|(_, f, _)| *f);
    assert_eq!(listed(&new), expected);
    let a = Scope::new("acme", "POST /pay");
    let Claim::Replay(r) = new
        .claim(&a, "completed", Fingerprint::of(b"completed"))
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(r.body(), [0xff, 0x00]);
    // New fences continue above every imported one.
    let highest = expected.iter().map(|(_, f, _)| *f).max().unwrap();
    let t = acquire(&new, &a, "fresh");
    assert!(t.fence() > highest);
    new.complete(t, Response::new(201, "x")).unwrap();
    drop(new);
    // The file is a store like any other: it reopens with everything.
    let reopened = Store::builder().clock(clock).open(&path).unwrap();
    assert_eq!(reopened.list(&Query::all()).unwrap().len(), 5);
}

#[test]
fn an_import_refuses_an_existing_file_a_key_twice_and_a_bad_line_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (old, clock) = store();
    let _held = every_status(&old, &clock);
    let mut lines = Vec::new();
    old.export(&mut lines).unwrap();
    let text = String::from_utf8(lines).unwrap();

    let existing = dir.path().join("existing.idem");
    drop(Store::open(&existing).unwrap());
    let err = Store::builder()
        .import_new(&existing, text.as_bytes())
        .unwrap_err();
    assert!(matches!(err, Error::InvalidImport { .. }), "{err}");
    assert!(Store::open(&existing)
        .unwrap()
        .list(&Query::all())
        .unwrap()
        .is_empty());

    let twice = format!("{text}{}\n", text.lines().next().unwrap());
    let path = dir.path().join("twice.idem");
    let err = Store::builder()
        .import_new(&path, twice.as_bytes())
        .unwrap_err();
    assert!(matches!(err, Error::InvalidImport { .. }), "{err}");
    assert!(!path.exists());

    let bad = format!("{text}{{\"v\":1}}\n");
    let err = Store::builder()
        .import_new(&path, bad.as_bytes())
        .unwrap_err();
    assert!(matches!(err, Error::InvalidImport { line: 5, .. }), "{err}");
    assert!(!path.exists());
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(
        leftovers.len(),
        3,
        "only existing.idem, its journal and its reserve: {leftovers:?}"
    );
}

/// `Store::import` exists only with feature `postgres`; with it, a file store still refuses.
#[cfg(feature = "postgres")]
#[test]
fn an_open_file_store_refuses_an_import() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("s.idem")).unwrap();
    let err = store.import(&b""[..]).unwrap_err();
    assert!(matches!(err, Error::InvalidImport { .. }), "{err}");
}

#[test]
fn records_deleted_while_a_scan_runs_are_left_out_and_the_scan_goes_on() {
    // A scan reads the records a thousand at a time (1024), each chunk in its own snapshot:
    // what a purge deletes after the first chunk was read is left out, without an error, and
    // the records after it are still handed over.
    let (store, clock) = store();
    let scope = Scope::new("acme", "POST /pay");
    let complete = |range: std::ops::Range<u32>| {
        for i in range {
            let t = acquire(&store, &scope, &format!("k{i}"));
            store.complete(t, Response::new(200, "ok")).unwrap();
        }
    };
    complete(0..2000);
    clock.advance(Duration::from_secs(10));
    complete(2000..3000);
    let mut purged = None;
    let handed = store
        .scan(&Query::all().status(RecordStatus::Completed), |_| {
            if purged.is_none() {
                clock.advance(TTL - Duration::from_secs(5)); // the first 2000 expire
                purged = Some(store.purge_expired().unwrap());
            }
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(purged, Some(2000));
    assert_eq!(
        handed,
        1024 + 1000,
        "the first chunk, read before the purge, then the last 1000"
    );
}
