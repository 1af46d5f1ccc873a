//! The batch writer: one batch of ops in one redb write transaction, each record with its
//! head, the fence reservation raised ahead of the fences written, committed as the caller
//! says (durably, as a checkpoint, or without a sync for a journaled batch).

use crate::error::Result;
use crate::file::hashing::Hashing;
use crate::file::heads::{StoredHead, HEADS, HEAD_BYTES};
use crate::file::index::Slot;
use crate::file::layout::FENCE_BLOCK;
use crate::file::layout::FENCE_KEY;
use crate::file::layout::JOURNAL_BYTES_KEY;
use crate::file::layout::JOURNAL_EPOCH_KEY;
use crate::file::layout::JOURNAL_HEADER_KEY;
use crate::file::layout::META;
use crate::file::layout::RECORDS;
use crate::file::layout::RECORD_COUNT_KEY;
use crate::file::read::decode_head_at;
use redb::{Database, ReadableTableMetadata};

/// One durable mutation, applied in queue order. Ops on one key are queued under that key's
/// stripe lock, so the disk sees them in the order the index made them; no op needs to re-check
/// state on disk.
#[derive(Debug)]
pub(crate) enum Op {
    /// Writes the record at `fence`: a new claim, in place (extend, a resolver's completion),
    /// or a completion at a fence of its own.
    Put {
        fence: u64,
        value: Vec<u8>,
        /// The record's expiry (a completion).
        expiry: Option<u64>,
        /// The record this one replaces (an expired or taken-over claim of the same key, or the
        /// claim a completion completes), deleted in the same transaction so no crash can leave
        /// the key with neither.
        replaces: Option<Gone>,
        /// The first write of `fence` ever (a new claim's, or a completion's own): the file
        /// holds nothing at `fence` before it. A later op of the same transaction that deletes
        /// it then finds nothing to delete, and skips both tables' B-tree descents (see
        /// [`moot`]). False where unknown: the journal does not record it, so a replayed op
        /// always deletes.
        fresh: bool,
    },
    /// Deletes a record (release, reap, purge).
    Delete(Gone),
}

/// A record to delete, by its fence.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gone {
    pub(crate) fence: u64,
}

impl Gone {
    pub(crate) fn of(slot: &Slot) -> Gone {
        Gone {
            fence: slot.fence(),
        }
    }
}

/// Makes `txn`'s commit record redb's allocator state, with a two-phase commit (two `fsync`s
/// instead of one). redb's open trusts that state only if the last commit on disk recorded it;
/// otherwise, after a crash, it rebuilds it by reading every page of the file (5.8 s for a
/// 1M-record store with a cold page cache, against 0.2 s). Non-durable commits never reach the
/// header on disk, so only the durable ones need it.
pub(crate) fn quick_repair(txn: &mut redb::WriteTransaction) {
    txn.set_quick_repair(true);
}

/// How a batch is committed to the redb file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Commit {
    /// `Durability::Immediate`: redb writes the pages, then `fsync`s (`fdatasync(2)` on Linux)
    /// before `commit` returns. For a store without a journal.
    Durable,
    /// A durable commit that also raises the journal epoch to `epoch` and records the journal
    /// file's length: a checkpoint.
    Checkpoint { epoch: u64, journal_bytes: u64 },
    /// A durable commit recording that the journal's header names `epoch` (after a checkpoint).
    HeaderWritten { epoch: u64 },
    /// `Durability::None`: visible to readers at once, durable at the next durable commit. Only
    /// for a batch the journal already holds.
    Journaled,
}

/// What the batch writer keeps of the file between batches.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FileState {
    /// The fence reservation in the file.
    pub(crate) reserved: u64,
    /// The keys of the hashes each record's head holds.
    pub(crate) hashing: Hashing,
}

/// Writes one batch in one write transaction and commits it as `commit` says, and returns by
/// how much it changed the bytes of the records table's values (see [`Loaded::record_bytes`]).
/// Every record written or deleted has its head written or deleted in the same transaction.
///
/// `file.reserved` is the fence reservation in the file. A batch that writes a fence above it
/// raises it by [`FENCE_BLOCK`] in the same transaction, so every fence in a committed record is
/// at or below the committed reservation, and a reopen resumes above it. It is updated only
/// once the commit succeeded.
pub(crate) fn write_batch(
    db: &Database,
    ops: &[Op],
    file: &mut FileState,
    commit: Commit,
) -> Result<i64> {
    let reserved = &mut file.reserved;
    let mut txn = db.begin_write()?;
    let mut bytes = 0i64;
    match commit {
        Commit::Journaled => txn.set_durability(redb::Durability::None)?,
        // A checkpoint is the last durable commit a crash can leave: recording redb's allocator
        // state in it lets the open after the crash load that state instead of walking every
        // page of the file (see `quick_repair`).
        Commit::Checkpoint { .. } | Commit::HeaderWritten { .. } => quick_repair(&mut txn),
        // Without a journal every batch is durable, and the state would cost a second `fsync`
        // on each: such a store pays the walk after a crash instead.
        Commit::Durable => {}
    }
    let mut high_fence = 0;
    let moot = moot(ops);
    let counted;
    {
        let mut records = txn.open_table(RECORDS)?;
        let mut heads = txn.open_table(HEADS)?;
        let count_before = records.len()?;
        for (i, op) in ops.iter().enumerate() {
            if moot.skip(i) {
                if let Op::Put { fence, .. } = op {
                    high_fence = high_fence.max(*fence);
                }
                continue;
            }
            match op {
                Op::Put {
                    fence,
                    value,
                    replaces,
                    ..
                } => {
                    if let Some(gone) = replaces.filter(|_| !moot.nothing_replaced(i)) {
                        bytes -= delete(&mut records, &mut heads, &gone)?;
                    }
                    heads.insert(*fence, head_of(&file.hashing, *fence, value)?)?;
                    if let Some(old) = records.insert(*fence, value.as_slice())? {
                        bytes -= len_i64(old.value().len());
                    }
                    bytes += len_i64(value.len());
                    high_fence = high_fence.max(*fence);
                }
                Op::Delete(gone) => {
                    bytes -= delete(&mut records, &mut heads, gone)?;
                }
            }
        }
        let count = records.len()?;
        counted = (count != count_before).then_some(count);
    }
    if let Some(count) = counted {
        txn.open_table(META)?.insert(RECORD_COUNT_KEY, count)?;
    }
    let raise = high_fence > *reserved;
    let new_reserved = high_fence.saturating_add(FENCE_BLOCK);
    if raise {
        txn.open_table(META)?.insert(FENCE_KEY, new_reserved)?;
    }
    match commit {
        Commit::Checkpoint {
            epoch,
            journal_bytes,
        } => {
            let mut meta = txn.open_table(META)?;
            meta.insert(JOURNAL_EPOCH_KEY, epoch)?;
            meta.insert(JOURNAL_BYTES_KEY, journal_bytes)?;
        }
        Commit::HeaderWritten { epoch } => {
            txn.open_table(META)?.insert(JOURNAL_HEADER_KEY, epoch)?;
        }
        Commit::Durable | Commit::Journaled => {}
    }
    txn.commit()?;
    if raise {
        *reserved = new_reserved;
    }
    Ok(bytes)
}

/// What a transaction of `ops` may skip: the puts a later op in it makes moot, and the
/// deletions of records it never wrote.
///
/// A put of a claim (no expiry, nothing replaced) is moot when a later op of the transaction
/// writes its fence again (an extension), replaces it (its completion) or deletes it (its
/// release): skipping it saves a record and a head insert per request when the applier takes a
/// claim and its completion in one transaction. If the first write of that fence in the
/// transaction was a [fresh](Op::Put::fresh) one, the file held nothing there before, so the
/// replacing put's deletion (or the release) has nothing to delete either, and is skipped too.
/// Skipping leaves the same tables and the same byte count.
pub(super) fn moot(ops: &[Op]) -> Moot {
    let mut moot = Moot::default();
    if ops.len() < 2 {
        return moot;
    }
    moot.skip = vec![false; ops.len()];
    moot.replaced = vec![false; ops.len()];
    // The fences of the claims not yet moot: the latest put's index, and whether the
    // transaction's first write of the fence was fresh.
    let mut plain: std::collections::HashMap<u64, (usize, bool)> =
        std::collections::HashMap::with_capacity(ops.len());
    for (i, op) in ops.iter().enumerate() {
        let fence = match op {
            Op::Put { fence, .. } | Op::Delete(Gone { fence }) => *fence,
        };
        let earlier = plain.remove(&fence);
        if let Some((earlier, _)) = earlier {
            moot.skip[earlier] = true;
        }
        match op {
            Op::Put {
                replaces: Some(gone),
                ..
            } => {
                if let Some((earlier, fresh)) = plain.remove(&gone.fence) {
                    moot.skip[earlier] = true;
                    moot.replaced[i] = fresh;
                }
            }
            Op::Put {
                expiry: None,
                replaces: None,
                fresh,
                ..
            } => {
                let fresh = earlier.map_or(*fresh, |(_, first)| first);
                plain.insert(fence, (i, fresh));
            }
            Op::Delete(_) => {
                // A release of a claim written fresh in this transaction: nothing to delete.
                if earlier.is_some_and(|(_, fresh)| fresh) {
                    moot.skip[i] = true;
                }
            }
            Op::Put { .. } => {}
        }
    }
    moot
}

/// What [`moot`] found; empty (nothing skipped) for a batch of one op.
#[derive(Debug, Default)]
pub(super) struct Moot {
    /// The ops to skip whole: puts overwritten, deletions of records never written.
    skip: Vec<bool>,
    /// The puts whose replaced record was never written.
    replaced: Vec<bool>,
}

impl Moot {
    fn skip(&self, i: usize) -> bool {
        self.skip.get(i).copied().unwrap_or(false)
    }

    fn nothing_replaced(&self, i: usize) -> bool {
        self.replaced.get(i).copied().unwrap_or(false)
    }
}

/// The head of the record `value` stored at `fence`, whose checksum and place it verifies.
pub(crate) fn head_of(hashing: &Hashing, fence: u64, value: &[u8]) -> Result<[u8; HEAD_BYTES]> {
    let (key, head) = decode_head_at(fence, value)?;
    Ok(StoredHead::of(hashing, key, &head, value.len()).encode(fence))
}

pub(super) fn len_i64(len: usize) -> i64 {
    i64::try_from(len).unwrap_or(i64::MAX)
}

pub(super) fn delete(
    records: &mut redb::Table<'_, u64, &'static [u8]>,
    heads: &mut redb::Table<'_, u64, [u8; HEAD_BYTES]>,
    gone: &Gone,
) -> Result<i64> {
    let removed = records
        .remove(gone.fence)?
        .map_or(0, |old| len_i64(old.value().len()));
    heads.remove(gone.fence)?;
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file::hashing::SipKey;
    use crate::file::layout::{create, RECORDS};
    use crate::file::record::{Record, RecordState, StoredResponse};
    use redb::{ReadableDatabase, ReadableTable};

    fn value(fence: u64, completed: bool) -> Vec<u8> {
        value_at(fence, fence, completed)
    }

    /// The value of the record of the claim `fence`, stored at `place`.
    fn value_at(fence: u64, place: u64, completed: bool) -> Vec<u8> {
        let state = if completed {
            RecordState::Completed {
                completed_at: 2,
                expires_at: 100 + fence,
                response: StoredResponse {
                    status: 201,
                    headers: vec![("x-id".into(), b"1".to_vec())],
                    body: vec![b'r'; 200],
                },
            }
        } else {
            RecordState::InProgress { lease_until: 50 }
        };
        let record = Record {
            fence,
            fingerprint: [7; 32],
            claimed_at: 1,
            state,
        };
        record
            .pack(crate::file::record::Packing::Plain)
            .encode_at(place, &key(fence))
    }

    fn key(fence: u64) -> Box<[u8]> {
        let scope = crate::model::scope::Scope::new("tenant", "POST /x");
        crate::model::scope::scoped_key(&scope, &format!("k{fence}")).unwrap()
    }

    /// A claim (written fresh), or a completion in place (a resolver's: its fence written
    /// before).
    fn put(fence: u64, completed: bool, replaces: Option<Gone>) -> Op {
        Op::Put {
            fence,
            value: value(fence, completed),
            expiry: completed.then_some(100 + fence),
            replaces,
            fresh: !completed,
        }
    }

    /// A claim's lease extended: its fence written before.
    fn extension(fence: u64) -> Op {
        Op::Put {
            fence,
            value: value(fence, false),
            expiry: None,
            replaces: None,
            fresh: false,
        }
    }

    /// The completion of the claim `claim`, stored apart at `place`.
    fn apart(claim: u64, place: u64) -> Op {
        Op::Put {
            fence: place,
            value: value_at(claim, place, true),
            expiry: Some(100 + claim),
            replaces: Some(Gone { fence: claim }),
            fresh: true,
        }
    }

    /// Claims, completions in place and apart, a release and a takeover, in queue order.
    fn ops() -> Vec<Op> {
        let gone = |fence| Gone { fence };
        vec![
            put(1, false, None),
            put(2, false, None),
            put(1, true, None),
            put(3, false, None),
            Op::Delete(gone(2)),
            put(4, false, Some(gone(3))),
            put(4, true, None),
            put(5, false, None),
            put(6, false, None),
            apart(6, 7),
            apart(5, 8),
            put(9, false, None),
            extension(9),
            apart(9, 10),
        ]
    }

    fn tables(db: &Database) -> Vec<String> {
        let txn = db.begin_read().unwrap();
        let mut out = Vec::new();
        for entry in txn.open_table(RECORDS).unwrap().iter().unwrap() {
            let (k, v) = entry.unwrap();
            out.push(format!("record {} {:?}", k.value(), v.value()));
        }
        for entry in txn.open_table(HEADS).unwrap().iter().unwrap() {
            let (k, v) = entry.unwrap();
            out.push(format!("head {} {:?}", k.value(), v.value()));
        }
        out
    }

    fn fresh(secret: SipKey) -> (Database, FileState) {
        let db = redb::Builder::new()
            .create_with_backend(redb::backends::InMemoryBackend::new())
            .unwrap();
        create(&db).unwrap();
        let file = FileState {
            reserved: 0,
            hashing: Hashing::new(secret),
        };
        (db, file)
    }

    /// One transaction that skips the puts its later ops overwrite (a claim and its completion,
    /// a claim and its release) and the deletions of what it never wrote leaves exactly the
    /// tables and byte count that the ops leave one transaction each, and reserves every fence.
    #[test]
    fn a_batch_that_skips_overwritten_puts_leaves_what_the_ops_leave_one_by_one() {
        let ops = ops();
        let moot = moot(&ops);
        let skip: Vec<bool> = (0..ops.len()).map(|i| moot.skip(i)).collect();
        let replaced: Vec<usize> = (0..ops.len())
            .filter(|&i| moot.nothing_replaced(i))
            .collect();
        assert_eq!(
            skip,
            [
                true, true, false, true, true, false, false, true, true, false, false, true, true,
                false
            ],
            "the claims of 1, 2, 3, 5, 6 and 9 are moot (completed, released, taken over, \
             extended); so is 2's release, of a claim written fresh in the batch; 4's first put \
             replaces 3, and is kept"
        );
        assert_eq!(
            replaced,
            [5, 9, 10, 13],
            "the takeover of 3 and the completions of 5, 6 and 9 replace claims first written \
             in the batch"
        );
        let secret = SipKey::random();
        let (together, mut file_together) = fresh(secret);
        let bytes_together = write_batch(&together, &ops, &mut file_together, Commit::Durable);
        let (apart, mut file_apart) = fresh(secret);
        let mut bytes_apart = 0;
        for op in ops {
            bytes_apart += write_batch(&apart, &[op], &mut file_apart, Commit::Durable).unwrap();
        }
        assert_eq!(bytes_together.unwrap(), bytes_apart);
        // The skipped puts' fences are reserved all the same.
        assert!(file_together.reserved >= 10 && file_apart.reserved >= 10);
        assert_eq!(tables(&together), tables(&apart));
    }

    /// A completion or a release skips deleting its claim only when the claim's record was
    /// first written in the same transaction. A claim written by an earlier transaction and
    /// extended in this one (an extension is not fresh) is deleted all the same: skipping it
    /// would leave the key two records, the claim's and the completion's, or keep a released
    /// claim.
    #[test]
    fn a_claim_written_before_the_transaction_is_deleted_though_its_extension_is_moot() {
        let (db, mut file) = fresh(SipKey::random());
        let claims = [put(1, false, None), put(3, false, None)];
        write_batch(&db, &claims, &mut file, Commit::Durable).unwrap();
        let batch = [
            extension(1),
            apart(1, 2),
            extension(3),
            Op::Delete(Gone { fence: 3 }),
        ];
        let moot = moot(&batch);
        assert!(moot.skip(0), "the extension is overwritten");
        assert!(!moot.nothing_replaced(1), "the claim is in the file");
        assert!(moot.skip(2), "the extension is released");
        assert!(!moot.skip(3), "the released claim is in the file");
        write_batch(&db, &batch, &mut file, Commit::Durable).unwrap();
        let rows: Vec<String> = tables(&db)
            .iter()
            .map(|row| row.splitn(3, ' ').take(2).collect::<Vec<_>>().join(" "))
            .collect();
        assert_eq!(rows, ["record 2", "head 2"]);
    }
}
