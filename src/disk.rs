//! The redb file: three tables, the batch writer, and the open-time scan that rebuilds the
//! index. `docs/format.md` documents every byte.

use crate::error::{Error, Result};
use crate::index::{Slot, SlotState};
use crate::record::{Record, RecordState};
use crate::scope::display_scoped_key;
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

/// scoped key -> encoded [`Record`].
pub(crate) const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("records");
/// `expires_at` (u64 BE, ms) ++ scoped key -> (). One entry per completed record, in time
/// order, so a purge reads only what expired.
pub(crate) const EXPIRY: TableDefinition<&[u8], ()> = TableDefinition::new("expiry");
/// Store-wide values: [`FORMAT_KEY`] and [`FENCE_KEY`].
pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// The store format this build writes; a file with another is refused.
pub(crate) const STORE_FORMAT: u64 = 1;
pub(crate) const FORMAT_KEY: &str = "format_version";
/// The fence reservation: no committed record carries a fence above it, and fences issued
/// after a reopen start above it.
pub(crate) const FENCE_KEY: &str = "fence_reserved";

/// One durable mutation, applied in queue order. Ops on one key are queued under that key's
/// stripe lock, so the disk sees them in the order the index made them; no op needs to re-check
/// state on disk.
#[derive(Debug)]
pub(crate) enum Op {
    Put {
        key: Box<[u8]>,
        value: Vec<u8>,
        fence: u64,
        /// The record's new expiry entry (a completion).
        expiry_add: Option<u64>,
        /// The expiry entry of the record this one replaces (re-claiming an expired key).
        expiry_remove: Option<u64>,
    },
    Delete {
        key: Box<[u8]>,
        expiry_remove: Option<u64>,
    },
}

pub(crate) fn expiry_key(expires_at: u64, scoped_key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + scoped_key.len());
    k.extend_from_slice(&expires_at.to_be_bytes());
    k.extend_from_slice(scoped_key);
    k
}

pub(crate) fn split_expiry_key(k: &[u8]) -> Option<(u64, &[u8])> {
    let (t, key) = k.split_at_checked(8)?;
    Some((u64::from_be_bytes(t.try_into().ok()?), key))
}

/// Fences are reserved on disk in blocks of this many, so most batches need not touch `meta`.
/// Unit tests use a tiny block so that they cross block boundaries.
pub(crate) const FENCE_BLOCK: u64 = if cfg!(test) { 4 } else { 1 << 16 };

/// Writes one batch in one write transaction and commits it with `Durability::Immediate`:
/// redb writes the pages, then `fsync`s (`fdatasync(2)` on Linux) before `commit` returns.
///
/// `reserved` is the fence reservation on disk. A batch that writes a fence above it raises it
/// by [`FENCE_BLOCK`] in the same transaction, so every fence in a committed record is at or
/// below the committed reservation, and a reopen resumes above it. It is updated only once the
/// commit succeeded.
pub(crate) fn write_batch(db: &Database, ops: &[Op], reserved: &mut u64) -> Result<()> {
    let txn = db.begin_write()?;
    let mut high_fence = 0;
    {
        let mut records = txn.open_table(RECORDS)?;
        let mut expiry = None;
        for op in ops {
            match op {
                Op::Put {
                    key,
                    value,
                    fence,
                    expiry_add,
                    expiry_remove,
                } => {
                    if let Some(t) = expiry_remove {
                        lazy(&txn, &mut expiry, EXPIRY)?.remove(expiry_key(*t, key).as_slice())?;
                    }
                    records.insert(&**key, value.as_slice())?;
                    if let Some(t) = expiry_add {
                        lazy(&txn, &mut expiry, EXPIRY)?
                            .insert(expiry_key(*t, key).as_slice(), ())?;
                    }
                    high_fence = high_fence.max(*fence);
                }
                Op::Delete { key, expiry_remove } => {
                    if let Some(t) = expiry_remove {
                        lazy(&txn, &mut expiry, EXPIRY)?.remove(expiry_key(*t, key).as_slice())?;
                    }
                    records.remove(&**key)?;
                }
            }
        }
    }
    let raise = high_fence > *reserved;
    let new_reserved = high_fence.saturating_add(FENCE_BLOCK);
    if raise {
        txn.open_table(META)?.insert(FENCE_KEY, new_reserved)?;
    }
    txn.commit()?;
    if raise {
        *reserved = new_reserved;
    }
    Ok(())
}

/// Opens a table the first time a batch needs it: most batches of claims never touch `expiry`.
fn lazy<'s, 't, K: redb::Key + 'static, V: redb::Value + 'static>(
    txn: &'t redb::WriteTransaction,
    slot: &'s mut Option<redb::Table<'t, K, V>>,
    def: TableDefinition<K, V>,
) -> Result<&'s mut redb::Table<'t, K, V>> {
    if slot.is_none() {
        *slot = Some(txn.open_table(def)?);
    }
    Ok(slot.as_mut().expect("just opened"))
}

/// What a scan of the file found: every record's slot and the fence to resume from.
pub(crate) struct Loaded {
    pub(crate) slots: Vec<(Box<[u8]>, Slot)>,
    /// The highest fence any record or the reservation accounts for.
    pub(crate) high_fence: u64,
    /// The fence reservation on disk.
    pub(crate) reserved: u64,
}

/// Creates the tables of a new file, or checks the format of an existing one.
pub(crate) fn initialise(db: &Database) -> Result<()> {
    let txn = db.begin_write()?;
    {
        let mut meta = txn.open_table(META)?;
        let found = meta.get(FORMAT_KEY)?.map(|v| v.value());
        match found {
            None => {
                meta.insert(FORMAT_KEY, STORE_FORMAT)?;
            }
            Some(STORE_FORMAT) => {}
            Some(found) => {
                return Err(Error::UnsupportedFormat {
                    found,
                    supported: STORE_FORMAT,
                })
            }
        }
        txn.open_table(RECORDS)?;
        txn.open_table(EXPIRY)?;
    }
    txn.commit()?;
    Ok(())
}

/// Reads every record, verifying each checksum. Every in-progress record becomes an orphan:
/// its holder was a previous process.
///
/// # Errors
/// [`Error::Corrupted`] naming the first record that fails, because dropping it could repeat a
/// payment.
pub(crate) fn load(db: &Database) -> Result<Loaded> {
    let txn = db.begin_read()?;
    let records = txn.open_table(RECORDS)?;
    let meta = txn.open_table(META)?;
    let reserved = meta.get(FENCE_KEY)?.map_or(0, |v| v.value());
    let mut high_fence = reserved;
    let mut slots = Vec::with_capacity(usize::try_from(records.len()?).unwrap_or(0));
    for entry in records.iter()? {
        let (k, v) = entry?;
        let key = k.value();
        let record = Record::decode(key, v.value()).map_err(|e| Error::Corrupted {
            key: display_scoped_key(key),
            reason: e.to_string(),
        })?;
        if crate::scope::split_scoped_key(key).is_none() {
            return Err(Error::Corrupted {
                key: display_scoped_key(key),
                reason: "the key is not a valid scoped key".into(),
            });
        }
        high_fence = high_fence.max(record.fence);
        slots.push((key.into(), slot_of(&record, true)));
    }
    Ok(Loaded {
        slots,
        high_fence,
        reserved,
    })
}

pub(crate) fn slot_of(record: &Record, orphan: bool) -> Slot {
    let state = match record.state {
        RecordState::InProgress { lease_until } => SlotState::InProgress {
            lease_until,
            orphan,
        },
        RecordState::Completed { expires_at, .. } => SlotState::Completed {
            expires_at,
            durable: true,
        },
    };
    Slot {
        fence: record.fence,
        fingerprint: record.fingerprint(),
        claimed_at: record.claimed_at,
        state,
    }
}

/// Reads and verifies one record.
pub(crate) fn read(db: &Database, key: &[u8]) -> Result<Option<Record>> {
    let txn = db.begin_read()?;
    let records = txn.open_table(RECORDS)?;
    let Some(v) = records.get(key)? else {
        return Ok(None);
    };
    Record::decode(key, v.value())
        .map(Some)
        .map_err(|e| Error::Corrupted {
            key: display_scoped_key(key),
            reason: e.to_string(),
        })
}

/// Up to `limit` expiry entries at or before `now` and after the entry `after`, oldest first.
pub(crate) fn expired(
    db: &Database,
    after: Option<&[u8]>,
    now: u64,
    limit: usize,
) -> Result<Vec<(u64, Box<[u8]>)>> {
    use std::ops::Bound;
    let txn = db.begin_read()?;
    let expiry = txn.open_table(EXPIRY)?;
    let end = (now.saturating_add(1)).to_be_bytes();
    let start = after.map_or(Bound::Unbounded, Bound::Excluded);
    let mut out = Vec::new();
    for entry in expiry.range::<&[u8]>((start, Bound::Excluded(&end[..])))? {
        let (k, _) = entry?;
        let Some((t, key)) = split_expiry_key(k.value()) else {
            return Err(Error::Corrupted {
                key: k.value().escape_ascii().to_string(),
                reason: "expiry entry shorter than its timestamp".into(),
            });
        };
        out.push((t, key.into()));
        if out.len() == limit {
            break;
        }
    }
    Ok(out)
}
