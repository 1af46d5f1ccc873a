//! Stores damaged outside idemdb, kept as files under `tests/damage-cases/`: each must be
//! refused with a typed error, or served with every acknowledged answer right. Never served
//! wrong, never changed by the refused open.

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
    for check in [PageCheck::Trust, PageCheck::Trust, PageCheck::Verify] {
        match Store::builder().page_check(check).open(&path) {
            Err(Error::Corrupted {
                damaged: Damaged::Pages,
                reason,
            }) => {
                if check == PageCheck::Trust {
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
