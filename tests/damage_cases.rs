//! Stores damaged outside idemdb, kept as files under `tests/damage-cases/`: each must be
//! refused with a typed error, or served with every acknowledged answer right. Never served
//! wrong; a refused open writes no record or head (redb's close of the file it opened still
//! records its allocator state, which redb's API does not let a refused open skip).

use idemdb::{Damaged, Error, PageCheck, Store};
use std::path::{Path, PathBuf};

/// The journal's length the store file says it was made with.
const JOURNAL_BYTES: u64 = 16 << 20;

/// A copy of case `name` in a fresh directory: the store file and its journal, whose zero tail
/// (not kept in the repository) is written back.
fn case(name: &str) -> (tempfile::TempDir, PathBuf) {
    let from = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/damage-cases")
        .join(name);
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store.idem");
    std::fs::copy(from.join("store.idem"), &store).unwrap();
    let journal = dir.path().join("store.idem-journal");
    std::fs::copy(from.join("store.idem-journal.head"), &journal).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&journal)
        .unwrap()
        .set_len(JOURNAL_BYTES)
        .unwrap();
    (dir, store)
}

/// Regression: one 8-byte write into redb's table tree made the records table of a cleanly
/// closed store read as empty. The trusting open took the mismatch with the intact heads table
/// for damaged heads, rebuilt them from the empty-looking records, and served an empty store:
/// all 208 acknowledged claims and completions answered as new (every payment would run
/// again), fences started over, and the rebuild erased the heads that showed the loss. A head
/// whose record is missing now refuses the open, whatever the page check, and the heads stay,
/// so every later open refuses too.
#[test]
fn a_closed_store_whose_records_table_reads_empty_is_refused_not_served_empty() {
    let (_dir, path) = case("closed-store-opens-empty");
    assert_eq!(heads(&path), 208);
    for (open, check) in [PageCheck::Trust, PageCheck::Trust, PageCheck::Verify]
        .into_iter()
        .enumerate()
    {
        match Store::builder().page_check(check).open(&path) {
            Err(Error::Corrupted {
                damaged: Damaged::Pages,
                reason,
            }) => {
                // The first open finds the loss; redb's close of that open records its own
                // state, and later opens are refused by redb's check of the damaged page.
                if open == 0 {
                    assert!(
                        reason.contains("208 records that the records table lacks"),
                        "{reason}"
                    );
                }
            }
            Err(other) => panic!("{check:?}: refused, but not as damage: {other}"),
            Ok(store) => panic!(
                "{check:?}: a store that lost its records was served, holding {:?}",
                store.record_count()
            ),
        }
        assert_eq!(
            heads(&path),
            208,
            "{check:?}: the refused open dropped heads"
        );
    }
}

/// The heads in the store file at `path`, read with redb itself.
fn heads(path: &Path) -> u64 {
    use redb::{ReadableDatabase, ReadableTableMetadata, TableDefinition};
    const HEADS: TableDefinition<u64, [u8; 48]> = TableDefinition::new("heads");
    let db = redb::Database::open(path).unwrap();
    let txn = db.begin_read().unwrap();
    let heads = txn.open_table(HEADS).unwrap();
    heads.len().unwrap()
}

/// A store of 40 completed claims, each with a body that names it, closed cleanly.
fn closed_store(dir: &Path) -> PathBuf {
    use idemdb::{Claim, Fingerprint, Response, Scope};
    let path = dir.join("store.idem");
    let store = Store::open(&path).unwrap();
    let scope = Scope::new("acme", "POST /v1/charges");
    for i in 0..40 {
        let key = format!("k{i:03}");
        let Claim::Acquired(ticket) = store.claim(&scope, &key, Fingerprint::of(b"x")).unwrap()
        else {
            panic!("{key} is new")
        };
        let body = format!("charge-body-{i:03}-{}", "x".repeat(200));
        store.complete(ticket, Response::new(201, body)).unwrap();
    }
    drop(store);
    path
}

/// Flips one byte of every occurrence of `needle` in the file at `path` (the live page, and
/// any stale copy of it in free space).
fn flip(path: &Path, needle: &[u8]) {
    let mut bytes = std::fs::read(path).unwrap();
    let at: Vec<usize> = bytes
        .windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle)
        .map(|(i, _)| i)
        .collect();
    assert!(!at.is_empty(), "the needle is in the file");
    for i in at {
        bytes[i] ^= 0x20;
    }
    std::fs::write(path, bytes).unwrap();
}

/// An open that never finished (the process died inside it, as redb does on some damaged
/// pages) leaves `<store>-opening` behind, and the next open verifies every page before it
/// trusts any: a file that would kill a trusting open again is refused with a typed error
/// instead, by the second start at the latest. Here the damage is one that a trusting open does
/// not read (a stored body), so the difference shows without a dying process: trusted, the
/// open serves; with the marker, it is refused, and keeps refusing until the file is fixed.
#[test]
fn an_open_that_never_finished_makes_the_next_verify_every_page() {
    let dir = tempfile::tempdir().unwrap();
    let path = closed_store(dir.path());
    let marker = dir.path().join("store.idem-opening");
    assert!(!marker.exists(), "a finished open leaves no marker");
    flip(&path, b"charge-body-037");
    // Trusting: the open serves (the damaged body is refused when a request reads it).
    drop(Store::open(&path).expect("a trusting open reads no body"));
    assert!(!marker.exists());
    // As after a death inside an open.
    std::fs::write(&marker, "opened by process 1\n").unwrap();
    for _ in 0..2 {
        match Store::open(&path) {
            Err(Error::Corrupted { .. }) => {}
            Err(other) => panic!("refused, but not as damage: {other}"),
            Ok(_) => panic!("an open after an unfinished one trusted a damaged file"),
        }
        assert!(
            marker.exists(),
            "a refused open keeps the marker for the next start"
        );
    }
}

/// The marker is gone once an open succeeds, verified or not; an open refused because another
/// `Store` has the file leaves none, since it says nothing of the file.
#[test]
fn the_open_marker_is_removed_by_a_successful_open_and_left_by_none_that_lost_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let path = closed_store(dir.path());
    let marker = dir.path().join("store.idem-opening");
    std::fs::write(&marker, "opened by process 1\n").unwrap();
    let store = Store::open(&path).expect("an undamaged file passes the verification");
    assert!(!marker.exists(), "a successful open removes the marker");
    assert!(matches!(Store::open(&path), Err(Error::AlreadyOpen)));
    assert!(
        !marker.exists(),
        "an open that lost the lock leaves no marker"
    );
    drop(store);
}
