//! The journal: an append-only log in front of the redb file. A batch is durable once it is
//! written at the journal's end and the journal is `fdatasync`ed: one sequential write into a
//! file whose blocks were allocated and zeroed when it was made, so the sync flushes data blocks
//! and no file-system metadata. redb then applies the batch without syncing
//! (`Durability::None`), and readers see it at once.
//!
//! A **checkpoint** (`crate::file::commit::checkpoint`, which owns both files) is a durable
//! redb commit (`fdatasync` of the redb file) that also raises the journal **epoch** stored in
//! the redb file's `meta` table; then the journal's header is rewritten to name the new epoch
//! ([`Journal::restart`], synced), and entries are written again from the start of the entry
//! area. A batch that does not fit in what is left of the journal is committed that way,
//! directly into redb, and acknowledged only once the header names the new epoch. The journal
//! itself never touches the redb file.
//!
//! # Binding a journal to its store
//! The journal belongs to one store and to one life of it. Its header (two slots, written in
//! turn, so that a torn write leaves the other intact) holds the store's random 64-bit id and
//! the epoch the store file named when the header was written; every entry holds the store id,
//! the epoch and its sequence number, under a CRC-32. On open ([`Journal::recover`]), with `M`
//! the store file's epoch and `H` the header's:
//!
//! - another store's id: refused ([`Error::JournalMismatch`]), never replayed;
//! - `H > M`: the store file is older than its journal (a checkpoint was rolled back, or the
//!   file restored from an older backup): refused, with the same error;
//! - `H < D`, where `D` is the last header write the store file recorded (a commit after each
//!   header write): a journal older than the store (an old copy), refused with the same error.
//!   `D ≤ H < M` is a crash between a checkpoint's commit and the record of its header write
//!   (possibly several in a row): the journal then holds only entries the store file already
//!   has. A header write never goes to the slot holding `D`, so a torn one leaves it intact;
//! - `H == M`: the entries of epoch `M` are replayed, in sequence, up to the first that is not
//!   intact (a torn last entry is how a crash ends a journal).
//!
//! Then the rest of the file is searched for any intact entry of this store of epoch `M` or
//! later, or of another store. Any such entry means damage that ended the replay early (an
//! invalid entry followed by valid ones) or a store file older than its journal: refused, never
//! "the end". A journal shorter than the store file says it was made is refused too.
//!
//! Layout (`docs/format.md`): header slots at offsets 0 and 512 (separate sectors), entries from
//! [`ENTRIES_AT`]. Entry: `[magic "IDJ2"][store id u64][epoch u64][seq u64][payload length
//! u32][crc32 u32][payload]`, little-endian; the crc covers the 32 header bytes before it and
//! the payload.

pub(crate) mod file;

use crate::error::{Damaged, Error, Result};
use crate::file::batch::{Gone, Op};
use redb::StorageBackend;

const ENTRY_MAGIC: [u8; 4] = *b"IDJ2";
const ENTRY_HEADER: usize = 36;
const SLOT_MAGIC: [u8; 4] = *b"IDJH";
/// The journal layout this build writes and reads.
const JOURNAL_VERSION: u32 = 2;
/// `[magic][version u32][store id u64][epoch u64][crc32 u32]`.
const SLOT_LEN: usize = 28;
/// The two header slots: epoch `e` is written into slot `e % 2`.
const SLOTS: [u64; 2] = [0, 512];
/// Where entries start.
pub(crate) const ENTRIES_AT: u64 = 1024;
/// The smallest journal that holds anything: the header and a few small entries.
pub(crate) const MIN_JOURNAL_BYTES: u64 = 4096;
/// Zeroes are written, and the file searched, in chunks of this size.
const CHUNK: usize = 1 << 20;

const PUT: u8 = 1;
const DELETE: u8 = 2;

/// What the store file says of its journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Binding {
    /// The store's random id.
    pub(crate) store_id: u64,
    /// The epoch whose entries are not yet checkpointed.
    pub(crate) epoch: u64,
    /// The last epoch whose header write the store file recorded: the journal's header names
    /// at least it (a crash between a later checkpoint's commit and that record may leave the
    /// header anywhere from it up to `epoch`).
    pub(crate) header_floor: u64,
    /// How long the journal file was made (0: never made).
    pub(crate) made: u64,
}

/// The journal of one store; owned by whoever leads commits.
pub(crate) struct Journal {
    file: Box<dyn StorageBackend>,
    store_id: u64,
    /// Entries end before this.
    capacity: u64,
    /// The file's length.
    made: u64,
    epoch: u64,
    /// The header slot holding the epoch the store file recorded last: never overwritten
    /// until a newer header write is recorded, so a crash always leaves it intact.
    recorded_slot: Option<usize>,
    /// The slot the last header write went to.
    written_slot: Option<usize>,
    /// Where the next entry goes.
    end: u64,
    /// The next entry's sequence number within the epoch.
    seq: u64,
    buf: Vec<u8>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("capacity", &self.capacity)
            .field("epoch", &self.epoch)
            .field("end", &self.end)
            .finish_non_exhaustive()
    }
}

/// What [`Journal::append`] did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Appended {
    /// Written and synced: the batch is durable.
    Durable,
    /// Nothing written: the batch does not fit in what is left. Checkpoint it instead.
    Full,
}

/// One header slot, as read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// Never written (all zeroes).
    Absent,
    Valid {
        store_id: u64,
        epoch: u64,
    },
    /// Neither zeroes nor intact: torn by a crash while it was written, or damaged.
    Damaged,
}

fn slot_epoch(slot: Slot) -> u64 {
    match slot {
        Slot::Valid { epoch, .. } => epoch,
        Slot::Absent | Slot::Damaged => 0,
    }
}

fn journal_error(reason: String) -> Error {
    Error::Corrupted {
        damaged: Damaged::Journal,
        reason,
    }
}

fn le_u64(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"))
}

fn le_u32(bytes: &[u8]) -> u32 {
    u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"))
}

/// An entry's header fields.
struct EntryHead {
    store_id: u64,
    epoch: u64,
    seq: u64,
    len: u32,
    crc: u32,
}

impl EntryHead {
    /// The header at the start of `bytes`, if it carries the entry magic.
    fn parse(bytes: &[u8]) -> Option<EntryHead> {
        if bytes.len() < ENTRY_HEADER || bytes[..4] != ENTRY_MAGIC {
            return None;
        }
        Some(EntryHead {
            store_id: le_u64(&bytes[4..]),
            epoch: le_u64(&bytes[12..]),
            seq: le_u64(&bytes[20..]),
            len: le_u32(&bytes[28..]),
            crc: le_u32(&bytes[32..]),
        })
    }
}

fn entry_crc(header: &[u8], payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&header[..ENTRY_HEADER - 4]);
    hasher.update(payload);
    hasher.finalize()
}

impl Journal {
    /// Opens the journal in `file` for a store whose file says `binding`, checks that the
    /// journal is this store's and of its current life, and returns it with the ops to replay.
    /// A journal never made is made here: `capacity` bytes of zeroes, synced. A journal shorter
    /// than `capacity` (a store reopened with a larger journal) is grown the same way; the
    /// store file then records the new length in the checkpoint that ends the recovery.
    ///
    /// # Errors
    /// [`Error::JournalMismatch`] for another store's journal; [`Error::Corrupted`] for a
    /// journal shorter than it was made, a damaged header, a journal older or newer than the
    /// store file, an intact entry after the end of the replayed ones, or an entry whose ops
    /// do not decode; [`Error::Io`] from the file.
    pub(crate) fn recover(
        file: Box<dyn StorageBackend>,
        binding: Binding,
        capacity: u64,
    ) -> Result<(Journal, Vec<Op>)> {
        let len = file.len()?;
        if len < binding.made {
            return Err(journal_error(format!(
                "the journal is {len} bytes long, but it was made {} bytes long: it was \
                 truncated, and the acknowledged writes it held may be lost",
                binding.made
            )));
        }
        let mut journal = Journal {
            file,
            store_id: binding.store_id,
            capacity: capacity.max(MIN_JOURNAL_BYTES),
            made: len,
            epoch: binding.epoch,
            recorded_slot: None,
            written_slot: None,
            end: ENTRIES_AT,
            seq: 0,
            buf: Vec::new(),
        };
        let header = journal.header_epoch(binding.epoch, binding.header_floor)?;
        let mut ops = Vec::new();
        if header == binding.epoch {
            while let Some(entry) = journal.read_entry()? {
                decode_ops(&entry, &mut ops).map_err(|why| {
                    journal_error(format!(
                        "entry {} of epoch {}: {why}",
                        journal.seq, journal.epoch
                    ))
                })?;
                journal.end += (ENTRY_HEADER + entry.len()) as u64;
                journal.seq += 1;
            }
        }
        journal.refuse_entries_past_the_end()?;
        if journal.made < journal.capacity {
            journal.grow()?;
        }
        Ok((journal, ops))
    }

    /// The epoch the header names, checked against the store file's: from `floor` (the last
    /// header write the store file recorded) up to `epoch`. Notes which slot holds `floor`.
    fn header_epoch(&mut self, epoch: u64, floor: u64) -> Result<u64> {
        let slots = [self.slot(0)?, self.slot(1)?];
        for slot in slots {
            if let Slot::Valid { store_id, .. } = slot {
                if store_id != self.store_id {
                    return Err(self.mismatch(store_id, slot_epoch(slot)));
                }
            }
        }
        let newest = slots
            .iter()
            .filter_map(|s| match s {
                Slot::Valid { epoch, .. } => Some(*epoch),
                _ => None,
            })
            .max();
        let header = match (newest, slots) {
            (Some(e), _) => e,
            (None, [Slot::Damaged, Slot::Damaged]) => {
                return Err(journal_error(
                    "both header slots are damaged: the journal cannot be tied to this store"
                        .into(),
                ))
            }
            // Nothing, or a first header torn while it was written: no epoch was started.
            (None, _) => 0,
        };
        if header > epoch || header < floor {
            return Err(self.mismatch(self.store_id, header));
        }
        self.recorded_slot = slots
            .iter()
            .position(|s| matches!(s, Slot::Valid { epoch, .. } if *epoch == floor));
        if floor > 0 && self.recorded_slot.is_none() {
            return Err(journal_error(format!(
                "the header slot of epoch {floor}, which the store file recorded, is damaged"
            )));
        }
        Ok(header)
    }

    fn slot(&self, i: usize) -> Result<Slot> {
        let at = SLOTS[i];
        if self.made < at + SLOT_LEN as u64 {
            return Ok(Slot::Absent);
        }
        let mut b = [0; SLOT_LEN];
        self.file.read(at, &mut b)?;
        if b.iter().all(|&x| x == 0) {
            return Ok(Slot::Absent);
        }
        let crc = crc32fast::hash(&b[..SLOT_LEN - 4]);
        if b[..4] != SLOT_MAGIC || le_u32(&b[SLOT_LEN - 4..]) != crc {
            return Ok(Slot::Damaged);
        }
        let version = le_u32(&b[4..]);
        if version != JOURNAL_VERSION {
            return Err(journal_error(format!(
                "the journal's header says layout version {version}; this build reads \
                 version {JOURNAL_VERSION}"
            )));
        }
        Ok(Slot::Valid {
            store_id: le_u64(&b[8..]),
            epoch: le_u64(&b[16..]),
        })
    }

    /// The payload of the entry at `end` if it is the next one of this epoch, intact. Entries
    /// are read to the end of the file, not of `capacity`: a store reopened with a smaller
    /// journal still replays what the larger one holds.
    fn read_entry(&self) -> Result<Option<Vec<u8>>> {
        if self.end + ENTRY_HEADER as u64 > self.made {
            return Ok(None);
        }
        let mut header = [0; ENTRY_HEADER];
        self.file.read(self.end, &mut header)?;
        let Some(head) = EntryHead::parse(&header) else {
            return Ok(None);
        };
        let payload_end = self.end + ENTRY_HEADER as u64 + u64::from(head.len);
        if head.store_id != self.store_id
            || head.epoch != self.epoch
            || head.seq != self.seq
            || payload_end > self.made
        {
            return Ok(None);
        }
        let mut payload = vec![0; usize::try_from(head.len).expect("u32 fits usize")];
        self.file
            .read(self.end + ENTRY_HEADER as u64, &mut payload)?;
        Ok((entry_crc(&header, &payload) == head.crc).then_some(payload))
    }

    /// Searches the file past the replayed entries for an intact entry that must not be there:
    /// one of this store of the current epoch or later, or one of another store.
    fn refuse_entries_past_the_end(&self) -> Result<()> {
        let mut at = self.end;
        let mut chunk = Vec::new();
        while at + ENTRY_HEADER as u64 <= self.made {
            let n = usize::try_from((self.made - at).min(CHUNK as u64)).expect("a chunk");
            chunk.resize(n, 0);
            self.file.read(at, &mut chunk)?;
            for i in 0..n.saturating_sub(ENTRY_HEADER - 1) {
                if chunk[i..i + 4] != ENTRY_MAGIC {
                    continue;
                }
                let Some(head) = EntryHead::parse(&chunk[i..]) else {
                    continue;
                };
                let offset = at + i as u64;
                if head.store_id == self.store_id && head.epoch < self.epoch {
                    continue; // an older epoch's: dead, and already in the store file
                }
                if !self.intact(offset, &head)? {
                    continue;
                }
                return Err(
                    if head.store_id != self.store_id || head.epoch > self.epoch {
                        self.mismatch(head.store_id, head.epoch)
                    } else {
                        journal_error(format!(
                            "entry {} of epoch {} at offset {offset} is intact, but the entries \
                         before it end at offset {} (entry {}): the journal is damaged, and \
                         acknowledged writes after the damage would be lost",
                            head.seq, head.epoch, self.end, self.seq
                        ))
                    },
                );
            }
            // Overlap by a header, so an entry across the chunk boundary is seen.
            at += (n as u64).saturating_sub(ENTRY_HEADER as u64 - 1).max(1);
        }
        Ok(())
    }

    fn mismatch(&self, journal_store: u64, journal_epoch: u64) -> Error {
        Error::JournalMismatch {
            journal_store,
            store: self.store_id,
            journal_epoch,
            store_epoch: self.epoch,
        }
    }

    /// Whether the entry whose header `head` is at `offset` checks out.
    fn intact(&self, offset: u64, head: &EntryHead) -> Result<bool> {
        let start = offset + ENTRY_HEADER as u64;
        if start + u64::from(head.len) > self.made {
            return Ok(false);
        }
        let mut header = [0; ENTRY_HEADER];
        self.file.read(offset, &mut header)?;
        let mut payload = vec![0; usize::try_from(head.len).expect("u32 fits usize")];
        self.file.read(start, &mut payload)?;
        Ok(entry_crc(&header, &payload) == head.crc)
    }

    /// Extends the file with zeroes to `capacity` and syncs it.
    fn grow(&mut self) -> Result<()> {
        let zeroes = vec![0; CHUNK];
        let mut at = self.made;
        while at < self.capacity {
            let n = usize::try_from((self.capacity - at).min(CHUNK as u64)).expect("a chunk");
            self.file.write(at, &zeroes[..n])?;
            at += n as u64;
        }
        self.file.sync_data()?;
        self.made = self.capacity;
        Ok(())
    }

    /// Whether the store's next entries may go on in the epoch just recovered, without a
    /// checkpoint: it holds no entry, its header is written and recorded by the store file
    /// (`binding`), and the journal's length is the one the store file records. Then a
    /// checkpoint would commit nothing but the next epoch, twice (`docs/design.md`, "An open
    /// that finds the journal empty").
    ///
    /// Entries then start at the start of the entry area with sequence 0, over whatever an
    /// unacknowledged batch of this epoch left there: the recovery found no intact entry of
    /// this epoch anywhere in the file (or refused it), a write changes only the bytes it
    /// covers, and an entry past the end is read only where the bytes it spans were left
    /// as they were, so no entry a later recovery finds intact can be one of those leftovers.
    ///
    /// `recover` leaves the journal at `binding`'s epoch, and refuses a recorded header it cannot
    /// find, so those need no check here.
    pub(crate) fn resumable(&self, binding: &Binding) -> bool {
        self.seq == 0
            && binding.epoch > 0
            && binding.header_floor == binding.epoch
            && self.made == binding.made
    }

    /// Whether any entry was written in the current epoch.
    pub(crate) fn has_entries(&self) -> bool {
        self.seq > 0
    }

    /// Appends `ops` as one entry and syncs the file.
    ///
    /// # Errors
    /// [`Error::Io`] if the write or the sync fails; the batch may or may not be durable then.
    pub(crate) fn append(&mut self, ops: &[Op]) -> Result<Appended> {
        self.buf.clear();
        self.buf.extend_from_slice(&[0; ENTRY_HEADER]);
        encode_ops(ops, &mut self.buf);
        let total = self.buf.len() as u64;
        let Ok(len) = u32::try_from(self.buf.len() - ENTRY_HEADER) else {
            return Ok(Appended::Full);
        };
        if self.end + total > self.capacity {
            return Ok(Appended::Full);
        }
        self.buf[..4].copy_from_slice(&ENTRY_MAGIC);
        self.buf[4..12].copy_from_slice(&self.store_id.to_le_bytes());
        self.buf[12..20].copy_from_slice(&self.epoch.to_le_bytes());
        self.buf[20..28].copy_from_slice(&self.seq.to_le_bytes());
        self.buf[28..32].copy_from_slice(&len.to_le_bytes());
        let crc = entry_crc(&self.buf[..ENTRY_HEADER], &self.buf[ENTRY_HEADER..]);
        self.buf[32..36].copy_from_slice(&crc.to_le_bytes());
        self.file.write(self.end, &self.buf)?;
        self.file.sync_data()?;
        self.end += total;
        self.seq += 1;
        Ok(Appended::Durable)
    }

    /// Starts `epoch`, once a checkpoint made it the store file's epoch: the header slot of
    /// `epoch` is written and synced, then entries are written from the start of the entry area.
    ///
    /// # Errors
    /// [`Error::Io`] if the write or the sync fails.
    pub(crate) fn restart(&mut self, epoch: u64) -> Result<()> {
        let mut slot = [0; SLOT_LEN];
        slot[..4].copy_from_slice(&SLOT_MAGIC);
        slot[4..8].copy_from_slice(&JOURNAL_VERSION.to_le_bytes());
        slot[8..16].copy_from_slice(&self.store_id.to_le_bytes());
        slot[16..24].copy_from_slice(&epoch.to_le_bytes());
        let crc = crc32fast::hash(&slot[..SLOT_LEN - 4]);
        slot[SLOT_LEN - 4..].copy_from_slice(&crc.to_le_bytes());
        // Never the slot of the recorded epoch: a torn write here must leave it intact.
        let i = match self.recorded_slot {
            Some(recorded) => 1 - recorded,
            None => usize::from(epoch % 2 == 1),
        };
        self.file.write(SLOTS[i], &slot)?;
        self.file.sync_data()?;
        self.written_slot = Some(i);
        self.epoch = epoch;
        self.end = ENTRIES_AT;
        self.seq = 0;
        Ok(())
    }

    /// The epoch the next checkpoint gives the store file, and the journal's length it
    /// records there (see `crate::file::commit::checkpoint`).
    pub(crate) fn next_epoch(&self) -> (u64, u64) {
        (self.epoch + 1, self.made)
    }

    /// The store file recorded the header write of [`Journal::restart`]: the next header write
    /// must leave that slot intact.
    pub(crate) fn header_recorded(&mut self) {
        self.recorded_slot = self.written_slot;
    }

    /// Bytes written into the current epoch.
    #[cfg(test)]
    pub(crate) fn used(&self) -> u64 {
        self.end - ENTRIES_AT
    }
}

fn put_gone(out: &mut Vec<u8>, gone: &Gone) {
    out.extend_from_slice(&gone.fence.to_le_bytes());
    // The deleted record's expiry, for the `expiry` table of store format 3: none since
    // format 4.
    put_option(out, None);
}

fn put_option(out: &mut Vec<u8>, value: Option<u64>) {
    match value {
        None => out.push(0),
        Some(v) => {
            out.push(1);
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
}

/// `[count u32]` then per op `[kind u8]` and its fields.
fn encode_ops(ops: &[Op], out: &mut Vec<u8>) {
    let count = u32::try_from(ops.len()).expect("a batch holds fewer than 2^32 ops");
    out.extend_from_slice(&count.to_le_bytes());
    for op in ops {
        match op {
            Op::Put {
                fence,
                value,
                expiry,
                replaces,
                // Not recorded: a replayed op deletes what it replaces, found or not.
                fresh: _,
            } => {
                out.push(PUT);
                out.extend_from_slice(&fence.to_le_bytes());
                // The scoped key, for the `expiry` table of store format 3: empty since format
                // 4 (the record's value carries the key).
                out.extend_from_slice(&0u16.to_le_bytes());
                let value_len = u32::try_from(value.len()).expect("records are bounded");
                out.extend_from_slice(&value_len.to_le_bytes());
                out.extend_from_slice(value);
                put_option(out, *expiry);
                match replaces {
                    None => out.push(0),
                    Some(gone) => {
                        out.push(1);
                        put_gone(out, gone);
                    }
                }
            }
            Op::Delete(gone) => {
                out.push(DELETE);
                put_gone(out, gone);
            }
        }
    }
}

/// A cursor over an entry's payload.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let Some((head, rest)) = self.0.split_at_checked(n) else {
            return Err("an op runs past the end of its entry".into());
        };
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }

    fn option(&mut self) -> Result<Option<u64>, String> {
        match self.u8()? {
            0 => Ok(None),
            1 => Ok(Some(self.u64()?)),
            other => Err(format!("an option tag of {other}")),
        }
    }

    fn gone(&mut self) -> Result<Gone, String> {
        let fence = self.u64()?;
        // An expiry written by a store of format 3; not needed since.
        self.option()?;
        Ok(Gone { fence })
    }
}

fn decode_ops(payload: &[u8], ops: &mut Vec<Op>) -> Result<(), String> {
    let mut r = Reader(payload);
    let count = u32::from_le_bytes(r.take(4)?.try_into().expect("4"));
    for _ in 0..count {
        let op = match r.u8()? {
            PUT => {
                let fence = r.u64()?;
                // Written by a store of format 3, for its expiry table; not needed since.
                let key_len = u16::from_le_bytes(r.take(2)?.try_into().expect("2"));
                r.take(usize::from(key_len))?;
                let value_len = u32::from_le_bytes(r.take(4)?.try_into().expect("4"));
                let value = r
                    .take(usize::try_from(value_len).expect("u32 fits usize"))?
                    .to_vec();
                let expiry = r.option()?;
                let replaces = match r.u8()? {
                    0 => None,
                    1 => Some(r.gone()?),
                    other => return Err(format!("a replaces tag of {other}")),
                };
                Op::Put {
                    fence,
                    value,
                    expiry,
                    replaces,
                    fresh: false,
                }
            }
            DELETE => Op::Delete(r.gone()?),
            other => return Err(format!("an op kind of {other}")),
        };
        ops.push(op);
    }
    if !r.0.is_empty() {
        return Err(format!("{} bytes after the last op", r.0.len()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulation::{CrashImage, SimDisk};

    fn ops(n: u64) -> Vec<Op> {
        (0..n)
            .map(|i| {
                if i % 3 == 2 {
                    Op::Delete(Gone { fence: i })
                } else {
                    Op::Put {
                        fence: i,
                        value: vec![u8::try_from(i % 256).unwrap(); usize::try_from(i).unwrap()],
                        expiry: (i % 2 == 0).then_some(i + 1),
                        replaces: (i % 4 == 1).then(|| Gone { fence: i - 1 }),
                        // What a replay decodes: the journal does not record it.
                        fresh: false,
                    }
                }
            })
            .collect()
    }

    fn debug(ops: &[Op]) -> String {
        format!("{ops:?}")
    }

    const STORE: u64 = 0x5707_e1d0;

    fn bound(epoch: u64) -> Binding {
        Binding {
            store_id: STORE,
            epoch,
            made: if epoch == 0 { 0 } else { 4096 },
            header_floor: epoch,
        }
    }

    /// A store file whose last checkpoint committed `epoch` but had not recorded its header.
    fn mid_checkpoint(epoch: u64) -> Binding {
        Binding {
            header_floor: epoch - 1,
            ..bound(epoch)
        }
    }

    fn recover(disk: &SimDisk, binding: Binding) -> Result<(Journal, Vec<Op>)> {
        Journal::recover(Box::new(disk.journal_backend()), binding, 4096)
    }

    fn open(disk: &SimDisk, epoch: u64) -> (Journal, Vec<Op>) {
        recover(disk, bound(epoch)).unwrap()
    }

    /// A new journal started at epoch 1, as the first open of a store leaves it.
    fn started() -> (SimDisk, Journal) {
        let disk = SimDisk::new();
        let (mut j, found) = open(&disk, 0);
        assert!(found.is_empty());
        assert_eq!(disk.journal_image().len(), 4096, "made at full size");
        j.restart(1).unwrap();
        (disk, j)
    }

    /// Overwrites journal bytes at `at`, durably.
    fn scribble(disk: &SimDisk, at: u64, bytes: &[u8]) {
        let file = disk.journal_backend();
        file.write(at, bytes).unwrap();
        file.sync_data().unwrap();
    }

    #[test]
    fn entries_of_the_epoch_come_back_in_order() {
        let (disk, mut j) = started();
        assert_eq!(j.append(&ops(7)).unwrap(), Appended::Durable);
        assert_eq!(j.append(&ops(3)).unwrap(), Appended::Durable);
        disk.crash(CrashImage::Durable);
        let (_, found) = open(&disk, 1);
        let mut expected = ops(7);
        expected.extend(ops(3));
        assert_eq!(debug(&found), debug(&expected));
        assert!(
            recover(&disk, mid_checkpoint(2)).unwrap().1.is_empty(),
            "a checkpoint whose header write was lost: its entries are in the store file"
        );
        // Once the store file recorded the header write, the same journal is an old copy.
        assert!(matches!(
            recover(&disk, bound(2)),
            Err(Error::JournalMismatch {
                journal_epoch: 1,
                store_epoch: 2,
                ..
            })
        ));
    }

    #[test]
    fn a_journal_of_another_life_is_refused() {
        let (disk, mut j) = started();
        j.append(&ops(3)).unwrap();
        // The store file rolled back to before the journal's epoch.
        match recover(&disk, bound(0)) {
            Err(Error::JournalMismatch {
                journal_epoch: 1,
                store_epoch: 0,
                ..
            }) => {}
            other => panic!("a store file older than its journal: {other:?}"),
        }
        // An old copy of the journal beside a newer store file.
        match recover(&disk, bound(3)) {
            Err(Error::JournalMismatch {
                journal_epoch: 1,
                store_epoch: 3,
                ..
            }) => {}
            other => panic!("a journal older than its store file: {other:?}"),
        }
    }

    #[test]
    fn another_stores_journal_is_refused_and_nothing_replayed() {
        let (disk, mut j) = started();
        j.append(&ops(3)).unwrap();
        let other = Binding {
            store_id: STORE + 1,
            ..bound(1)
        };
        match recover(&disk, other) {
            Err(Error::JournalMismatch {
                journal_store: STORE,
                store,
                ..
            }) => assert_eq!(store, STORE + 1),
            other => panic!("a foreign journal: {other:?}"),
        }
    }

    #[test]
    fn a_truncated_journal_is_refused_not_extended() {
        let (disk, mut j) = started();
        j.append(&ops(3)).unwrap();
        disk.journal_backend().set_len(2000).unwrap();
        match recover(&disk, bound(1)) {
            Err(Error::Corrupted {
                damaged: Damaged::Journal,
                reason,
            }) => assert!(reason.contains("truncated"), "{reason}"),
            other => panic!("a truncated journal: {other:?}"),
        }
        assert_eq!(disk.journal_image().len(), 2000, "left as it was found");
    }

    #[test]
    fn a_damaged_entry_followed_by_intact_ones_is_refused_not_the_end() {
        let (disk, mut j) = started();
        j.append(&ops(4)).unwrap();
        j.append(&ops(4)).unwrap();
        j.append(&ops(4)).unwrap();
        // One byte of the first entry's payload.
        scribble(&disk, ENTRIES_AT + ENTRY_HEADER as u64 + 9, &[0xee]);
        match recover(&disk, bound(1)) {
            Err(Error::Corrupted {
                damaged: Damaged::Journal,
                reason,
            }) => assert!(reason.contains("intact"), "{reason}"),
            other => panic!("damage before intact entries: {other:?}"),
        }
    }

    #[test]
    fn a_header_torn_at_its_checkpoint_leaves_the_previous_epoch() {
        let (disk, mut j) = started();
        j.append(&ops(2)).unwrap();
        // The checkpoint to epoch 2 committed, then its header write (slot 0) tore.
        scribble(&disk, 0, &[0xab; 20]);
        let (_, found) = recover(&disk, mid_checkpoint(2)).unwrap();
        assert!(found.is_empty(), "epoch 1's entries are in the store file");
        // Had epoch 2 entries been written, the header could not have torn: they refuse it.
        let (mut j, _) = recover(&disk, mid_checkpoint(2)).unwrap();
        j.restart(2).unwrap();
        j.append(&ops(2)).unwrap();
        scribble(&disk, 0, &[0xab; 20]);
        assert!(matches!(
            recover(&disk, mid_checkpoint(2)),
            Err(Error::Corrupted { .. })
        ));
    }

    /// Regression (found in review): entries were read only up to the configured capacity, so
    /// a store reopened with a smaller journal than the one holding its entries stopped short,
    /// and the search past the end refused the open.
    #[test]
    fn a_smaller_journal_size_still_replays_what_the_larger_journal_holds() {
        let disk = SimDisk::new();
        let (mut j, _) =
            Journal::recover(Box::new(disk.journal_backend()), bound(0), 16384).unwrap();
        j.restart(1).unwrap();
        for _ in 0..10 {
            assert_eq!(j.append(&ops(20)).unwrap(), Appended::Durable);
        }
        assert!(j.used() > 4096, "entries past the smaller size");
        let made = Binding {
            made: 16384,
            ..bound(1)
        };
        let (_, found) = Journal::recover(Box::new(disk.journal_backend()), made, 4096)
            .expect("a smaller journal size reads the whole file");
        assert_eq!(found.len(), 10 * 20);
    }

    /// Regression (found by the `crash_recovery` fuzz target): two checkpoints in a row whose
    /// header write was never recorded (each crashed after its commit) left the store file two
    /// epochs ahead of its last recorded header, and the open refused a journal that held
    /// nothing it lacked; with headers written by parity, the second write could even tear the
    /// slot of the recorded epoch. Header writes now avoid that slot, and any header from the
    /// recorded epoch up to the store file's is accepted.
    #[test]
    fn checkpoints_that_crashed_before_recording_their_header_leave_an_openable_journal() {
        let (disk, mut j) = started();
        j.append(&ops(3)).unwrap();
        let floor = |epoch, floor| Binding {
            header_floor: floor,
            ..bound(epoch)
        };
        let (mut j, _) = recover(&disk, floor(1, 1)).unwrap();
        for epoch in [2, 3, 4] {
            // The checkpoint to `epoch` committed; its header write tore.
            j.restart(epoch).unwrap();
            let torn = if j.written_slot == Some(0) { 0 } else { 512 };
            scribble(&disk, torn, &[0x5a; 20]);
            let (reopened, found) =
                recover(&disk, floor(epoch, 1)).unwrap_or_else(|e| panic!("epoch {epoch}: {e}"));
            assert!(found.is_empty(), "epoch 1's entries are in the store file");
            j = reopened;
        }
    }

    #[test]
    fn a_restarted_epoch_ignores_the_old_entries_after_its_own() {
        let (disk, mut j) = started();
        j.append(&ops(20)).unwrap();
        j.append(&ops(20)).unwrap();
        j.restart(2).unwrap();
        j.append(&ops(1)).unwrap();
        let (_, found) = open(&disk, 2);
        assert_eq!(debug(&found), debug(&ops(1)));
    }

    #[test]
    fn a_torn_or_unsynced_entry_ends_the_log() {
        for seed in 0..64 {
            let (disk, mut j) = started();
            j.append(&ops(5)).unwrap();
            disk.fail_sync_after(0, false);
            assert!(j.append(&ops(40)).is_err());
            disk.crash(CrashImage::Torn(seed));
            let (_, found) = open(&disk, 1);
            let text = debug(&found);
            assert!(
                text == debug(&ops(5)) || {
                    let mut all = ops(5);
                    all.extend(ops(40));
                    text == debug(&all)
                },
                "seed {seed}: a partial batch came back"
            );
        }
    }

    #[test]
    fn a_batch_that_does_not_fit_is_refused_whole() {
        let (disk, mut j) = started();
        let big = vec![Op::Put {
            fence: 1,
            value: vec![0; 5000],
            expiry: None,
            replaces: None,
            fresh: true,
        }];
        let events = disk.events();
        assert_eq!(j.append(&big).unwrap(), Appended::Full);
        assert_eq!(disk.events(), events, "nothing written");
        assert_eq!(j.used(), 0);
    }

    #[test]
    fn damaged_payloads_are_refused_not_misread() {
        let mut payload = Vec::new();
        encode_ops(&ops(6), &mut payload);
        for cut in 0..payload.len() {
            assert!(
                decode_ops(&payload[..cut], &mut Vec::new()).is_err(),
                "{cut}"
            );
        }
        let mut extra = payload.clone();
        extra.push(0);
        assert!(decode_ops(&extra, &mut Vec::new()).is_err());
        let mut decoded = Vec::new();
        decode_ops(&payload, &mut decoded).unwrap();
        assert_eq!(debug(&decoded), debug(&ops(6)));
    }
    /// A journal a store of format 3 wrote (each put carrying its scoped key, each deleted
    /// completion its expiry, both for the `expiry` table) replays into the same ops after the
    /// upgrade: the old fields are read past, not misread as the value.
    #[test]
    fn an_entry_written_by_format_3_decodes_to_the_same_ops() {
        let value = b"the record".to_vec();
        let mut old = Vec::new();
        old.extend_from_slice(&2u32.to_le_bytes());
        old.push(PUT);
        old.extend_from_slice(&7u64.to_le_bytes());
        let key = b"\x06tenant\x07POST /x\x02k7";
        old.extend_from_slice(&u16::try_from(key.len()).unwrap().to_le_bytes());
        old.extend_from_slice(key);
        old.extend_from_slice(&u32::try_from(value.len()).unwrap().to_le_bytes());
        old.extend_from_slice(&value);
        put_option(&mut old, Some(1_000));
        old.push(1);
        old.extend_from_slice(&3u64.to_le_bytes());
        put_option(&mut old, Some(900));
        old.push(DELETE);
        old.extend_from_slice(&5u64.to_le_bytes());
        put_option(&mut old, Some(950));
        let mut decoded = Vec::new();
        decode_ops(&old, &mut decoded).unwrap();
        let want = [
            Op::Put {
                fence: 7,
                value,
                expiry: Some(1_000),
                replaces: Some(Gone { fence: 3 }),
                fresh: false,
            },
            Op::Delete(Gone { fence: 5 }),
        ];
        assert_eq!(debug(&decoded), debug(&want));
    }
}
