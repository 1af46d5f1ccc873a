//! Durability and fail-stop tests on the simulated disk: what `claim` and `complete` promise is
//! checked against the durable image alone, as a power loss would leave it.

use crate::simulation::{CrashImage, SimDisk};
use crate::{Claim, Damaged, Error, Fingerprint, Response, Scope, Store, StoreBuilder};

fn open(disk: &SimDisk) -> Store {
    StoreBuilder::default()
        .open_simulated(disk)
        .expect("open on the simulated disk")
}

fn scope() -> Scope {
    Scope::new("tenant", "POST /v1/payments")
}

fn fp() -> Fingerprint {
    Fingerprint::of(b"amount=5000")
}

fn acquire(store: &Store, key: &str) -> crate::Ticket {
    match store.claim(&scope(), key, fp()).unwrap() {
        Claim::Acquired(t) => t,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

#[test]
fn acquired_claim_is_in_the_durable_image_when_claim_returns() {
    let disk = SimDisk::new();
    let store = open(&disk);
    let syncs = disk.syncs();
    let ticket = acquire(&store, "k1");
    assert!(disk.syncs() > syncs, "claim returned without an fsync");
    drop(ticket);
    drop(store);
    disk.crash(CrashImage::Durable);
    let store = open(&disk);
    assert!(matches!(
        store.claim(&scope(), "k1", fp()).unwrap(),
        Claim::InProgress { .. }
    ));
}

/// An open that finds nothing in the journal commits nothing: its epoch goes on (before, every
/// open checkpointed, two durable commits), and what the next life writes into that epoch
/// survives a power loss and is checkpointed by the open after it.
#[test]
fn an_open_that_finds_the_journal_empty_goes_on_in_its_epoch_and_loses_nothing() {
    let disk = SimDisk::new();
    let pay = |store: &Store, key: &str| {
        let ticket = acquire(store, key);
        store.complete(ticket, Response::new(201, key)).unwrap();
    };
    let store = open(&disk);
    pay(&store, "k0");
    drop(store);
    let epoch = file_meta(&disk).journal_epoch;
    drop(open(&disk));
    assert_eq!(
        file_meta(&disk).journal_epoch,
        epoch,
        "a life without a write"
    );
    let store = open(&disk);
    pay(&store, "k1");
    // The power is cut with k1 only in the journal, in the epoch the open went on in.
    let crashed = disk.fork();
    crashed.crash(CrashImage::Durable);
    drop(store);
    assert_eq!(file_meta(&crashed).journal_epoch, epoch);
    let store = open(&crashed);
    for key in ["k0", "k1"] {
        match store.claim(&scope(), key, fp()).unwrap() {
            Claim::Replay(r) => assert_eq!(r.body(), key.as_bytes()),
            other => panic!("{key}: {other:?}"),
        }
    }
    drop(store);
    assert_eq!(
        file_meta(&crashed).journal_epoch,
        epoch + 1,
        "k1 replayed and checkpointed"
    );
}

/// An open that finds the journal empty but makes it longer (a larger `journal_size`) still
/// checkpoints, so that the store file records the new length: a journal later cut back to
/// the old one must be refused, and the entries written past it read back. Without the
/// checkpoint the file would go on saying the old length.
#[test]
fn an_open_that_lengthens_an_empty_journal_records_the_new_length() {
    let disk = SimDisk::new();
    let small = 16 << 10;
    let store = StoreBuilder::default()
        .journal_size(small)
        .open_simulated(&disk)
        .unwrap();
    drop(acquire(&store, "k0"));
    drop(store);
    assert_eq!(file_meta(&disk).journal_bytes, small);
    let epoch = file_meta(&disk).journal_epoch;
    let store = StoreBuilder::default()
        .journal_size(4 * small)
        .open_simulated(&disk)
        .unwrap();
    assert_eq!(file_meta(&disk).journal_bytes, 4 * small);
    assert_eq!(file_meta(&disk).journal_epoch, epoch + 1);
    drop(store);
}

#[test]
fn completion_is_in_the_durable_image_when_complete_returns() {
    let disk = SimDisk::new();
    let store = open(&disk);
    let ticket = acquire(&store, "k1");
    let response = Response::new(201, "paid").with_header("x-id", "1");
    store.complete(ticket, response.clone()).unwrap();
    drop(store);
    disk.crash(CrashImage::Durable);
    let store = open(&disk);
    match store.claim(&scope(), "k1", fp()).unwrap() {
        Claim::Replay(r) => assert_eq!(r, response),
        other => panic!("expected Replay, got {other:?}"),
    }
}

#[test]
fn release_is_in_the_durable_image_when_release_returns() {
    let disk = SimDisk::new();
    let store = open(&disk);
    let ticket = acquire(&store, "k1");
    store.release(ticket).unwrap();
    drop(store);
    disk.crash(CrashImage::Durable);
    let store = open(&disk);
    let _ticket = acquire(&store, "k1");
}

#[test]
fn fences_never_repeat_across_a_power_loss() {
    let disk = SimDisk::new();
    let store = open(&disk);
    let mut fences: Vec<u64> = (0..5)
        .map(|i| acquire(&store, &format!("k{i}")).fence())
        .collect();
    // A released claim leaves no record: only the meta high-water mark remembers its fence.
    let last = acquire(&store, "released");
    fences.push(last.fence());
    store.release(last).unwrap();
    drop(store);
    disk.crash(CrashImage::Durable);
    let store = open(&disk);
    let next = acquire(&store, "after").fence();
    assert!(
        next > *fences.iter().max().unwrap(),
        "fence {next} reissued after crash (before: {fences:?})"
    );
}

/// A failed fsync must not leave the index claiming what the disk does not hold, and the store
/// must stop rather than guess.
#[test]
fn failed_sync_fails_the_claim_and_halts_the_store() {
    let disk = SimDisk::new();
    let store = open(&disk);
    let held = acquire(&store, "before");
    disk.fail_sync_after(0, true);
    let err = store.claim(&scope(), "k1", fp()).unwrap_err();
    assert!(matches!(err, Error::Io(_) | Error::Storage(_)), "{err:?}");
    for result in [
        store.claim(&scope(), "k2", fp()).map(|_| ()),
        store.get(&scope(), "k1").map(|_| ()),
        store.complete(held, Response::new(200, "")),
        store.purge_expired().map(|_| ()),
        store.reap(|_| crate::Resolution::Keep).map(|_| ()),
    ] {
        match result {
            Err(Error::Halted { cause }) => assert!(!cause.is_empty()),
            other => panic!("expected Halted, got {other:?}"),
        }
    }
    assert!(Error::Halted { cause: "x".into() }
        .to_string()
        .contains("reopen"));
    drop(store);
    disk.crash(CrashImage::Durable);
    let store = open(&disk);
    // The failed claim was never acknowledged; the disk does not hold it.
    assert!(store.get(&scope(), "k1").unwrap().is_none());
    let _ticket = acquire(&store, "k1");
    assert!(store.get(&scope(), "before").unwrap().is_some());
}

#[test]
fn failed_write_fails_the_completion_and_keeps_the_claim_on_disk() {
    let disk = SimDisk::new();
    let store = open(&disk);
    let ticket = acquire(&store, "k1");
    disk.fail_write_after(0, true);
    assert!(store.complete(ticket, Response::new(200, "ok")).is_err());
    assert!(matches!(
        store.claim(&scope(), "k1", fp()),
        Err(Error::Halted { .. })
    ));
    drop(store);
    disk.crash(CrashImage::Durable);
    let store = open(&disk);
    // Still the acknowledged in-progress claim, never a completion the disk does not hold.
    match store.get(&scope(), "k1").unwrap().unwrap().state {
        crate::EntryState::InProgress { orphan, .. } => assert!(orphan),
        other => panic!("expected in progress, got {other:?}"),
    }
}

#[test]
fn concurrent_claims_share_commits() {
    let disk = SimDisk::new();
    let store = open(&disk);
    let syncs = disk.syncs();
    let threads = 16;
    let per_thread = 20;
    std::thread::scope(|s| {
        for t in 0..threads {
            let store = store.clone();
            s.spawn(move || {
                for i in 0..per_thread {
                    let _ticket = acquire(&store, &format!("t{t}-k{i}"));
                }
            });
        }
    });
    let stats = store.stats();
    assert_eq!(stats.acquired, threads * per_thread);
    assert!(stats.commit_batches <= stats.acquired);
    assert!(disk.syncs() - syncs >= 1);
}

/// Regression: a replay whose record vanished from the file (index and file disagree) looped
/// forever in `claim`, looking again and again. It must report corruption instead.
#[test]
fn replay_of_a_record_missing_from_the_file_is_corruption_not_a_hang() {
    use crate::file::index::{Slot, SlotState};
    let store = Store::in_memory().unwrap();
    #[allow(irrefutable_let_patterns)]
    let crate::engine::Engine::File(healing) = &store.engine
    else {
        unreachable!("an in-memory store is a file engine")
    };
    let file = healing.current();
    let key = file
        .inner
        .index
        .key(crate::model::scope::scoped_key(&scope(), "ghost").unwrap());
    let tag = file.inner.index.tag(&fp());
    file.inner.index.lock(&key.hash).insert(
        key.hash,
        Slot::new(
            999,
            tag,
            SlotState::Completed {
                expires_at: u64::MAX,
                durable: true,
            },
        ),
    );
    match store.claim(&scope(), "ghost", fp()) {
        Err(Error::Corrupted {
            damaged:
                Damaged::Record {
                    fence: Some(999),
                    key: Some(key),
                },
            ..
        }) => {
            assert!(key.contains("ghost"), "{key}");
        }
        other => panic!("expected Corrupted, got {other:?}"),
    }
    assert!(matches!(
        store.get(&scope(), "ghost"),
        Err(Error::Corrupted { .. })
    ));
}

/// A journaled batch is answered once the journal is synced, before the applier thread has put
/// it into redb. A replay in that window must wait for the apply: read from the file behind the
/// answer, it would find the record still in progress (or absent), and call the file corrupted.
#[test]
fn a_replay_between_the_answer_and_the_apply_waits_for_the_apply() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store.idem")).unwrap();
    #[allow(irrefutable_let_patterns)]
    let crate::engine::Engine::File(healing) = &store.engine
    else {
        unreachable!("a store on a file is a file engine")
    };
    let file = healing.current();
    let ticket = acquire(&store, "k1");
    let response = Response::new(201, "paid").with_header("x-id", "1");
    let gate = file.inner.pipeline.apply_gate.lock();
    store.complete(ticket, response.clone()).unwrap();
    let replay = std::thread::spawn({
        let store = store.clone();
        move || store.claim(&scope(), "k1", fp())
    });
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(
        !replay.is_finished(),
        "the replay answered while redb did not hold the completion"
    );
    drop(gate);
    match replay.join().unwrap() {
        Ok(Claim::Replay(r)) => assert_eq!(r, response),
        other => panic!("expected the stored response, got {other:?}"),
    }
}

/// A checkpoint makes the journal's entries dead, so it must come after redb holds every
/// earlier batch: a checkpoint that overtook the applier would raise the epoch over batches the
/// file lacks, and a crash after it would lose them, answered as they were. With the applier
/// held, claims that fill a 4 KiB journal wait; none checkpoints until the applier catches up.
#[test]
fn a_checkpoint_waits_until_every_earlier_batch_is_applied() {
    let dir = tempfile::tempdir().unwrap();
    let store = StoreBuilder::default()
        .journal_size(4096)
        .open(dir.path().join("store.idem"))
        .unwrap();
    #[allow(irrefutable_let_patterns)]
    let crate::engine::Engine::File(healing) = &store.engine
    else {
        unreachable!("a store on a file is a file engine")
    };
    let file = healing.current();
    let pipeline = &file.inner.pipeline;
    let gate = pipeline.apply_gate.lock();
    std::mem::forget(acquire(&store, "first"));
    let filler = std::thread::spawn({
        let store = store.clone();
        move || {
            for i in 0..60 {
                std::mem::forget(acquire(&store, &format!("k{i}")));
            }
        }
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(
        pipeline.checkpoints(),
        0,
        "a checkpoint ran while an answered batch was not yet applied"
    );
    assert!(!filler.is_finished(), "the journal never filled");
    drop(gate);
    filler.join().unwrap();
    assert!(pipeline.checkpoints() >= 1);
    for i in 0..60 {
        assert!(matches!(
            store.claim(&scope(), &format!("k{i}"), fp()).unwrap(),
            Claim::InProgress { .. }
        ));
    }
}

/// Regression (found by the `open_file` fuzz target): a file whose fence reservation (or a
/// record's fence) was at `u64::MAX` made the open overflow the fence counter: a panic in debug
/// builds, and in release a counter that wraps and reissues fences. It is now `Corrupted`.
#[test]
fn a_fence_near_u64_max_is_corruption_not_an_overflow() {
    for fence in [u64::MAX, crate::file::layout::MAX_FENCE + 1] {
        let disk = SimDisk::new();
        drop(open(&disk));
        {
            let db = redb::Builder::new()
                .create_with_backend(disk.backend())
                .unwrap();
            let txn = db.begin_write().unwrap();
            txn.open_table(crate::file::layout::META)
                .unwrap()
                .insert(crate::file::layout::FENCE_KEY, fence)
                .unwrap();
            txn.commit().unwrap();
        }
        match StoreBuilder::default().open_simulated(&disk) {
            Err(Error::Corrupted {
                damaged: Damaged::Meta,
                reason,
            }) => assert!(reason.contains("fence"), "{reason}"),
            other => panic!("fence {fence}: expected Corrupted, got {other:?}"),
        }
    }
}

/// Regression (found by the `open_file` fuzz target): redb 4.6 panics on some damaged pages
/// during a clean open (here: a zeroed page under the tables). The open must return a typed
/// error instead of taking the service down.
#[test]
fn damaged_pages_are_an_error_not_a_panic() {
    let disk = SimDisk::new();
    {
        let store = open(&disk);
        for i in 0..200 {
            let t = acquire(&store, &format!("k{i}"));
            store
                .complete(t, Response::new(200, vec![7u8; 300]))
                .unwrap();
        }
    }
    let image = disk.image();
    let mut opened_ok = 0;
    let mut refused = 0;
    // Zero each 4 KiB page past the header in turn; every open must return, never panic.
    for page in 1..image.len() / 4096 {
        let mut damaged = image.clone();
        damaged[page * 4096..(page + 1) * 4096].fill(0);
        let disk = SimDisk::from_image(damaged);
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            StoreBuilder::default().open_simulated(&disk).map(drop)
        })) {
            Ok(Ok(())) => opened_ok += 1,
            Ok(Err(_)) => refused += 1,
            Err(_) => panic!("opening with page {page} zeroed panicked"),
        }
    }
    assert!(
        refused > 0,
        "zeroed pages went unnoticed ({opened_ok} opened)"
    );
}

/// Regression (found by the `open_file` fuzz target, `redb-panic-escapes-complete-after-open`):
/// redb panicked inside a commit on a damaged page, and the panic escaped `complete` into the
/// caller. A panic in the commit now fails the batch and halts the store like any failed
/// commit, and nothing it did not hold is acknowledged.
#[test]
fn a_panic_inside_a_commit_fails_the_call_and_halts_the_store() {
    let disk = SimDisk::new();
    let store = open(&disk);
    let ticket = acquire(&store, "k1");
    disk.panic_on_write_after(0);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        store.complete(ticket, Response::new(200, "paid"))
    }));
    match result {
        Ok(Err(Error::Corrupted { reason, .. })) => assert!(reason.contains("panic"), "{reason}"),
        other => panic!("expected Err(Corrupted), got {other:?}"),
    }
    assert!(matches!(
        store.claim(&scope(), "k2", fp()),
        Err(Error::Halted { .. })
    ));
    drop(store);
    disk.crash(CrashImage::Durable);
    let store = open(&disk);
    assert!(matches!(
        store.get(&scope(), "k1").unwrap().unwrap().state,
        crate::EntryState::InProgress { orphan: true, .. }
    ));
}

/// A panic inside redb while a claim reads a record (redb panics on some damaged pages it had
/// not read before) reaches the caller as `Corrupted`, never as a panic, and the store that saw
/// it closes without a second panic (its file is leaked, not dropped).
#[test]
fn a_panic_inside_a_read_is_a_corrupted_error_not_a_panic() {
    let disk = SimDisk::new();
    {
        let store = open(&disk);
        let ticket = acquire(&store, "k1");
        store.complete(ticket, Response::new(200, "paid")).unwrap();
    }
    // No cache of any kind: the replay must read the record from the file.
    let store = StoreBuilder::default()
        .cache_size(0)
        .replay_cache_size(0)
        .open_simulated(&disk)
        .unwrap();
    disk.panic_on_read();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        store.claim(&scope(), "k1", fp())
    }));
    match result {
        Ok(Err(Error::Corrupted { reason, .. })) => assert!(reason.contains("panic"), "{reason}"),
        Ok(other) => panic!("expected Err(Corrupted), got {other:?}"),
        Err(_) => panic!("a panic inside redb escaped the claim"),
    }
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(store)));
    assert!(dropped.is_ok(), "no panic escapes the store's drop");
}

/// The open splits the file into fence ranges scanned by one thread each (unit tests lower the
/// threshold to four records): every record must land in the index exactly once, in its state,
/// and the fence counter must resume above all of them.
#[test]
fn a_parallel_open_loads_every_record_in_its_state() {
    use crate::EntryState;
    let disk = SimDisk::new();
    let store = open(&disk);
    let mut fences = Vec::new();
    for i in 0..200 {
        let ticket = acquire(&store, &format!("k{i}"));
        fences.push(ticket.fence());
        match i % 4 {
            0 => store.release(ticket).unwrap(),
            1 => store
                .complete(ticket, Response::new(200, format!("r{i}")))
                .unwrap(),
            _ => drop(ticket),
        }
    }
    drop(store);
    let store = open(&disk);
    assert_eq!(store.record_count().unwrap(), 150);
    for (i, &fence) in fences.iter().enumerate() {
        let entry = store.get(&scope(), &format!("k{i}")).unwrap();
        match (i % 4, entry) {
            (0, None) => {}
            (1, Some(e)) => {
                assert_eq!(e.fence, fence);
                let EntryState::Completed { response, .. } = e.state else {
                    panic!("k{i}: {:?}", e.state)
                };
                assert_eq!(response.body(), format!("r{i}").as_bytes());
            }
            (_, Some(e)) => {
                assert_eq!(e.fence, fence);
                assert!(matches!(
                    e.state,
                    EntryState::InProgress { orphan: true, .. }
                ));
            }
            (_, other) => panic!("k{i}: {other:?}"),
        }
    }
    let next = acquire(&store, "after");
    assert!(next.fence() > *fences.iter().max().unwrap());
}

/// Replays read through a cache by fence. A key that expires and is claimed and completed again
/// gets a new fence, so its old cached response can never be replayed for the new record; and a
/// hit still compares the full fingerprint.
#[test]
fn the_replay_cache_never_serves_a_replaced_record_or_another_request() {
    use crate::ManualClock;
    use std::time::Duration;
    let clock = ManualClock::new();
    let store = StoreBuilder::default()
        .ttl(Duration::from_secs(10))
        .clock(clock.clone())
        .in_memory()
        .unwrap();
    let replay = |store: &Store| match store.claim(&scope(), "k", fp()).unwrap() {
        Claim::Replay(r) => r,
        other => panic!("expected Replay, got {other:?}"),
    };
    store
        .complete(acquire(&store, "k"), Response::new(200, "first"))
        .unwrap();
    assert_eq!(replay(&store).body(), b"first"); // read from the file, cached
    assert_eq!(replay(&store).body(), b"first"); // from the cache
    assert_eq!(store.stats().replays, 2);
    assert!(matches!(
        store
            .claim(&scope(), "k", Fingerprint::of(b"other"))
            .unwrap(),
        Claim::Mismatch { completed: true }
    ));
    clock.advance(Duration::from_secs(11));
    store
        .complete(acquire(&store, "k"), Response::new(201, "second"))
        .unwrap();
    let again = replay(&store);
    assert_eq!((again.status(), again.body()), (201, &b"second"[..]));
}

/// Open refuses a file holding two records for one key, whichever stripe batch or scan thread
/// meets the second one.
#[test]
fn two_records_for_one_key_refuse_the_open() {
    use crate::file::layout::RECORDS;
    use crate::file::record::Record;
    use redb::ReadableTable;
    let disk = SimDisk::new();
    let store = open(&disk);
    let fence = acquire(&store, "k").fence();
    for i in 0..20 {
        drop(acquire(&store, &format!("other{i}")));
    }
    drop(store);
    drop(open(&disk)); // the close checkpointed the journal into the file; this life changes nothing
    {
        let db = redb::Builder::new()
            .create_with_backend(disk.backend())
            .unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut records = txn.open_table(RECORDS).unwrap();
            let value = records.get(fence).unwrap().unwrap().value().to_vec();
            let (key, mut record) = Record::decode(&value).unwrap();
            record.fence = fence + 1000;
            let copy = record.encode(key, crate::file::record::Packing::Plain);
            records.insert(fence + 1000, copy.as_slice()).unwrap();
        }
        crate::file::layout::write_record_count(&txn).unwrap();
        txn.commit().unwrap();
    }
    match StoreBuilder::default().open_simulated(&disk) {
        Err(Error::Corrupted {
            damaged: Damaged::Record { key: Some(key), .. },
            reason,
        }) => {
            assert!(reason.contains("two records for one key"), "{reason}");
            assert!(key.contains('k'), "{key}");
        }
        other => panic!("expected Corrupted, got {other:?}"),
    }
}

/// A store of known contents for the heads tests: `n` completed keys, `n` claims in progress
/// (orphans after the reopen), closed cleanly so that everything is in the store file.
fn store_with_heads(disk: &SimDisk, n: usize) {
    let store = open(disk);
    for i in 0..n {
        let ticket = acquire(&store, &format!("done{i}"));
        store
            .complete(ticket, Response::new(201, format!("paid {i}")))
            .unwrap();
        std::mem::forget(acquire(&store, &format!("held{i}")));
    }
    drop(store);
}

/// Every key of [`store_with_heads`] answers as it was left: replays byte for byte, held
/// claims in progress, and a key never claimed is free.
fn check_heads_store(store: &Store, n: usize) {
    for i in 0..n {
        match store.claim(&scope(), &format!("done{i}"), fp()).unwrap() {
            Claim::Replay(r) => assert_eq!(r.body(), format!("paid {i}").as_bytes()),
            other => panic!("done{i}: {other:?}"),
        }
        assert!(
            matches!(
                store.claim(&scope(), &format!("held{i}"), fp()).unwrap(),
                Claim::InProgress { .. }
            ),
            "held{i}"
        );
    }
    static NEW_KEYS: crate::sync::AtomicUsize = crate::sync::AtomicUsize::new(0);
    let new = NEW_KEYS.fetch_add(1, crate::sync::Ordering::Relaxed);
    match store.claim(&scope(), &format!("never{new}"), fp()) {
        Ok(Claim::Acquired(_)) => {}
        other => panic!("a key never claimed: {other:?}"),
    }
}

/// Changes the store file on `disk` directly through redb, as damage or an older build would.
/// Edits the file with redb, as damage that also keeps `record_count` in step with the records
/// table would (to reach the defenses behind the count; see
/// `a_records_table_shorter_than_its_count_is_refused` for the count itself).
fn edit_file(disk: &SimDisk, edit: impl FnOnce(&redb::WriteTransaction)) {
    edit_file_keeping_count(disk, edit, true);
}

fn edit_file_keeping_count(
    disk: &SimDisk,
    edit: impl FnOnce(&redb::WriteTransaction),
    count: bool,
) {
    let db = redb::Builder::new()
        .create_with_backend(disk.backend())
        .unwrap();
    let txn = db.begin_write().unwrap();
    edit(&txn);
    if count {
        crate::file::layout::write_record_count(&txn).unwrap();
    }
    txn.commit().unwrap();
}

/// The records table reading fewer records than the store counted at its last commit (damage
/// to the table's pages or its definition, as in `tests/damage_cases.rs`) refuses the open,
/// whatever the heads say, and changes nothing: before format 5 a lost record under a damaged
/// head was rebuilt away, and its key ran again.
#[test]
fn a_records_table_shorter_than_its_count_is_refused() {
    let disk = SimDisk::new();
    store_with_heads(&disk, 20);
    lose_the_first_record(&disk, false);
    for _ in 0..2 {
        match StoreBuilder::default().open_simulated(&disk) {
            Err(Error::Corrupted {
                damaged: Damaged::Pages,
                reason,
            }) => assert!(
                reason.contains("the records table holds 39 records, and the store recorded 40"),
                "{reason}"
            ),
            other => panic!("a record lost from the table must refuse the open, got {other:?}"),
        }
    }
}

/// Deletes the record of the lowest fence with redb, as damage to the records table would,
/// keeping `record_count` in step with it (`count`) or not; returns its fence.
fn lose_the_first_record(disk: &SimDisk, count: bool) -> u64 {
    use crate::file::layout::RECORDS;
    use redb::ReadableTable;
    let mut lost = 0;
    edit_file_keeping_count(
        disk,
        |txn| {
            let mut records = txn.open_table(RECORDS).unwrap();
            lost = records.first().unwrap().unwrap().0.value();
            records.remove(lost).unwrap();
        },
        count,
    );
    lost
}

fn file_meta(disk: &SimDisk) -> crate::file::layout::Meta {
    let db = redb::Builder::new()
        .create_with_backend(disk.backend())
        .unwrap();
    crate::file::layout::meta(&db).unwrap()
}

fn heads_in_file(disk: &SimDisk) -> (u64, u64) {
    use crate::file::heads::HEADS;
    use crate::file::layout::RECORDS;
    use redb::{ReadableDatabase, ReadableTableMetadata};
    let db = redb::Builder::new()
        .create_with_backend(disk.backend())
        .unwrap();
    let txn = db.begin_read().unwrap();
    let heads = txn.open_table(HEADS).unwrap().len().unwrap();
    let records = txn.open_table(RECORDS).unwrap().len().unwrap();
    (heads, records)
}

/// A file of store format 2 (no heads, no secret) opens, is upgraded in place to the current
/// format in one durable commit (heads written, the `expiry` table dropped), and answers every
/// key as before; the upgrade survives a power loss.
#[test]
fn a_format_2_file_is_upgraded_at_its_first_open_and_answers_as_before() {
    use crate::file::heads::HEADS;
    use crate::file::layout::{FORMAT_KEY, META, SECRET_KEYS, STORE_FORMAT};
    let disk = SimDisk::new();
    store_with_heads(&disk, 40);
    edit_file(&disk, |txn| {
        txn.delete_table(HEADS).unwrap();
        format_3_expiry_table(txn, 40);
        let mut meta = txn.open_table(META).unwrap();
        meta.insert(FORMAT_KEY, 2).unwrap();
        for key in SECRET_KEYS {
            meta.remove(key).unwrap();
        }
    });
    assert_eq!(file_meta(&disk).format, 2);
    let store = open(&disk);
    check_heads_store(&store, 40);
    drop(store);
    assert_eq!(file_meta(&disk).format, STORE_FORMAT);
    assert_eq!(heads_in_file(&disk), (81, 81), "a head for every record");
    assert!(!table_names(&disk).contains(&"expiry".to_owned()));
    disk.crash(CrashImage::Durable);
    check_heads_store(&open(&disk), 40);
}

/// What a build of store format 3 or below kept besides the records and heads: an `expiry`
/// entry per completion, `expires_at << 64 | fence` to the scoped key (the contents no longer
/// matter; only that the table is there).
fn format_3_expiry_table(txn: &redb::WriteTransaction, completions: u64) {
    const EXPIRY: redb::TableDefinition<u128, &[u8]> = redb::TableDefinition::new("expiry");
    let mut expiry = txn.open_table(EXPIRY).unwrap();
    for fence in 1..=completions {
        expiry
            .insert(u128::from(fence), b"tenant/key".as_slice())
            .unwrap();
    }
}

fn table_names(disk: &SimDisk) -> Vec<String> {
    use redb::{ReadableDatabase, TableHandle};
    let db = redb::Builder::new()
        .create_with_backend(disk.backend())
        .unwrap();
    let txn = db.begin_read().unwrap();
    let names = txn.list_tables().unwrap();
    names.map(|t| t.name().to_owned()).collect()
}

/// Completes `done0`..`done9` with 201 "paid", leaves `held` in progress, and closes the store.
/// Each of [`ten_paid_and_one_held`]'s completions replays.
fn replays_the_ten_paid(store: &Store) {
    for i in 0..10 {
        match store.claim(&scope(), &format!("done{i}"), fp()).unwrap() {
            Claim::Replay(r) => assert_eq!(r.body(), b"paid"),
            other => panic!("done{i}: {other:?}"),
        }
    }
}

fn ten_paid_and_one_held(store: Store) {
    for i in 0..10 {
        let ticket = acquire(&store, &format!("done{i}"));
        store.complete(ticket, Response::new(201, "paid")).unwrap();
    }
    std::mem::forget(acquire(&store, "held"));
    drop(store);
}

/// Found by the damage sweep with a random seed: one flipped bit in `meta`'s hash
/// secret, which carries no checksum of its own, left every head's hash under the old secret;
/// the open built the index without an error and every stored key was then claimed afresh.
#[test]
fn a_damaged_hash_secret_rebuilds_the_heads_instead_of_forgetting_every_key() {
    use crate::file::layout::{META, SECRET_KEYS};
    use redb::ReadableTable;
    let disk = SimDisk::new();
    let open = || StoreBuilder::default().open_simulated(&disk).unwrap();
    let store = open();
    ten_paid_and_one_held(store);
    edit_file(&disk, |txn| {
        let mut meta = txn.open_table(META).unwrap();
        let k0 = meta.get(SECRET_KEYS[0]).unwrap().unwrap().value();
        meta.insert(SECRET_KEYS[0], k0 ^ (1 << 17)).unwrap();
    });
    let store = open();
    for i in 0..10 {
        match store.claim(&scope(), &format!("done{i}"), fp()).unwrap() {
            Claim::Replay(r) => assert_eq!(r.body(), b"paid"),
            other => panic!("done{i} answered {other:?}"),
        }
    }
    assert!(matches!(
        store.claim(&scope(), "held", fp()).unwrap(),
        Claim::InProgress { .. }
    ));
}

/// A file of store format 3 (the `expiry` table listing every completion, from which a purge
/// read what was due) opens, is upgraded to format 4 in one durable commit that drops the
/// table, answers every key as before, and still purges what expires: a purge now finds the
/// due records in the index. (Without the upgrade an older build's file would keep a table
/// nothing maintains; without the index scan nothing would ever be purged.)
#[test]
fn a_format_3_file_drops_its_expiry_table_at_its_first_open_and_still_purges() {
    use crate::file::layout::{FORMAT_KEY, META, STORE_FORMAT};
    use crate::ManualClock;
    use std::time::Duration;
    let disk = SimDisk::new();
    let clock = ManualClock::new();
    let open = || {
        StoreBuilder::default()
            .clock(clock.clone())
            .open_simulated(&disk)
            .unwrap()
    };
    let store = open();
    ten_paid_and_one_held(store);
    edit_file(&disk, |txn| {
        format_3_expiry_table(txn, 10);
        txn.open_table(META).unwrap().insert(FORMAT_KEY, 3).unwrap();
    });
    assert_eq!(file_meta(&disk).format, 3);
    assert!(table_names(&disk).contains(&"expiry".to_owned()));
    let store = open();
    replays_the_ten_paid(&store);
    drop(store);
    disk.crash(CrashImage::Durable);
    assert_eq!(file_meta(&disk).format, STORE_FORMAT);
    assert!(!table_names(&disk).contains(&"expiry".to_owned()));
    let store = open();
    clock.advance(Duration::from_secs(25 * 3600));
    assert_eq!(store.purge_expired().unwrap(), 10);
    assert_eq!(store.record_count().unwrap(), 1, "the held claim stays");
    assert!(matches!(
        store.claim(&scope(), "done0", fp()).unwrap(),
        Claim::Acquired(_)
    ));
}

/// A file of format 4 (no record count) opens as before, is upgraded in place to format 5 at
/// that open (the count written in one durable commit), answers every key as before, and from
/// then on a record lost from its table is refused.
#[test]
fn a_format_4_file_is_counted_at_its_first_open_and_then_guarded_by_its_count() {
    use crate::file::layout::{FORMAT_KEY, META, RECORD_COUNT_KEY, STORE_FORMAT};
    let disk = SimDisk::new();
    ten_paid_and_one_held(open(&disk));
    edit_file_keeping_count(
        &disk,
        |txn| {
            let mut meta = txn.open_table(META).unwrap();
            meta.insert(FORMAT_KEY, 4).unwrap();
            meta.remove(RECORD_COUNT_KEY).unwrap();
        },
        false,
    );
    assert_eq!(file_meta(&disk).format, 4);
    assert_eq!(file_meta(&disk).record_count, None);
    let store = open(&disk);
    replays_the_ten_paid(&store);
    drop(store);
    disk.crash(CrashImage::Durable);
    assert_eq!(file_meta(&disk).format, STORE_FORMAT);
    assert_eq!(file_meta(&disk).record_count, Some(11));
    drop(open(&disk));
    lose_the_first_record(&disk, false);
    assert!(matches!(
        StoreBuilder::default().open_simulated(&disk),
        Err(Error::Corrupted {
            damaged: Damaged::Pages,
            ..
        })
    ));
}

/// Every record's stored value in the store file, in fence order.
fn record_values(disk: &SimDisk) -> Vec<Vec<u8>> {
    use crate::file::layout::RECORDS;
    use redb::{ReadableDatabase, ReadableTable};
    let db = redb::Builder::new()
        .create_with_backend(disk.backend())
        .unwrap();
    let txn = db.begin_read().unwrap();
    let records = txn.open_table(RECORDS).unwrap();
    let values = records.iter().unwrap();
    values.map(|r| r.unwrap().1.value().to_vec()).collect()
}

/// Every record's format byte in the store file, in fence order.
fn record_formats(disk: &SimDisk) -> Vec<u8> {
    record_values(disk).iter().map(|v| v[0]).collect()
}

/// Rewrites the store on `disk` as a store of `format` (5 or 6) would hold it: every record
/// at its claim's fence, of record format 1 for format 5.
fn as_claim_placed_format(disk: &SimDisk, format: u64) {
    use crate::file::batch::head_of;
    use crate::file::hashing::Hashing;
    use crate::file::heads::HEADS;
    use crate::file::layout::{FORMAT_KEY, META, RECORDS};
    use crate::file::record::{format1, Packing, Record};
    use redb::ReadableTable;
    let hashing = Hashing::new(file_meta(disk).secret.unwrap());
    edit_file_keeping_count(
        disk,
        |txn| {
            let mut records = txn.open_table(RECORDS).unwrap();
            let mut heads = txn.open_table(HEADS).unwrap();
            let all: Vec<(u64, Vec<u8>)> = records
                .iter()
                .unwrap()
                .map(|r| r.map(|(k, v)| (k.value(), v.value().to_vec())).unwrap())
                .collect();
            for (place, value) in all {
                let (key, record) = Record::decode(&value).unwrap();
                let old = match format {
                    5 => format1::encode(&record, key),
                    _ => record.encode(key, Packing::Plain),
                };
                records.remove(place).unwrap();
                heads.remove(place).unwrap();
                records.insert(record.fence, old.as_slice()).unwrap();
                let head = head_of(&hashing, record.fence, &old).unwrap();
                heads.insert(record.fence, head).unwrap();
            }
            txn.open_table(META)
                .unwrap()
                .insert(FORMAT_KEY, format)
                .unwrap();
        },
        false,
    );
    assert_eq!(file_meta(disk).format, format);
}

/// Each record's claim's fence and the fence it is stored at, in the order they are stored.
fn record_places(disk: &SimDisk) -> Vec<(u64, u64)> {
    use crate::file::record::Record;
    let values = record_values(disk);
    let placed = values.iter().map(|v| Record::decode_placed(v).unwrap());
    placed
        .map(|(_, record, place)| (record.fence, place))
        .collect()
}

/// A store of format 5 holds records of record format 1 only. Its first open reads them as
/// they are and writes the current store format (after which an older build refuses the file
/// rather than fail on each newer record); what it writes then is of record format 2, and the
/// two kinds answer side by side, across a power loss. Without the decoder of format 1 kept,
/// every stored key would be `Corrupted`; without the format written, a format-5 build would
/// open the file and answer `Corrupted` for every record written since.
#[test]
fn a_format_5_file_keeps_its_format_1_records_and_writes_format_2_beside_them() {
    use crate::file::layout::STORE_FORMAT;
    let disk = SimDisk::new();
    ten_paid_and_one_held(open(&disk));
    as_claim_placed_format(&disk, 5);
    assert_eq!(record_formats(&disk), vec![1; 11]);
    let store = open(&disk);
    replays_the_ten_paid(&store);
    assert!(matches!(
        store.claim(&scope(), "held", fp()).unwrap(),
        Claim::InProgress { .. }
    ));
    let ticket = acquire(&store, "new");
    store.complete(ticket, Response::new(201, "paid")).unwrap();
    drop(store);
    disk.crash(CrashImage::Durable);
    assert_eq!(file_meta(&disk).format, STORE_FORMAT);
    let mut formats = record_formats(&disk);
    assert_eq!(formats.pop(), Some(2), "the new record");
    assert_eq!(formats, vec![1; 11]);
    let store = open(&disk);
    replays_the_ten_paid(&store);
    match store.claim(&scope(), "new", fp()).unwrap() {
        Claim::Replay(r) => assert_eq!(r.body(), b"paid"),
        other => panic!("new: {other:?}"),
    }
}

/// A store of format 6 holds every completion at its claim's fence. Its first open reads them
/// there and writes store format 7, after which completions are stored apart, at fences of
/// their own (which a format-6 build would take for damage, so it refuses the file); old and
/// new completions answer side by side, across a power loss.
#[test]
fn a_format_6_file_keeps_its_completions_in_place_and_stores_new_ones_apart() {
    use crate::file::layout::STORE_FORMAT;
    let disk = SimDisk::new();
    ten_paid_and_one_held(open(&disk));
    as_claim_placed_format(&disk, 6);
    let before = record_places(&disk);
    assert!(before.iter().all(|(fence, place)| fence == place));
    let store = open(&disk);
    replays_the_ten_paid(&store);
    let ticket = acquire(&store, "new");
    let fence = ticket.fence();
    store.complete(ticket, Response::new(201, "paid")).unwrap();
    drop(store);
    disk.crash(CrashImage::Durable);
    assert_eq!(file_meta(&disk).format, STORE_FORMAT);
    let mut after = record_places(&disk);
    let (claimed, placed) = after.pop().unwrap();
    assert_eq!(claimed, fence, "the new completion names its claim's fence");
    assert!(placed > fence, "and is stored apart, at {placed}");
    assert_eq!(after, before, "the old records stay where they were");
    let store = open(&disk);
    replays_the_ten_paid(&store);
    match store.claim(&scope(), "new", fp()).unwrap() {
        Claim::Replay(r) => assert_eq!(r.body(), b"paid"),
        other => panic!("new: {other:?}"),
    }
    assert_eq!(store.get(&scope(), "new").unwrap().unwrap().fence, fence);
}

/// A store that compresses responses and one that does not open the same file: every record
/// says how its response is stored, so each reads what the other wrote, byte for byte.
#[test]
fn compressed_and_plain_responses_read_back_whichever_store_wrote_them() {
    let disk = SimDisk::new();
    let charge = |i: u32| {
        format!("{{\"id\":\"ch_{i}\",\"object\":\"charge\",\"status\":\"succeeded\"}}").repeat(8)
    };
    for (round, compress) in [(0, true), (1, false), (2, true)] {
        let store = StoreBuilder::default()
            .compress_responses(compress)
            .open_simulated(&disk)
            .unwrap();
        let ticket = acquire(&store, &format!("k{round}"));
        store
            .complete(
                ticket,
                Response::new(200, charge(round)).with_header("content-type", "application/json"),
            )
            .unwrap();
        for earlier in 0..=round {
            match store.claim(&scope(), &format!("k{earlier}"), fp()).unwrap() {
                Claim::Replay(r) => {
                    assert_eq!(r.body(), charge(earlier).as_bytes());
                    assert_eq!(r.status(), 200);
                }
                other => panic!("k{earlier}: {other:?}"),
            }
        }
        drop(store);
        disk.crash(CrashImage::Durable);
    }
    let sizes: Vec<usize> = record_values(&disk).iter().map(Vec::len).collect();
    assert!(sizes[0] < sizes[1] / 2, "compressed: {sizes:?}");
    assert_eq!(sizes[0], sizes[2]);
}

/// Heads are derived from the records: one that fails its checksum, one missing, or a table
/// gone make the open rebuild them from the records, and every key answers as before. (Without
/// the rebuild, a key whose head is wrong would be absent from the index, and its retry would
/// run the side effect again.)
#[test]
fn damaged_or_missing_heads_are_rebuilt_from_the_records() {
    use crate::file::heads::{HEADS, HEAD_BYTES};
    use redb::ReadableTable;
    type Edit = Box<dyn Fn(&redb::WriteTransaction)>;
    let edits: Vec<(&str, Edit)> = vec![
        (
            "a flipped byte",
            Box::new(|txn| {
                let mut heads = txn.open_table(HEADS).unwrap();
                let (fence, mut bytes) = {
                    let (k, v) = heads.first().unwrap().unwrap();
                    (k.value(), v.value())
                };
                bytes[3] ^= 1;
                heads.insert(fence, bytes).unwrap();
            }),
        ),
        (
            "a head missing",
            Box::new(|txn| {
                let mut heads = txn.open_table(HEADS).unwrap();
                let fence = heads.last().unwrap().unwrap().0.value();
                heads.remove(fence).unwrap();
            }),
        ),
        (
            "the table gone",
            Box::new(|txn| {
                txn.delete_table(HEADS).unwrap();
            }),
        ),
        (
            "a head moved to another fence",
            Box::new(|txn| {
                let mut heads = txn.open_table(HEADS).unwrap();
                let (fence, bytes): (u64, [u8; HEAD_BYTES]) = {
                    let (k, v) = heads.first().unwrap().unwrap();
                    (k.value(), v.value())
                };
                heads.remove(fence).unwrap();
                heads.insert(fence + 100_000, bytes).unwrap();
            }),
        ),
    ];
    for (what, edit) in edits {
        let disk = SimDisk::new();
        store_with_heads(&disk, 30);
        edit_file(&disk, |txn| edit(txn));
        let store = open(&disk);
        check_heads_store(&store, 30);
        drop(store);
        assert_eq!(heads_in_file(&disk), (61, 61), "{what}");
    }
}

/// A record missing under a head that passes its checksum is lost data, not a damaged heads
/// table: the open refuses, names it, and keeps the heads (a rebuild from the records would
/// forget it, and its key would run again). See also `tests/damage_cases.rs`.
#[test]
fn a_record_missing_under_a_valid_head_is_refused_not_rebuilt_away() {
    let disk = SimDisk::new();
    store_with_heads(&disk, 30);
    let lost = lose_the_first_record(&disk, true);
    for _ in 0..2 {
        match StoreBuilder::default().open_simulated(&disk) {
            Err(Error::Corrupted {
                damaged: Damaged::Pages,
                reason,
            }) => assert!(
                reason.contains(&format!(
                    "holds 1 records that the records table lacks (fences {lost})"
                )),
                "{reason}"
            ),
            other => panic!("a lost record must refuse the open, got {other:?}"),
        }
    }
}

/// A `meta` table naming a journal epoch no store reaches is damage, refused at open. (Found
/// by the `open_file` fuzzer: `journal_epoch` = 2^64 - 1 overflowed the checkpoint's epoch + 1.)
#[test]
fn a_journal_epoch_beyond_any_store_is_refused_not_overflowed() {
    use crate::file::layout::{JOURNAL_EPOCH_KEY, META};
    for epoch in [u64::MAX, (1 << 62) + 1] {
        let disk = SimDisk::new();
        store_with_heads(&disk, 2);
        edit_file(&disk, |txn| {
            txn.open_table(META)
                .unwrap()
                .insert(JOURNAL_EPOCH_KEY, epoch)
                .unwrap();
        });
        match StoreBuilder::default().open_simulated(&disk) {
            Err(Error::Corrupted {
                damaged: Damaged::Meta,
                reason,
            }) => assert!(reason.contains("journal epoch"), "{reason}"),
            other => panic!("journal_epoch {epoch}: {:?}", other.map(|_| "opened")),
        }
    }
}

/// After a crash, redb's open loads the allocator state that the last checkpoint (a durable
/// commit with quick-repair) recorded, instead of repairing: walking and checksumming every page
/// of the file, which took 5.8 s for a 1M-record store with a cold page cache. The journaled
/// batches after that checkpoint never reached the file's header, so they do not void it.
#[test]
fn an_open_after_a_crash_loads_the_allocator_state_and_does_not_repair() {
    use crate::sync::{Arc, AtomicBool, Ordering};
    let disk = SimDisk::new();
    let store = StoreBuilder::default()
        .journal_size(16 << 10)
        .open_simulated(&disk)
        .unwrap();
    for i in 0..300 {
        let ticket = acquire(&store, &format!("k{i}"));
        store
            .complete(ticket, Response::new(201, format!("paid {i}")))
            .unwrap();
    }
    let checkpoints = store.stats().checkpoints;
    assert!(checkpoints > 2, "{checkpoints} checkpoints");
    // Claims after the last checkpoint, in the journal only: the crash comes before the next.
    let held = acquire(&store, "held");
    assert_eq!(store.stats().checkpoints, checkpoints);
    let crashed = disk.fork();
    crashed.crash(CrashImage::Durable);
    drop((held, store));
    let repaired = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&repaired);
    let db = redb::Builder::new()
        .set_repair_callback(move |_| seen.store(true, Ordering::Relaxed))
        .create_with_backend(crashed.backend())
        .unwrap();
    drop(db);
    assert!(!repaired.load(Ordering::Relaxed), "redb repaired the file");
    let store = open(&crashed);
    for i in [0, 150, 299] {
        match store.claim(&scope(), &format!("k{i}"), fp()).unwrap() {
            Claim::Replay(r) => assert_eq!(r.body(), format!("paid {i}").as_bytes()),
            other => panic!("k{i}: {other:?}"),
        }
    }
    assert!(matches!(
        store.claim(&scope(), "held", fp()).unwrap(),
        Claim::InProgress { .. }
    ));
}

/// A record rewritten with a valid checksum so that it disagrees with its head (another
/// fingerprint; in progress where the head says completed) is damage: a read of it is a typed
/// error, never an answer that contradicts the claim's, and never a read that looks again
/// forever. (Found by the `open_file` fuzzer: `get` returned the record's fingerprint while
/// `claim`, answering from the head, called that fingerprint a mismatch.)
#[test]
fn a_record_that_disagrees_with_its_head_is_an_error_not_an_answer_or_a_spin() {
    use crate::file::layout::RECORDS;
    use crate::file::record::{Record, RecordState};
    use redb::ReadableTable;
    type Lie = fn(&mut Record);
    let lies: [(&str, &str, Lie); 3] = [
        ("done0", "another fingerprint", |r| r.fingerprint[0] ^= 1),
        ("held0", "another fingerprint", |r| {
            r.fingerprint[31] ^= 0x80
        }),
        ("done0", "in progress, the head completed", |r| {
            r.state = RecordState::InProgress { lease_until: 1 }
        }),
    ];
    for (key, what, lie) in lies {
        let disk = SimDisk::new();
        store_with_heads(&disk, 3);
        edit_file(&disk, |txn| {
            let mut records = txn.open_table(RECORDS).unwrap();
            let found: Vec<(u64, Vec<u8>)> = records
                .iter()
                .unwrap()
                .map(|e| {
                    let (k, v) = e.unwrap();
                    (k.value(), v.value().to_vec())
                })
                .filter(|(_, v)| {
                    Record::unverified_key(v).is_some_and(|k| k.ends_with(key.as_bytes()))
                })
                .collect();
            let [(fence, value)] = found.as_slice() else {
                panic!("{key}: one record, found {}", found.len())
            };
            let (scoped, mut record) = Record::decode(value).unwrap();
            let scoped = scoped.to_vec();
            lie(&mut record);
            records
                .insert(
                    *fence,
                    record
                        .encode(&scoped, crate::file::record::Packing::Plain)
                        .as_slice(),
                )
                .unwrap();
        });
        let store = open(&disk);
        let damaged = |r: crate::Result<Option<crate::Entry>>| {
            matches!(
                r,
                Err(Error::Corrupted {
                    damaged: Damaged::Record { .. },
                    ..
                })
            )
        };
        assert!(damaged(store.get(&scope(), key)), "{key}, {what}: get");
        match store.claim(&scope(), key, fp()) {
            // The head answers without reading the record when the tags differ.
            Ok(Claim::Mismatch { .. } | Claim::InProgress { .. }) if key == "held0" => {}
            Err(Error::Corrupted { .. }) => {}
            other => panic!("{key}, {what}: claim got {other:?}"),
        }
        // Every other key still answers.
        for i in 1..3 {
            match store.claim(&scope(), &format!("done{i}"), fp()).unwrap() {
                Claim::Replay(r) => assert_eq!(r.body(), format!("paid {i}").as_bytes()),
                other => panic!("done{i}: {other:?}"),
            }
        }
    }
}

/// The open reads heads, not records: with every record's bytes damaged past its checksum, the
/// open still succeeds, and each damaged record is a typed error when a request needs it.
#[test]
fn an_open_reads_no_record_and_a_damaged_one_is_an_error_when_read() {
    use crate::file::layout::RECORDS;
    let disk = SimDisk::new();
    store_with_heads(&disk, 5);
    edit_file(&disk, |txn| {
        let mut records = txn.open_table(RECORDS).unwrap();
        let all: Vec<(u64, Vec<u8>)> = redb::ReadableTable::iter(&records)
            .unwrap()
            .map(|e| {
                let (k, v) = e.unwrap();
                (k.value(), v.value().to_vec())
            })
            .collect();
        for (fence, mut value) in all {
            let last = value.len() - 1;
            value[last] ^= 0xff; // the record's CRC
            records.insert(fence, value.as_slice()).unwrap();
        }
    });
    let store = open(&disk);
    match store.claim(&scope(), "done0", fp()) {
        Err(Error::Corrupted {
            damaged: Damaged::Record { .. },
            ..
        }) => {}
        other => panic!("expected Corrupted naming a record, got {other:?}"),
    }
    assert!(matches!(
        store.claim(&scope(), "held0", fp()).unwrap(),
        Claim::InProgress { .. }
    ));
}

/// Regression: the last `Store` dropped while the healer thread held the store (after a
/// successful attempt, before the thread returned) returned at once, and the healer closed the
/// store later, on its own thread. A caller reopening the file meanwhile had two redb handles
/// writing it: the heal tests failed now and then with "File truncated below stored layout"
/// after a power loss, the stale handle's header over the new one's pages. The drop now stops
/// and joins the healer, so nothing writes the disk once it returns.
#[test]
fn dropping_the_last_store_while_the_healer_holds_it_closes_the_file_before_drop_returns() {
    use crate::file::heal::HOLD_HEALER;
    use crate::sync::Ordering;
    use std::time::{Duration, Instant};
    let disk = SimDisk::new();
    let store = StoreBuilder::default()
        .heal_after(Some(Duration::from_millis(1)))
        .open_simulated(&disk)
        .unwrap();
    std::mem::forget(acquire(&store, "before"));
    HOLD_HEALER.store(true, Ordering::Release);
    disk.fail_sync_after(0, true);
    assert!(store.claim(&scope(), "during", fp()).is_err());
    disk.clear_faults();
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.get(&scope(), "before").is_err() {
        assert!(Instant::now() < deadline, "the store did not heal");
        std::thread::sleep(Duration::from_millis(1));
    }
    // Healed; the healer thread is held with the store in hand.
    let release = std::thread::spawn(|| {
        std::thread::sleep(Duration::from_millis(100));
        HOLD_HEALER.store(false, Ordering::Release);
    });
    drop(store);
    let events = disk.events();
    release.join().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        disk.events(),
        events,
        "the disk was written after the last Store's drop returned"
    );
    assert!(open(&disk).get(&scope(), "before").unwrap().is_some());
}

/// A key re-claimed after it expired, between a purge's scan of the index and its deletions,
/// keeps its new claim: the purge deletes a record only if its slot is still the one it read.
/// (Without the check the purge would drop the new claim's slot from the index, and a retry of
/// the key would be `Acquired` while the first attempt's side effect runs.)
#[test]
fn a_key_reclaimed_between_a_purges_scan_and_its_delete_keeps_its_new_claim() {
    use crate::file::maintenance::BETWEEN_PURGE_SCAN_AND_DELETE;
    use crate::ManualClock;
    use std::time::Duration;
    let disk = SimDisk::new();
    let clock = ManualClock::new();
    let store = StoreBuilder::default()
        .ttl(Duration::from_secs(60))
        .clock(clock.clone())
        .open_simulated(&disk)
        .unwrap();
    for key in ["again", "other"] {
        let ticket = acquire(&store, key);
        store.complete(ticket, Response::new(201, "paid")).unwrap();
    }
    clock.advance(Duration::from_secs(61));
    let reclaiming = store.clone();
    BETWEEN_PURGE_SCAN_AND_DELETE.with(|h| {
        *h.borrow_mut() = Some(Box::new(move || {
            std::mem::forget(acquire(&reclaiming, "again"));
        }));
    });
    assert_eq!(store.purge_expired().unwrap(), 1, "only `other` is purged");
    assert!(matches!(
        store.claim(&scope(), "again", fp()).unwrap(),
        Claim::InProgress { .. }
    ));
    drop(store);
    disk.crash(CrashImage::Durable);
    let reopened = StoreBuilder::default()
        .ttl(Duration::from_secs(60))
        .clock(clock)
        .open_simulated(&disk)
        .unwrap();
    let claim = reopened.claim(&scope(), "again", fp()).unwrap();
    assert!(matches!(claim, Claim::InProgress { .. }), "{claim:?}");
}

/// The applier waits out its pace (`APPLY_PACE`) between transactions only while nobody needs
/// what it holds back. With the pace an hour long, a replay (a read of the file), a checkpoint
/// (a full journal) and a close must each still get the backlog applied at once: each of them
/// waiting out the pace would hang here, which the deadlines catch.
#[test]
fn a_read_a_checkpoint_and_a_close_do_not_wait_out_the_applier_pace() {
    use std::sync::mpsc;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.idem");
    let store = StoreBuilder::default()
        .journal_size(4096)
        .open(&path)
        .unwrap();
    #[allow(irrefutable_let_patterns)]
    let crate::engine::Engine::File(healing) = &store.engine
    else {
        unreachable!("a store on a file is a file engine")
    };
    healing
        .current()
        .inner
        .pipeline
        .set_apply_pace(std::time::Duration::from_secs(3600));
    let deadline = std::time::Duration::from_secs(60);
    let within = |what: &str, work: Box<dyn FnOnce() + Send>| {
        let (done, finished) = mpsc::channel();
        std::thread::spawn(move || {
            work();
            let _ = done.send(());
        });
        assert!(
            finished.recv_timeout(deadline).is_ok(),
            "{what} waited for the applier's pace"
        );
    };
    let response = Response::new(201, "paid");
    for i in 0..3 {
        let ticket = acquire(&store, &format!("paid{i}"));
        store.complete(ticket, response.clone()).unwrap();
    }
    within("a replay", {
        let store = store.clone();
        let response = response.clone();
        Box::new(move || match store.claim(&scope(), "paid1", fp()) {
            Ok(Claim::Replay(r)) => assert_eq!(r, response),
            other => panic!("expected the stored response, got {other:?}"),
        })
    });
    within("claims that fill the journal", {
        let store = store.clone();
        Box::new(move || {
            for i in 0..60 {
                std::mem::forget(acquire(&store, &format!("k{i}")));
            }
        })
    });
    let file = healing.current();
    assert!(
        file.inner.pipeline.checkpoints() >= 1,
        "the journal never filled"
    );
    drop(file);
    let ticket = acquire(&store, "last");
    store.complete(ticket, response.clone()).unwrap();
    within("a close", Box::new(move || drop(store)));
    let reopened = Store::open(&path).unwrap();
    match reopened.claim(&scope(), "last", fp()).unwrap() {
        Claim::Replay(r) => assert_eq!(r, response),
        other => panic!("expected the stored response, got {other:?}"),
    }
}
