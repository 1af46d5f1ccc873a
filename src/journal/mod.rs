//! The journal: an append-only log in front of the redb file. A batch is durable once it is
//! written at the journal's end and the journal is `fdatasync`ed: one sequential write into a
//! file whose blocks were allocated and zeroed when it was created, so the sync flushes data
//! blocks and no file-system metadata. redb then applies the batch without syncing
//! (`Durability::None`), and readers see it at once.
//!
//! A **checkpoint** is a durable redb commit (`fdatasync` of the redb file) that also raises the
//! journal **epoch** stored in the redb file's `meta` table; from then on every entry of the old
//! epoch is dead and the journal is written again from offset 0. A batch that does not fit in
//! what is left of the journal is committed that way, directly into redb.
//!
//! On open, the entries of the current epoch are read in order (each must carry the next
//! sequence number and a good crc32; the first that does not ends the log: a batch torn by a
//! crash was never acknowledged), applied to redb in one durable commit that also raises the
//! epoch, and only then is the index built. Every op is idempotent (keyed by fence), so
//! applying an entry that redb already holds changes nothing.
//!
//! Entry: `[magic "IDJ1"][epoch u64][seq u64][payload length u32][crc32 u32][payload]`, all
//! little-endian; the crc covers the 24 header bytes before it and the payload.
//! `docs/format.md` lists the payload's op encoding.

pub(crate) mod file;

use crate::disk::{Gone, Op};
use crate::error::{Damaged, Error, Result};
use redb::StorageBackend;

const MAGIC: [u8; 4] = *b"IDJ1";
const HEADER: usize = 28;
/// Zeroes are written in chunks of this size when a journal file is created.
const ZERO_CHUNK: usize = 1 << 20;

const PUT: u8 = 1;
const DELETE: u8 = 2;

/// The journal of one store; owned by whoever leads commits.
pub(crate) struct Journal {
    file: Box<dyn StorageBackend>,
    capacity: u64,
    epoch: u64,
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

impl Journal {
    /// Opens the journal in `file`, first growing it to `capacity` with zeroes (synced) if it is
    /// shorter, and returns the ops of `epoch`'s entries in order. Epoch 0 never has entries.
    ///
    /// # Errors
    /// [`Error::Io`] from the file; [`Error::Corrupted`] for an entry whose crc is good but
    /// whose ops do not decode (only a bug writes one).
    pub(crate) fn open(
        file: Box<dyn StorageBackend>,
        capacity: u64,
        epoch: u64,
    ) -> Result<(Journal, Vec<Op>)> {
        let len = file.len()?;
        if len < capacity {
            let zeroes = vec![0; ZERO_CHUNK];
            let mut at = len;
            while at < capacity {
                let n = usize::try_from((capacity - at).min(ZERO_CHUNK as u64))
                    .expect("a chunk fits usize");
                file.write(at, &zeroes[..n])?;
                at += n as u64;
            }
            file.sync_data()?;
        }
        let mut journal = Journal {
            file,
            capacity,
            epoch,
            end: 0,
            seq: 0,
            buf: Vec::new(),
        };
        let mut ops = Vec::new();
        if epoch > 0 {
            while let Some(entry) = journal.read_entry()? {
                decode_ops(&entry, &mut ops).map_err(|why| Error::Corrupted {
                    damaged: Damaged::Journal,
                    reason: format!("entry {} of epoch {epoch}: {why}", journal.seq),
                })?;
                journal.end += (HEADER + entry.len()) as u64;
                journal.seq += 1;
            }
        }
        Ok((journal, ops))
    }

    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The payload of the entry at `end` if it is the next one of this epoch, intact.
    fn read_entry(&self) -> Result<Option<Vec<u8>>> {
        if self.end + HEADER as u64 > self.capacity {
            return Ok(None);
        }
        let mut header = [0; HEADER];
        self.file.read(self.end, &mut header)?;
        let field = |at: usize| u64::from_le_bytes(header[at..at + 8].try_into().expect("8"));
        let len = u32::from_le_bytes(header[20..24].try_into().expect("4"));
        let crc = u32::from_le_bytes(header[24..28].try_into().expect("4"));
        if header[..4] != MAGIC
            || field(4) != self.epoch
            || field(12) != self.seq
            || self.end + (HEADER as u64) + u64::from(len) > self.capacity
        {
            return Ok(None);
        }
        let mut payload = vec![0; usize::try_from(len).expect("u32 fits usize")];
        self.file.read(self.end + HEADER as u64, &mut payload)?;
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&header[..24]);
        hasher.update(&payload);
        Ok((hasher.finalize() == crc).then_some(payload))
    }

    /// Appends `ops` as one entry and syncs the file.
    ///
    /// # Errors
    /// [`Error::Io`] if the write or the sync fails; the batch may or may not be durable then.
    pub(crate) fn append(&mut self, ops: &[Op]) -> Result<Appended> {
        self.buf.clear();
        self.buf.extend_from_slice(&[0; HEADER]);
        encode_ops(ops, &mut self.buf);
        let total = self.buf.len() as u64;
        let Ok(len) = u32::try_from(self.buf.len() - HEADER) else {
            return Ok(Appended::Full);
        };
        if self.end + total > self.capacity {
            return Ok(Appended::Full);
        }
        self.buf[..4].copy_from_slice(&MAGIC);
        self.buf[4..12].copy_from_slice(&self.epoch.to_le_bytes());
        self.buf[12..20].copy_from_slice(&self.seq.to_le_bytes());
        self.buf[20..24].copy_from_slice(&len.to_le_bytes());
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&self.buf[..24]);
        hasher.update(&self.buf[HEADER..]);
        self.buf[24..28].copy_from_slice(&hasher.finalize().to_le_bytes());
        self.file.write(self.end, &self.buf)?;
        self.file.sync_data()?;
        self.end += total;
        self.seq += 1;
        Ok(Appended::Durable)
    }

    /// Starts `epoch` at offset 0, once a checkpoint made it the redb file's epoch.
    pub(crate) fn restart(&mut self, epoch: u64) {
        self.epoch = epoch;
        self.end = 0;
        self.seq = 0;
    }

    /// Bytes written into the current epoch.
    #[cfg(test)]
    pub(crate) fn used(&self) -> u64 {
        self.end
    }
}

fn put_gone(out: &mut Vec<u8>, gone: &Gone) {
    out.extend_from_slice(&gone.fence.to_le_bytes());
    put_option(out, gone.expiry);
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
                key,
                value,
                expiry,
                replaces,
            } => {
                out.push(PUT);
                out.extend_from_slice(&fence.to_le_bytes());
                let key_len = u16::try_from(key.len()).expect("scoped keys are bounded");
                out.extend_from_slice(&key_len.to_le_bytes());
                out.extend_from_slice(key);
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
        Ok(Gone {
            fence: self.u64()?,
            expiry: self.option()?,
        })
    }
}

fn decode_ops(payload: &[u8], ops: &mut Vec<Op>) -> Result<(), String> {
    let mut r = Reader(payload);
    let count = u32::from_le_bytes(r.take(4)?.try_into().expect("4"));
    for _ in 0..count {
        let op = match r.u8()? {
            PUT => {
                let fence = r.u64()?;
                let key_len = u16::from_le_bytes(r.take(2)?.try_into().expect("2"));
                let key = r.take(usize::from(key_len))?.into();
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
                    key,
                    value,
                    expiry,
                    replaces,
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
                    Op::Delete(Gone {
                        fence: i,
                        expiry: Some(i * 10),
                    })
                } else {
                    Op::Put {
                        fence: i,
                        key: format!("key{i}").into_bytes().into(),
                        value: vec![u8::try_from(i % 256).unwrap(); usize::try_from(i).unwrap()],
                        expiry: (i % 2 == 0).then_some(i + 1),
                        replaces: (i % 4 == 1).then_some(Gone {
                            fence: i - 1,
                            expiry: None,
                        }),
                    }
                }
            })
            .collect()
    }

    fn debug(ops: &[Op]) -> String {
        format!("{ops:?}")
    }

    fn open(disk: &SimDisk, epoch: u64) -> (Journal, Vec<Op>) {
        Journal::open(Box::new(disk.journal_backend()), 4096, epoch).unwrap()
    }

    #[test]
    fn entries_of_the_epoch_come_back_in_order() {
        let disk = SimDisk::new();
        let (mut j, found) = open(&disk, 1);
        assert!(found.is_empty());
        assert_eq!(disk.journal_image().len(), 4096, "created at full size");
        assert_eq!(j.append(&ops(7)).unwrap(), Appended::Durable);
        assert_eq!(j.append(&ops(3)).unwrap(), Appended::Durable);
        disk.crash(CrashImage::Durable);
        let (_, found) = open(&disk, 1);
        let mut expected = ops(7);
        expected.extend(ops(3));
        assert_eq!(debug(&found), debug(&expected));
        assert!(
            open(&disk, 2).1.is_empty(),
            "another epoch's entries are dead"
        );
        assert!(open(&disk, 0).1.is_empty(), "epoch 0 has no entries");
    }

    #[test]
    fn a_restarted_epoch_ignores_the_old_entries_after_its_own() {
        let disk = SimDisk::new();
        let (mut j, _) = open(&disk, 1);
        j.append(&ops(20)).unwrap();
        j.append(&ops(20)).unwrap();
        j.restart(2);
        j.append(&ops(1)).unwrap();
        let (_, found) = open(&disk, 2);
        assert_eq!(debug(&found), debug(&ops(1)));
    }

    #[test]
    fn a_torn_or_unsynced_entry_ends_the_log() {
        for seed in 0..64 {
            let disk = SimDisk::new();
            let (mut j, _) = open(&disk, 1);
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
        let disk = SimDisk::new();
        let (mut j, _) = open(&disk, 1);
        let big = vec![Op::Put {
            fence: 1,
            key: Box::new([1]),
            value: vec![0; 5000],
            expiry: None,
            replaces: None,
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
}
