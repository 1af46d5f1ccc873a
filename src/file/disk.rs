//! The redb file: three tables, the batch writer, and the open-time load that rebuilds the
//! index from the heads. Records are keyed by fence, which only grows, so a batch of new claims
//! lands at the right edge of the B-tree and dirties a few leaf pages however many claims it
//! holds. `docs/format.md` documents every byte.

use crate::error::{Damaged, Error, Result};
use crate::file::hashing::{Hashing, SipKey};
use crate::file::heads::{StoredHead, HEADS, HEAD_BYTES};
use crate::file::index::{Index, KeyHash, Slot};
use crate::file::record::{Head, Record};
use crate::model::scope::display_scoped_key;
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

/// fence -> encoded [`Record`] (which carries its scoped key).
pub(crate) const RECORDS: TableDefinition<u64, &[u8]> = TableDefinition::new("records");
/// `expires_at << 64 | fence` -> scoped key, one entry per completed record: the purge's list up
/// to store format 3. A purge now finds expired records in the index (whose slots hold every
/// expiry), so a completion writes two entries instead of three; the upgrade to format 4 drops
/// the table ([`drop_expiry_table`]).
const EXPIRY: TableDefinition<u128, &[u8]> = TableDefinition::new("expiry");
/// Store-wide values: [`FORMAT_KEY`], [`STORE_ID_KEY`], [`FENCE_KEY`], [`JOURNAL_EPOCH_KEY`]
/// and [`JOURNAL_BYTES_KEY`]. Every one is written when the store is created, and an open that
/// finds one missing refuses the file: a default could silently skip a journal.
pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// The store format this build writes. Format 2 added the store id and the journal's made size,
/// and the journal's header and entry layout; format 3 the `heads` table and the hash secret;
/// format 4 dropped the `expiry` table. A file of format 2 or 3 is upgraded at its first open
/// ([`rebuild_heads`], [`drop_expiry_table`]); any other is refused, and an older build refuses
/// a file of format 4 (it would never purge its records: they have no expiry entries).
pub(crate) const STORE_FORMAT: u64 = 4;
/// The format with heads and an `expiry` table, upgraded by [`drop_expiry_table`].
pub(crate) const EXPIRY_FORMAT: u64 = 3;
/// The format without heads, upgraded by [`rebuild_heads`].
const HEADLESS_FORMAT: u64 = 2;
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

/// The highest fence a store file may hold: far beyond any real use (2^61 claims at a million a
/// second take 73,000 years), far enough from `u64::MAX` that the counter never wraps, and
/// below 2^62, so the index packs its state bits above the fence.
pub(crate) const MAX_FENCE: u64 = 1 << 61;

/// No record takes fewer bytes of the store file than this (its encoded head and scoped key
/// alone are longer), which bounds how many records a file of a given size can hold.
const MIN_RECORD_FILE_BYTES: u64 = 32;

/// Fences are reserved on disk in blocks of this many, so most batches need not touch `meta`.
/// Unit tests use a tiny block so that they cross block boundaries.
pub(crate) const FENCE_BLOCK: u64 = if cfg!(test) { 4 } else { 1 << 16 };

/// One durable mutation, applied in queue order. Ops on one key are queued under that key's
/// stripe lock, so the disk sees them in the order the index made them; no op needs to re-check
/// state on disk.
#[derive(Debug)]
pub(crate) enum Op {
    /// Writes the record at `fence`: a new claim, or in place (complete, extend).
    Put {
        fence: u64,
        value: Vec<u8>,
        /// The record's expiry (a completion).
        expiry: Option<u64>,
        /// The record this one replaces (an expired or taken-over claim of the same key),
        /// deleted in the same transaction so no crash can leave the key with neither.
        replaces: Option<Gone>,
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
    let overwritten = overwritten(ops);
    {
        let mut records = txn.open_table(RECORDS)?;
        let mut heads = txn.open_table(HEADS)?;
        for (i, op) in ops.iter().enumerate() {
            if overwritten.get(i).copied().unwrap_or(false) {
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
                    if let Some(gone) = replaces {
                        bytes -= delete(&mut records, &mut heads, gone)?;
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

/// Which of `ops` a later op in the same transaction makes moot: a put of a new claim (no
/// expiry, nothing replaced) followed by another put at its fence (its completion) or by
/// its deletion (its release). Skipping it leaves the same tables and the same byte count, and
/// saves a record and a head insert per request when the applier takes a claim and its
/// completion in one transaction. Empty (nothing skipped) for a batch of one op.
fn overwritten(ops: &[Op]) -> Vec<bool> {
    if ops.len() < 2 {
        return Vec::new();
    }
    let mut moot = vec![false; ops.len()];
    let mut plain: std::collections::HashMap<u64, usize> =
        std::collections::HashMap::with_capacity(ops.len());
    for (i, op) in ops.iter().enumerate() {
        let fence = match op {
            Op::Put { fence, .. } | Op::Delete(Gone { fence }) => *fence,
        };
        if let Some(earlier) = plain.remove(&fence) {
            moot[earlier] = true;
        }
        if let Op::Put {
            expiry: None,
            replaces: None,
            ..
        } = op
        {
            plain.insert(fence, i);
        }
    }
    moot
}

/// The head of the record `value` stored at `fence`, whose checksum and place it verifies.
pub(crate) fn head_of(hashing: &Hashing, fence: u64, value: &[u8]) -> Result<[u8; HEAD_BYTES]> {
    let (key, head) = decode_head_at(fence, value)?;
    Ok(StoredHead::of(hashing, key, &head, value.len()).encode(fence))
}

fn len_i64(len: usize) -> i64 {
    i64::try_from(len).unwrap_or(i64::MAX)
}

fn delete(
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

/// What a scan of the file found, besides the index it filled.
pub(crate) struct Loaded {
    /// The highest fence any record or the reservation accounts for.
    pub(crate) high_fence: u64,
    /// The bytes of every record's value (its encoded key, fingerprint, times and response):
    /// what `max_store_bytes` limits.
    pub(crate) record_bytes: u64,
    /// The fence reservation on disk, and the hashing the heads were read with.
    pub(crate) file: FileState,
}

/// How a load ended.
pub(crate) enum Scan {
    Loaded(Loaded),
    /// Two records' keys share an index hash: rebuild the heads under a new secret.
    Collision,
    /// The heads table is missing, damaged, or does not match the records: rebuild it.
    HeadsDamaged(String),
}

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
        STORE_FORMAT | EXPIRY_FORMAT => Some(SipKey {
            k0: get(SECRET_KEYS[0])?,
            k1: get(SECRET_KEYS[1])?,
        }),
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
const MAX_EPOCH: u64 = 1 << 62;

fn missing(key: &str) -> Error {
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
        txn.open_table(RECORDS)?;
        txn.open_table(HEADS)?;
    }
    txn.commit()?;
    Ok(())
}

/// A random 64-bit id, never 0.
fn random_store_id() -> u64 {
    SipKey::random().k0.max(1)
}

fn corrupted(fence: u64, key: &[u8], reason: impl ToString) -> Error {
    Error::Corrupted {
        damaged: Damaged::Record {
            fence: Some(fence),
            key: Some(display_scoped_key(key)),
        },
        reason: reason.to_string(),
    }
}

/// Decodes and verifies the record stored at `fence`.
fn decode_at(fence: u64, value: &[u8]) -> Result<(&[u8], Record)> {
    let (key, record) = Record::decode(value).map_err(|e| damaged(fence, value, e))?;
    check_place(fence, key, record.fence)?;
    Ok((key, record))
}

/// Decodes and verifies the head of the record stored at `fence`.
fn decode_head_at(fence: u64, value: &[u8]) -> Result<(&[u8], Head)> {
    let (key, head) = Record::decode_head(value).map_err(|e| damaged(fence, value, e))?;
    check_place(fence, key, head.fence)?;
    Ok((key, head))
}

fn damaged(fence: u64, value: &[u8], e: crate::file::record::DecodeFailure) -> Error {
    let key = Record::unverified_key(value)
        .and_then(crate::model::scope::split_scoped_key)
        .map(|(scope, key)| {
            format!(
                "{:?}/{:?}/{key} (read from the damaged record)",
                scope.tenant(),
                scope.endpoint()
            )
        });
    Error::Corrupted {
        damaged: Damaged::Record {
            fence: Some(fence),
            key,
        },
        reason: e.to_string(),
    }
}

/// A record must sit at its own fence and carry a valid scoped key.
fn check_place(fence: u64, key: &[u8], record_fence: u64) -> Result<()> {
    if record_fence != fence {
        return Err(corrupted(
            fence,
            key,
            format!("it says it is the record of fence {record_fence}"),
        ));
    }
    if crate::model::scope::scoped_key_parts(key).is_none() {
        return Err(corrupted(fence, key, "the key is not a valid scoped key"));
    }
    Ok(())
}

/// Reads every record's head into `index` (which must be empty), verifying each head's
/// checksum, the order of the fences and that there is one head per record. Every in-progress
/// record becomes an orphan: its holder was a previous process. `reserved` is the fence
/// reservation `meta` holds; `file_bytes` the store file's size (0 in memory, where no count is
/// trusted beyond what the scan finds). No record is read, except the two records of a hash
/// collision.
///
/// # Errors
/// [`Error::Corrupted`] naming a key that two records hold, or pages out of order.
pub(crate) fn load(db: &Database, index: &Index, reserved: u64, file_bytes: u64) -> Result<Scan> {
    let txn = db.begin_read()?;
    let records = txn.open_table(RECORDS)?;
    let heads = match txn.open_table(HEADS) {
        Err(redb::TableError::TableDoesNotExist(_)) => {
            return Ok(Scan::HeadsDamaged("the heads table is missing".into()))
        }
        other => other?,
    };
    let count = heads.len()?;
    let record_count = records.len()?;
    if count != record_count {
        return Ok(Scan::HeadsDamaged(format!(
            "{count} heads for {record_count} records"
        )));
    }
    // The count is read from the file: room is reserved for no more records than its size
    // could hold, so a damaged count cannot make the open allocate without bound.
    let plausible = count.min(file_bytes / MIN_RECORD_FILE_BYTES);
    index.reserve(usize::try_from(plausible).unwrap_or(0));
    let first = heads.first()?.map_or(0, |(k, _)| k.value());
    let last = heads.last()?.map_or(0, |(k, _)| k.value());
    let parts = usize::try_from(count / PARALLEL_SCAN_MIN)
        .unwrap_or(usize::MAX)
        .clamp(1, MAX_SCAN_THREADS);
    // Split the fence range evenly; fences are dense enough that the parts are similar.
    let bounds: Vec<u64> = (0..parts)
        .map(|i| {
            let offset = u128::from(last - first) * i as u128 / parts as u128;
            first + u64::try_from(offset).expect("an offset within the fence range")
        })
        .collect();
    let scanned: Vec<Result<Part>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..parts)
            .map(|i| {
                let (heads, records) = (&heads, &records);
                let (start, end) = (bounds[i], bounds.get(i + 1).copied());
                s.spawn(move || scan(heads, records, index, start, end))
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    });
    let mut high_fence = reserved;
    let mut found = 0;
    let mut record_bytes = 0;
    for part in scanned {
        match part? {
            Part::Scanned { high, heads, bytes } => {
                high_fence = high_fence.max(high);
                found += heads;
                record_bytes += bytes;
            }
            Part::Collision => return Ok(Scan::Collision),
            Part::Damaged(reason) => return Ok(Scan::HeadsDamaged(reason)),
        }
    }
    if found != count {
        return Err(Error::Corrupted {
            damaged: Damaged::Pages,
            reason: format!(
                "the heads table says it holds {count} heads, but {found} were found: pages \
                 of its tree were lost or written over"
            ),
        });
    }
    if let Some(reason) = heads_disagree_with_records(&heads, &records, index.hashing())? {
        return Ok(Scan::HeadsDamaged(reason));
    }
    if high_fence > MAX_FENCE {
        return Err(Error::Corrupted {
            damaged: Damaged::Meta,
            reason: format!(
                "a fence of {high_fence} is beyond 2^61; no store issues that many claims, and \
                 resuming would wrap the counter and reissue fences"
            ),
        });
    }
    Ok(Scan::Loaded(Loaded {
        high_fence,
        record_bytes,
        file: FileState {
            reserved,
            hashing: *index.hashing(),
        },
    }))
}

/// How many of the first heads the open checks against their records.
const HEADS_CHECKED_AGAINST_RECORDS: usize = 4;

/// Why the heads cannot be trusted, if one of the first heads holds another hash of its
/// record's key than the file's secret gives. A head holds its key's hash under the secret
/// `meta` keeps, and `meta`'s values carry no checksum of their own: with a damaged secret
/// every lookup would miss and every stored key would be claimed afresh. Every head shares the
/// secret, so a few records read at open catch it; the heads are then rebuilt from the records
/// under the secret read. Only the key's hash is compared: a record that disagrees with its
/// head otherwise (rewritten with a valid checksum), or fails to decode, is that record's
/// damage, which a request on it reports.
fn heads_disagree_with_records(
    heads: &redb::ReadOnlyTable<u64, [u8; HEAD_BYTES]>,
    records: &redb::ReadOnlyTable<u64, &'static [u8]>,
    hashing: &Hashing,
) -> Result<Option<String>> {
    for entry in heads.iter()?.take(HEADS_CHECKED_AGAINST_RECORDS) {
        let (fence, stored) = entry?;
        let fence = fence.value();
        let Some(record) = records.get(fence)? else {
            return Ok(Some(format!("the head at fence {fence} has no record")));
        };
        let (Ok((key, _)), Some(stored)) = (
            decode_head_at(fence, record.value()),
            StoredHead::decode(fence, &stored.value()),
        ) else {
            continue;
        };
        let (lo, hi) = hashing.key(key);
        if stored.key != KeyHash::from_parts(lo, hi) {
            return Ok(Some(format!(
                "the head at fence {fence} holds another hash of its record's key than the \
                 file's secret gives (the secret or the head is damaged)"
            )));
        }
    }
    Ok(None)
}

/// The open reads heads on one thread for every this many (up to [`MAX_SCAN_THREADS`]). Unit
/// tests use a tiny figure so that their reopens take the parallel path.
const PARALLEL_SCAN_MIN: u64 = if cfg!(test) { 4 } else { 1 << 14 };
/// The open reads heads with up to this many threads (one per [`PARALLEL_SCAN_MIN`] heads),
/// whatever the cores: with a cold page cache the reads are scattered 4 KiB page reads, and
/// threads waiting on them keep the disk's queue full. 1.68M heads, 2 vCPUs, cold: 1.68 s with
/// 2 threads, 1.05 s with 4, 0.67 s with 16, 0.61 s with 32; warm 0.39 s with 2, 0.35 s with 16.
const MAX_SCAN_THREADS: usize = 16;

/// How one part of the heads scan ended.
enum Part {
    /// The highest fence seen (stopping early at one beyond [`MAX_FENCE`]), how many heads, and
    /// the bytes of their records.
    Scanned {
        high: u64,
        heads: u64,
        bytes: u64,
    },
    Collision,
    /// A head failed its checksum: rebuild the table from the records.
    Damaged(String),
}

/// Loads the heads with fences in `start..end` (`start..` for `None`) into `index`.
fn scan(
    heads: &redb::ReadOnlyTable<u64, [u8; HEAD_BYTES]>,
    records: &redb::ReadOnlyTable<u64, &'static [u8]>,
    index: &Index,
    start: u64,
    end: Option<u64>,
) -> Result<Part> {
    let range = match end {
        Some(end) => heads.range(start..end)?,
        None => heads.range(start..)?,
    };
    let mut high = 0;
    let mut scanned = 0;
    let mut bytes = 0;
    let mut previous: Option<u64> = None;
    // Slots are gathered per stripe and inserted a stripe at a time, so the stripe's table is
    // in the CPU cache while it fills: inserting each head as it is read would touch a random
    // place of the whole index (hundreds of MB at ten million keys) per head.
    let mut pending: Vec<Vec<(KeyHash, Slot)>> = vec![Vec::new(); index.stripe_count()];
    let mut gathered = 0;
    for entry in range {
        let (fence, value) = entry?;
        let fence = fence.value();
        // A tree whose pages were written over one another (trusted, with PageCheck::Trust)
        // returns fences out of order or out of the range asked for.
        let in_range = fence >= start && end.is_none_or(|end| fence < end);
        if previous.is_some_and(|p| fence <= p) || !in_range {
            return Err(out_of_order("heads", fence, previous, start));
        }
        previous = Some(fence);
        let Some(head) = StoredHead::decode(fence, &value.value()) else {
            return Ok(Part::Damaged(format!(
                "the head at fence {fence} fails its checksum"
            )));
        };
        scanned += 1;
        bytes += u64::from(head.value_len);
        high = fence;
        if high > MAX_FENCE {
            break;
        }
        head.count_tenant(index);
        pending[index.stripe_of(&head.key)].push((head.key, head.slot(fence)));
        gathered += 1;
        if gathered == SCAN_CHUNK {
            gathered = 0;
            if !insert_pending(records, index, &mut pending)? {
                return Ok(Part::Collision);
            }
        }
    }
    if !insert_pending(records, index, &mut pending)? {
        return Ok(Part::Collision);
    }
    Ok(Part::Scanned {
        high,
        heads: scanned,
        bytes,
    })
}

fn out_of_order(table: &str, fence: u64, previous: Option<u64>, start: u64) -> Error {
    Error::Corrupted {
        damaged: Damaged::Pages,
        reason: format!(
            "the {table} tree returns fence {fence} after {previous:?}, scanning from {start}: \
             its pages are out of order (a page written over another?)"
        ),
    }
}

/// Heads gathered before their slots go into the index.
const SCAN_CHUNK: usize = 1 << 18;

/// Inserts the gathered slots, stripe by stripe. `Ok(false)` if two keys share a hash; two
/// records of one key are damage.
fn insert_pending(
    records: &redb::ReadOnlyTable<u64, &'static [u8]>,
    index: &Index,
    pending: &mut [Vec<(KeyHash, Slot)>],
) -> Result<bool> {
    for (i, slots) in pending.iter_mut().enumerate() {
        let mut stripe = index.lock_stripe(i);
        for (hash, slot) in slots.drain(..) {
            let Some(other) = stripe.insert(hash, slot.clone()) else {
                continue;
            };
            drop(stripe);
            let key_at = |fence: u64| -> Result<Vec<u8>> {
                Ok(match records.get(fence)? {
                    Some(v) => decode_head_at(fence, v.value())?.0.to_vec(),
                    None => Vec::new(),
                })
            };
            let key = key_at(slot.fence())?;
            if key_at(other.fence())? != key {
                return Ok(false);
            }
            return Err(corrupted(
                slot.fence(),
                &key,
                format!(
                    "two records for one key (the other at fence {})",
                    other.fence()
                ),
            ));
        }
    }
    Ok(true)
}

/// Writes the `heads` table afresh from the records, under `secret`, and makes the file
/// [`STORE_FORMAT`] (dropping the `expiry` table of format 3 or below), in one durable commit:
/// the upgrade of a format-2 file, the repair of a
/// damaged heads table, and the re-keying after a hash collision. Every record is read and its
/// checksum verified, as every open did before heads existed.
///
/// # Errors
/// [`Error::Corrupted`] naming the first record that fails, or pages out of order; nothing is
/// changed then.
pub(crate) fn rebuild_heads(db: &Database, secret: SipKey) -> Result<u64> {
    let hashing = Hashing::new(secret);
    let mut txn = db.begin_write()?;
    quick_repair(&mut txn);
    let mut rebuilt = 0;
    delete_table(&txn, HEADS)?;
    delete_table(&txn, EXPIRY)?;
    {
        let records = txn.open_table(RECORDS)?;
        let mut heads = txn.open_table(HEADS)?;
        let mut previous = None;
        for entry in records.iter()? {
            let (fence, value) = entry?;
            let (fence, value) = (fence.value(), value.value());
            if previous.is_some_and(|p| fence <= p) {
                return Err(out_of_order("records", fence, previous, 0));
            }
            previous = Some(fence);
            heads.insert(fence, head_of(&hashing, fence, value)?)?;
            rebuilt += 1;
        }
        let mut meta = txn.open_table(META)?;
        meta.insert(SECRET_KEYS[0], secret.k0)?;
        meta.insert(SECRET_KEYS[1], secret.k1)?;
        meta.insert(FORMAT_KEY, STORE_FORMAT)?;
    }
    txn.commit()?;
    Ok(rebuilt)
}

/// Upgrades a file of format 3 to [`STORE_FORMAT`] in one durable commit: drops the `expiry`
/// table, which nothing reads any more. A crash before the commit leaves format 3, upgraded
/// again at the next open.
pub(crate) fn drop_expiry_table(db: &Database) -> Result<()> {
    let mut txn = db.begin_write()?;
    quick_repair(&mut txn);
    delete_table(&txn, EXPIRY)?;
    txn.open_table(META)?.insert(FORMAT_KEY, STORE_FORMAT)?;
    txn.commit()?;
    Ok(())
}

fn delete_table<K: redb::Key + 'static, V: redb::Value + 'static>(
    txn: &redb::WriteTransaction,
    table: TableDefinition<K, V>,
) -> Result<()> {
    match txn.delete_table(table) {
        Ok(_) | Err(redb::TableError::TableDoesNotExist(_)) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// A record with the scoped key it carries.
pub(crate) type Keyed = (Box<[u8]>, Record);

/// Reads and verifies the record at `fence`, with the scoped key it carries; `None` if there
/// is none.
pub(crate) fn read_at(db: &Database, fence: u64) -> Result<Option<Keyed>> {
    Ok(read_many(db, [fence])?.pop().flatten())
}

/// [`read_at`] for each fence, in one read transaction: one snapshot of the file.
pub(crate) fn read_many(
    db: &Database,
    fences: impl IntoIterator<Item = u64>,
) -> Result<Vec<Option<Keyed>>> {
    let txn = db.begin_read()?;
    let records = txn.open_table(RECORDS)?;
    let mut out = Vec::new();
    for fence in fences {
        out.push(match records.get(fence)? {
            Some(v) => {
                let (key, record) = decode_at(fence, v.value())?;
                Some((key.into(), record))
            }
            None => None,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file::hashing::SipKey;
    use crate::file::record::{Record, RecordState, StoredResponse};

    fn value(fence: u64, completed: bool) -> Vec<u8> {
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
        record.encode(&key(fence))
    }

    fn key(fence: u64) -> Box<[u8]> {
        let scope = crate::model::scope::Scope::new("tenant", "POST /x");
        crate::model::scope::scoped_key(&scope, &format!("k{fence}")).unwrap()
    }

    fn put(fence: u64, completed: bool, replaces: Option<Gone>) -> Op {
        Op::Put {
            fence,
            value: value(fence, completed),
            expiry: completed.then_some(100 + fence),
            replaces,
        }
    }

    /// Claims, completions, a release and a takeover, in queue order.
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
    /// a claim and its release) leaves exactly the tables and byte count that the ops leave one
    /// transaction each, and reserves every fence.
    #[test]
    fn a_batch_that_skips_overwritten_puts_leaves_what_the_ops_leave_one_by_one() {
        let ops = ops();
        assert_eq!(
            overwritten(&ops),
            [true, true, false, false, false, false, false, false],
            "the claims of 1 and 2 are moot; 4's first put replaces 3, and is kept"
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
        assert!(file_together.reserved >= 5 && file_apart.reserved >= 5);
        assert_eq!(tables(&together), tables(&apart));
    }
}
