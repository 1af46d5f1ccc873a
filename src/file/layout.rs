//! The redb file's layout: its tables, the store format, the `meta` table's keys and values,
//! and a new file's first commit. `docs/format.md` documents every byte. Records are keyed by
//! fence, which only grows, so a batch of new claims lands at the right edge of the B-tree
//! and dirties a few leaf pages however many claims it holds.

use crate::error::{Damaged, Error, Result};
use crate::file::batch::quick_repair;
use crate::file::hashing::SipKey;
use crate::file::heads::HEADS;
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

/// fence -> encoded [`Record`] (which carries its scoped key).
pub(crate) const RECORDS: TableDefinition<u64, &[u8]> = TableDefinition::new("records");

/// `expires_at << 64 | fence` -> scoped key, one entry per completed record: the purge's list up
/// to store format 3. A purge now finds expired records in the index (whose slots hold every
/// expiry), so a completion writes two entries instead of three; the upgrade to format 4 drops
/// the table ([`drop_expiry_table`]).
pub(super) const EXPIRY: TableDefinition<u128, &[u8]> = TableDefinition::new("expiry");

/// Store-wide values: [`FORMAT_KEY`], [`STORE_ID_KEY`], [`FENCE_KEY`], [`JOURNAL_EPOCH_KEY`],
/// [`JOURNAL_BYTES_KEY`] and [`RECORD_COUNT_KEY`]. Every one is written when the store is
/// created, and an open that finds one missing refuses the file: a default could silently skip
/// a journal.
pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// The store format this build writes. Format 2 added the store id and the journal's made size,
/// and the journal's header and entry layout; format 3 the `heads` table and the hash secret;
/// format 4 dropped the `expiry` table; format 5 added [`RECORD_COUNT_KEY`]; format 6 writes
/// records of record format 2 (beside the format 1 records it holds from before); format 7
/// writes a completion at a fence of its own, apart from its claim's. A file of format 2 to 6
/// is upgraded at its first open ([`rebuild_heads`], [`drop_expiry_table`], [`count_records`]);
/// any other is refused, and an older build refuses a file of format 5 (it would change the
/// records without keeping their count, which the next open would take for damage), 6 (it
/// would answer `Corrupted` for every record of format 2) or 7 (the same for every completion
/// stored apart).
pub(crate) const STORE_FORMAT: u64 = 7;

/// The format whose completions are all at their claims' fences, upgraded by [`count_records`]
/// (which only writes the new format).
pub(crate) const CLAIM_PLACED_FORMAT: u64 = 6;

/// The format whose records are all of record format 1, upgraded by [`count_records`] (which
/// only writes the new format: the count it keeps is already there).
pub(crate) const RECORD_1_FORMAT: u64 = 5;

/// The format without a record count, upgraded by [`count_records`].
pub(crate) const UNCOUNTED_FORMAT: u64 = 4;

/// The format with heads and an `expiry` table, upgraded by [`drop_expiry_table`].
pub(crate) const EXPIRY_FORMAT: u64 = 3;

/// The format without heads, upgraded by [`rebuild_heads`].
pub(super) const HEADLESS_FORMAT: u64 = 2;

pub(crate) const FORMAT_KEY: &str = "format_version";

/// The two halves of the store's hash secret (`hashing.rs`), from which every hash the `heads`
/// table holds is keyed.
pub(crate) const SECRET_KEYS: [&str; 2] = ["hash_secret_k0", "hash_secret_k1"];

/// The store's random id, which its journal carries.
pub(crate) const STORE_ID_KEY: &str = "store_id";

/// The fence reservation: no committed record carries a fence above it, and fences issued
/// after a reopen start above it.
pub(crate) const FENCE_KEY: &str = "fence_reserved";

/// The journal epoch whose entries are not yet checkpointed into this file (see
/// `journal/mod.rs`); 0 until the store first uses a journal.
pub(crate) const JOURNAL_EPOCH_KEY: &str = "journal_epoch";

/// How long the journal file was made; 0 until it is. A shorter journal is refused.
pub(crate) const JOURNAL_BYTES_KEY: &str = "journal_bytes";

/// The last epoch whose journal header write is recorded: `journal_epoch`, or less after a crash
/// between a checkpoint's commit and the commit that records its header write. A journal whose
/// header names an older epoch than this is an old copy, not a crash.
pub(crate) const JOURNAL_HEADER_KEY: &str = "journal_header_epoch";

/// How many records the records table holds, written by every transaction that changes that
/// number (durable or not: redb's close makes a pending non-durable commit durable). An open
/// compares it with the table before it trusts the table: damage that makes the records read
/// as fewer (or none) is refused rather than served as a store that forgot them.
pub(crate) const RECORD_COUNT_KEY: &str = "record_count";

/// The highest fence a store file may hold: far beyond any real use (2^61 claims at a million a
/// second take 73,000 years), far enough from `u64::MAX` that the counter never wraps, and
/// below 2^62, so the index packs its state bits above the fence.
pub(crate) const MAX_FENCE: u64 = 1 << 61;

/// No record takes fewer bytes of the store file than this (its encoded head and scoped key
/// alone are longer), which bounds how many records a file of a given size can hold.
pub(super) const MIN_RECORD_FILE_BYTES: u64 = 32;

/// Fences are reserved on disk in blocks of this many, so most batches need not touch `meta`.
/// Unit tests use a tiny block so that they cross block boundaries.
pub(crate) const FENCE_BLOCK: u64 = if cfg!(test) { 4 } else { 1 << 16 };

/// What the store file's `meta` table holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Meta {
    /// [`STORE_FORMAT`], or an older format the open upgrades.
    pub(crate) format: u64,
    /// The hash secret; `None` in a file of format 2, which has no heads yet.
    pub(crate) secret: Option<SipKey>,
    pub(crate) store_id: u64,
    pub(crate) fence_reserved: u64,
    pub(crate) journal_epoch: u64,
    pub(crate) journal_bytes: u64,
    pub(crate) journal_header: u64,
    /// The records the table held at the last commit; `None` before format 5.
    pub(crate) record_count: Option<u64>,
}

/// Reads `meta`, refusing a file that lacks any value (or has another format).
///
/// # Errors
/// [`Error::UnsupportedFormat`] for another format version; [`Error::Corrupted`] naming the
/// meta table when a value is missing.
pub(crate) fn meta(db: &Database) -> Result<Meta> {
    let txn = db.begin_read()?;
    let meta = match txn.open_table(META) {
        Err(redb::TableError::TableDoesNotExist(_)) => return Err(missing(FORMAT_KEY)),
        other => other?,
    };
    let get = |key| -> Result<u64> {
        meta.get(key)?
            .map(|v| v.value())
            .ok_or_else(|| missing(key))
    };
    let format = get(FORMAT_KEY)?;
    let secret = match format {
        STORE_FORMAT | CLAIM_PLACED_FORMAT | RECORD_1_FORMAT | UNCOUNTED_FORMAT | EXPIRY_FORMAT => {
            Some(SipKey {
                k0: get(SECRET_KEYS[0])?,
                k1: get(SECRET_KEYS[1])?,
            })
        }
        HEADLESS_FORMAT => None,
        found => {
            return Err(Error::UnsupportedFormat {
                found,
                supported: STORE_FORMAT,
            })
        }
    };
    let meta = Meta {
        format,
        secret,
        store_id: get(STORE_ID_KEY)?,
        fence_reserved: get(FENCE_KEY)?,
        journal_epoch: get(JOURNAL_EPOCH_KEY)?,
        journal_bytes: get(JOURNAL_BYTES_KEY)?,
        journal_header: get(JOURNAL_HEADER_KEY)?,
        record_count: match format {
            STORE_FORMAT | CLAIM_PLACED_FORMAT | RECORD_1_FORMAT => Some(get(RECORD_COUNT_KEY)?),
            _ => None,
        },
    };
    if meta.journal_epoch > MAX_EPOCH {
        return Err(Error::Corrupted {
            damaged: Damaged::Meta,
            reason: format!(
                "the journal epoch {} is beyond any store's (one a checkpoint; at most {MAX_EPOCH})",
                meta.journal_epoch
            ),
        });
    }
    if meta.journal_header > meta.journal_epoch {
        return Err(Error::Corrupted {
            damaged: Damaged::Meta,
            reason: format!(
                "the journal header epoch {} is ahead of the journal epoch {}",
                meta.journal_header, meta.journal_epoch
            ),
        });
    }
    Ok(meta)
}

/// The highest journal epoch a file may name: each checkpoint raises it by one, so no store
/// reaches it (2^62 checkpoints), and the epoch arithmetic never overflows.
pub(super) const MAX_EPOCH: u64 = 1 << 62;

pub(super) fn missing(key: &str) -> Error {
    Error::Corrupted {
        damaged: Damaged::Meta,
        reason: format!(
            "`{key}` is missing: the file is not an idemdb store, or its meta table is damaged"
        ),
    }
}

/// Initialises a new store in an empty redb file: its tables, and every `meta` value, with a
/// fresh random store id. Durable when it returns.
pub(crate) fn create(db: &Database) -> Result<()> {
    let mut txn = db.begin_write()?;
    quick_repair(&mut txn);
    {
        let mut meta = txn.open_table(META)?;
        if meta.get(FORMAT_KEY)?.is_some() {
            return Err(Error::Corrupted {
                damaged: Damaged::Meta,
                reason: "a store being created already holds one".into(),
            });
        }
        meta.insert(FORMAT_KEY, STORE_FORMAT)?;
        let secret = SipKey::random();
        meta.insert(SECRET_KEYS[0], secret.k0)?;
        meta.insert(SECRET_KEYS[1], secret.k1)?;
        meta.insert(STORE_ID_KEY, random_store_id())?;
        meta.insert(FENCE_KEY, 0)?;
        meta.insert(JOURNAL_EPOCH_KEY, 0)?;
        meta.insert(JOURNAL_BYTES_KEY, 0)?;
        meta.insert(JOURNAL_HEADER_KEY, 0)?;
        meta.insert(RECORD_COUNT_KEY, 0)?;
        txn.open_table(RECORDS)?;
        txn.open_table(HEADS)?;
    }
    txn.commit()?;
    Ok(())
}

/// Refuses a file whose records table holds another number of records than `meta` says it
/// held at the last commit (a file of format 5; older ones have no count until upgraded).
///
/// # Errors
/// [`Error::Corrupted`] (`Damaged::Pages`) naming both numbers; nothing is changed.
pub(crate) fn check_record_count(db: &Database, meta: &Meta) -> Result<()> {
    let Some(recorded) = meta.record_count else {
        return Ok(());
    };
    let txn = db.begin_read()?;
    let found = txn.open_table(RECORDS)?.len()?;
    if found != recorded {
        return Err(Error::Corrupted {
            damaged: Damaged::Pages,
            reason: format!(
                "the records table holds {found} records, and the store recorded {recorded} at \
                 its last commit: its pages were damaged or written over, and serving it would \
                 forget records; nothing was changed (`idemdb verify` names what it can read, \
                 `idemdb export --past-damage` carries it out)"
            ),
        });
    }
    Ok(())
}

/// Records in `txn` how many records its records table holds now ([`RECORD_COUNT_KEY`]).
pub(crate) fn write_record_count(txn: &redb::WriteTransaction) -> Result<()> {
    let count = txn.open_table(RECORDS)?.len()?;
    txn.open_table(META)?.insert(RECORD_COUNT_KEY, count)?;
    Ok(())
}

/// A random 64-bit id, never 0.
pub(super) fn random_store_id() -> u64 {
    SipKey::random().k0.max(1)
}
