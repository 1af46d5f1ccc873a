//! A simulated disk for crash tests and fuzzing, not part of the stable API: it exists only
//! under `cfg(test)`, `cfg(fuzzing)` or the `simulation` feature.
//!
//! [`SimDisk`] holds two files, the redb file and the store's journal, and keeps for each what a
//! real disk keeps: the image as of its last `sync_data` (what survives a power loss for
//! certain) and the writes issued since, in order. Events and faults count across both files. A [`SimDisk::crash`] rebuilds
//! the file from the durable image plus a chosen subset of those unsynced writes — none, all,
//! some, or some torn at 512-byte sectors — as a power loss may leave it. It can also cut the
//! power after a given number of I/O events (every later call fails, as if the machine were
//! off) and fail the N-th write or sync, once or for good.
//!
//! A failed sync behaves as Linux's page cache does: the writes it covered stay readable (the
//! cache still holds them) but are never written by a later sync (their pages were marked clean
//! with the error), so what reads see and what the disk holds part ways. Only dropping the cache
//! ([`SimDisk::drop_cache`], `posix_fadvise(POSIX_FADV_DONTNEED)` on a real disk) makes reads
//! see the disk again.

mod charge;
mod rng;
#[cfg(test)]
mod tests;

pub use charge::{charge, CHARGE_MAX, CHARGE_MIN};
pub use rng::{mix, SplitMix64};

use crate::sync::{Arc, Mutex};
use redb::StorageBackend;

/// The sector size torn writes are cut at.
pub const SECTOR: usize = 512;

/// Which of the writes issued since the last sync a crash keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashImage {
    /// None of them: exactly the durable image.
    Durable,
    /// All of them, as if the cache had been flushed just before the power went.
    All,
    /// Each independently, chosen by the bits of a seeded generator.
    Subset(u64),
    /// Each independently, and of each kept write only some of its sectors.
    Torn(u64),
}

/// What fails, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Fault {
    #[default]
    None,
    /// Every call once `events` reaches this: the power is off.
    PowerCut { at: u64 },
    /// The write numbered `nth` (counting writes only) fails; `forever`: and every later one.
    Write { nth: u64, forever: bool },
    /// The sync numbered `nth` fails; `forever`: and every later one.
    Sync { nth: u64, forever: bool },
    /// The write numbered `nth` panics, as redb does on some damaged pages.
    PanicWrite { nth: u64 },
    /// Every read of the store file panics, as redb does on some damaged pages it reads.
    PanicRead,
}

#[derive(Debug, Clone)]
enum Pending {
    Write { offset: usize, data: Vec<u8> },
    SetLen(usize),
}

/// One file of the disk.
#[derive(Debug, Clone, Default)]
struct Image {
    durable: Vec<u8>,
    live: Vec<u8>,
    unsynced: Vec<Pending>,
    /// How many of the first `unsynced` writes a failed sync covered: no later sync writes them.
    failed: usize,
}

/// Which file a backend reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FileId {
    Database = 0,
    Journal = 1,
}

#[derive(Debug, Default)]
struct Disk {
    files: [Image; 2],
    /// Writes, syncs and length changes issued so far, to either file (reads are not events).
    events: u64,
    writes: u64,
    syncs: u64,
    fault: Fault,
}

/// A disk shared by the backends opened on it, one store at a time.
#[derive(Debug, Clone, Default)]
pub struct SimDisk(Arc<Mutex<Disk>>);

impl SimDisk {
    /// An empty disk.
    pub fn new() -> SimDisk {
        SimDisk::default()
    }

    /// A disk whose database file's durable image is `image` (and whose journal is empty), for
    /// opening arbitrary bytes.
    pub fn from_image(image: Vec<u8>) -> SimDisk {
        let disk = SimDisk::default();
        disk.0.lock().files[FileId::Database as usize] = Image {
            live: image.clone(),
            durable: image,
            ..Image::default()
        };
        disk
    }

    /// A disk holding `store` as the database file and `journal` as its journal, both durable.
    pub fn from_images(store: Vec<u8>, journal: Vec<u8>) -> SimDisk {
        let disk = SimDisk::from_image(store);
        disk.0.lock().files[FileId::Journal as usize] = Image {
            live: journal.clone(),
            durable: journal,
            ..Image::default()
        };
        disk
    }

    /// A backend for `redb` over the database file.
    pub fn backend(&self) -> SimBackend {
        SimBackend(self.clone(), FileId::Database)
    }

    /// A backend over the journal file.
    pub fn journal_backend(&self) -> SimBackend {
        SimBackend(self.clone(), FileId::Journal)
    }

    /// The database file's live image (what reads see now).
    pub fn image(&self) -> Vec<u8> {
        self.0.lock().files[FileId::Database as usize].live.clone()
    }

    /// The journal file's live image.
    pub fn journal_image(&self) -> Vec<u8> {
        self.0.lock().files[FileId::Journal as usize].live.clone()
    }

    /// The database file's live length, without copying its image.
    pub fn image_len(&self) -> u64 {
        self.0.lock().files[FileId::Database as usize].live.len() as u64
    }

    /// The journal file's live length, without copying its image.
    pub fn journal_len(&self) -> u64 {
        self.0.lock().files[FileId::Journal as usize].live.len() as u64
    }

    /// Writes, syncs and length changes issued so far.
    pub fn events(&self) -> u64 {
        self.0.lock().events
    }

    /// Syncs issued so far.
    pub fn syncs(&self) -> u64 {
        self.0.lock().syncs
    }

    /// Writes and length changes issued since the last sync of their file.
    pub fn unsynced(&self) -> usize {
        self.0.lock().files.iter().map(|f| f.unsynced.len()).sum()
    }

    /// Cuts the power once `more` further events have been issued: from then on every call
    /// fails and changes nothing.
    pub fn cut_power_after(&self, more: u64) {
        let mut d = self.0.lock();
        d.fault = Fault::PowerCut {
            at: d.events + more,
        };
    }

    /// Fails the write `more` writes from now; with `forever`, every write after it too (a full
    /// disk).
    pub fn fail_write_after(&self, more: u64, forever: bool) {
        let mut d = self.0.lock();
        d.fault = Fault::Write {
            nth: d.writes + more,
            forever,
        };
    }

    /// Panics in the write `more` writes from now, standing in for a storage engine that
    /// panics on damaged pages.
    pub fn panic_on_write_after(&self, more: u64) {
        let mut d = self.0.lock();
        d.fault = Fault::PanicWrite {
            nth: d.writes + more,
        };
    }

    /// Panics in every read of the store file from now (not of the journal), standing in for
    /// a storage engine that panics on a damaged page it reads.
    pub fn panic_on_read(&self) {
        self.0.lock().fault = Fault::PanicRead;
    }

    /// Fails the sync `more` syncs from now; with `forever`, every sync after it too.
    pub fn fail_sync_after(&self, more: u64, forever: bool) {
        let mut d = self.0.lock();
        d.fault = Fault::Sync {
            nth: d.syncs + more,
            forever,
        };
    }

    /// The disk works again: no fault is armed (the power stays on).
    pub fn clear_faults(&self) {
        self.0.lock().fault = Fault::None;
    }

    /// Drops the page cache, as `posix_fadvise(POSIX_FADV_DONTNEED)` does: writes that a failed
    /// sync covered (clean pages that never reached the disk) vanish from what reads see; writes
    /// not yet synced (dirty pages) stay.
    pub fn drop_cache(&self) {
        for file in &mut self.0.lock().files {
            file.drop_cache();
        }
    }

    /// Whether reads of either file see writes that a failed sync covered.
    pub fn cache_differs_from_disk(&self) -> bool {
        self.0.lock().files.iter().any(|f| f.failed > 0)
    }

    /// A power loss: each file becomes its durable image plus the unsynced writes `image`
    /// chooses, which then counts as durable; faults are cleared (the machine reboots).
    pub fn crash(&self, image: CrashImage) {
        let mut d = self.0.lock();
        let mut rng = SplitMix64::new(match image {
            CrashImage::Subset(seed) | CrashImage::Torn(seed) => seed,
            _ => 0,
        });
        for file in &mut d.files {
            file.crash(image, &mut rng);
        }
        d.fault = Fault::None;
    }

    /// Opens the file with plain redb and runs its integrity check: `Ok(true)` when redb found
    /// nothing to repair. The disk must not be open in a store.
    ///
    /// # Errors
    /// Whatever redb reports for a file it cannot open.
    pub fn redb_integrity(&self) -> Result<bool, redb::Error> {
        let mut db = redb::Builder::new().create_with_backend(self.backend())?;
        Ok(db.check_integrity()?)
    }
}

impl Image {
    /// `durable` with the writes not yet synced and not covered by a failed sync.
    fn cached_dirty_on_durable(&self) -> Vec<u8> {
        let mut image = self.durable.clone();
        for p in &self.unsynced[self.failed..] {
            p.apply(&mut image);
        }
        image
    }

    /// The writes a failed sync covered are dropped, the others applied to `durable` in place:
    /// a sync costs what it writes, not the file's size.
    fn sync(&mut self) {
        for p in self.unsynced.drain(..).skip(self.failed) {
            p.apply(&mut self.durable);
        }
        self.failed = 0;
    }

    fn drop_cache(&mut self) {
        self.live = self.cached_dirty_on_durable();
        self.unsynced.drain(..self.failed);
        self.failed = 0;
    }

    fn crash(&mut self, image: CrashImage, rng: &mut SplitMix64) {
        let mut rebuilt = self.durable.clone();
        for p in std::mem::take(&mut self.unsynced) {
            let keep = match image {
                CrashImage::Durable => false,
                CrashImage::All => true,
                CrashImage::Subset(_) | CrashImage::Torn(_) => rng.next_u64() & 1 == 1,
            };
            if !keep {
                continue;
            }
            match p {
                Pending::SetLen(len) => rebuilt.resize(len, 0),
                Pending::Write { offset, data } => {
                    for (i, sector) in data.chunks(SECTOR).enumerate() {
                        if matches!(image, CrashImage::Torn(_)) && rng.next_u64() & 1 == 0 {
                            continue;
                        }
                        put(&mut rebuilt, offset + i * SECTOR, sector);
                    }
                }
            }
        }
        self.live = rebuilt.clone();
        self.durable = rebuilt;
        self.failed = 0;
    }
}

impl Pending {
    fn apply(&self, image: &mut Vec<u8>) {
        match self {
            Pending::SetLen(len) => image.resize(*len, 0),
            Pending::Write { offset, data } => put(image, *offset, data),
        }
    }
}

fn put(image: &mut Vec<u8>, offset: usize, data: &[u8]) {
    let end = offset + data.len();
    if image.len() < end {
        image.resize(end, 0);
    }
    image[offset..end].copy_from_slice(data);
}

fn power_is_off() -> std::io::Error {
    std::io::Error::other("simulated power loss")
}

fn injected() -> std::io::Error {
    std::io::Error::other("simulated I/O fault")
}

impl Disk {
    /// Counts an event, or refuses it if the power is off.
    fn event(&mut self) -> std::io::Result<()> {
        if let Fault::PowerCut { at } = self.fault {
            if self.events >= at {
                return Err(power_is_off());
            }
        }
        self.events += 1;
        Ok(())
    }
}

/// A backend over one file of a [`SimDisk`].
#[derive(Debug)]
pub struct SimBackend(SimDisk, FileId);

fn offset(o: u64) -> std::io::Result<usize> {
    usize::try_from(o).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
}

impl StorageBackend for SimBackend {
    fn len(&self) -> Result<u64, std::io::Error> {
        Ok(self.0 .0.lock().files[self.1 as usize].live.len() as u64)
    }

    fn read(&self, at: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        let d = self.0 .0.lock();
        if matches!(d.fault, Fault::PowerCut { at } if d.events >= at) {
            return Err(power_is_off());
        }
        if d.fault == Fault::PanicRead && self.1 == FileId::Database {
            drop(d);
            panic!("simulated storage engine panic on a read");
        }
        let start = offset(at)?;
        let src = start
            .checked_add(out.len())
            .and_then(|end| d.files[self.1 as usize].live.get(start..end))
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
        out.copy_from_slice(src);
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        let len = offset(len)?;
        let mut d = self.0 .0.lock();
        d.event()?;
        let file = &mut d.files[self.1 as usize];
        file.live.resize(len, 0);
        file.unsynced.push(Pending::SetLen(len));
        Ok(())
    }

    fn sync_data(&self) -> Result<(), std::io::Error> {
        let mut d = self.0 .0.lock();
        d.event()?;
        let n = d.syncs;
        d.syncs += 1;
        let file = self.1 as usize;
        if let Fault::Sync { nth, forever } = d.fault {
            if n == nth || (forever && n > nth) {
                let file = &mut d.files[file];
                file.failed = file.unsynced.len();
                return Err(injected());
            }
        }
        d.files[file].sync();
        Ok(())
    }

    fn write(&self, at: u64, data: &[u8]) -> Result<(), std::io::Error> {
        let start = offset(at)?;
        let mut d = self.0 .0.lock();
        d.event()?;
        let n = d.writes;
        d.writes += 1;
        if let Fault::Write { nth, forever } = d.fault {
            if n == nth || (forever && n > nth) {
                return Err(injected());
            }
        }
        if d.fault == (Fault::PanicWrite { nth: n }) {
            drop(d);
            panic!("simulated storage engine panic");
        }
        let file = &mut d.files[self.1 as usize];
        put(&mut file.live, start, data);
        file.unsynced.push(Pending::Write {
            offset: start,
            data: data.to_vec(),
        });
        Ok(())
    }
}

impl SimDisk {
    /// An independent copy of this disk in its current state (live image, durable image and
    /// unsynced writes), so one pre-crash state can be crashed several ways.
    pub fn fork(&self) -> SimDisk {
        let d = self.0.lock();
        SimDisk(Arc::new(Mutex::new(Disk {
            files: d.files.clone(),
            events: d.events,
            writes: d.writes,
            syncs: d.syncs,
            fault: Fault::None,
        })))
    }
}
