//! The open's load: the index rebuilt from the heads (48 bytes a record), read in parallel
//! ranges for a large file, checked against the records' count and order.

use crate::error::{Damaged, Error, Result};
use crate::file::batch::FileState;
use crate::file::hashing::Hashing;
use crate::file::heads::{StoredHead, HEADS, HEAD_BYTES};
use crate::file::index::{Index, KeyHash, Slot};
use crate::file::layout::MAX_FENCE;
use crate::file::layout::MIN_RECORD_FILE_BYTES;
use crate::file::layout::RECORDS;
use crate::file::read::corrupted;
use crate::file::read::decode_head_at;
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata};

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

/// A record must sit at the fence it names as its place (its claim's, or a completion's own)
/// and carry a valid scoped key.
pub(super) fn check_place(fence: u64, key: &[u8], place: u64) -> Result<()> {
    if place != fence {
        return Err(corrupted(
            fence,
            key,
            format!("it says it is stored at fence {place}"),
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
pub(super) const HEADS_CHECKED_AGAINST_RECORDS: usize = 4;

/// Why the heads cannot be trusted, if one of the first heads holds another hash of its
/// record's key than the file's secret gives. A head holds its key's hash under the secret
/// `meta` keeps, and `meta`'s values carry no checksum of their own: with a damaged secret
/// every lookup would miss and every stored key would be claimed afresh. Every head shares the
/// secret, so a few records read at open catch it; the heads are then rebuilt from the records
/// under the secret read. Only the key's hash is compared: a record that disagrees with its
/// head otherwise (rewritten with a valid checksum), or fails to decode, is that record's
/// damage, which a request on it reports.
pub(super) fn heads_disagree_with_records(
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
pub(super) const PARALLEL_SCAN_MIN: u64 = if cfg!(test) { 4 } else { 1 << 14 };

/// The open reads heads with up to this many threads (one per [`PARALLEL_SCAN_MIN`] heads),
/// whatever the cores: with a cold page cache the reads are scattered 4 KiB page reads, and
/// threads waiting on them keep the disk's queue full. 1.68M heads, 2 vCPUs, cold: 1.68 s with
/// 2 threads, 1.05 s with 4, 0.67 s with 16, 0.61 s with 32; warm 0.39 s with 2, 0.35 s with 16.
pub(super) const MAX_SCAN_THREADS: usize = 16;

/// How one part of the heads scan ended.
pub(super) enum Part {
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
pub(super) fn scan(
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

pub(super) fn out_of_order(table: &str, fence: u64, previous: Option<u64>, start: u64) -> Error {
    Error::Corrupted {
        damaged: Damaged::Pages,
        reason: format!(
            "the {table} tree returns fence {fence} after {previous:?}, scanning from {start}: \
             its pages are out of order (a page written over another?)"
        ),
    }
}

/// Heads gathered before their slots go into the index.
pub(super) const SCAN_CHUNK: usize = 1 << 18;

/// Inserts the gathered slots, stripe by stripe. `Ok(false)` if two keys share a hash; two
/// records of one key are damage.
pub(super) fn insert_pending(
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
