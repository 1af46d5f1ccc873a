//! Disk space: a reserve that recovery can always use, and new claims refused before the
//! filesystem fills.
//!
//! Only one step of a store on a file needs new disk blocks: a redb commit, which writes the
//! journal's batches into the store file (the journal itself is allocated and zeroed when it
//! is made, so appending to it never needs space). The recovery at an open, a restart's or a
//! heal's, is such a commit: it replays the journal's current epoch (at most the journal's
//! capacity `J` of batches) and checkpoints it. Two rules make that commit always fit:
//!
//! 1. **The reserve.** `<store>-reserve` is a file of `R` bytes of allocated blocks
//!    (`fallocate(2)`), `R` = [`RESERVE_PER_JOURNAL`] × `J` unless
//!    [`crate::StoreBuilder::reserve_size`] says otherwise. An open that finds less than `R`
//!    bytes free deletes it before it touches the store file, so the replay has those blocks.
//!    Why `3 × J`: one epoch of batches written into redb took at most 2.04 × `J` of new
//!    blocks in every workload measured (64 KiB responses, whose values take a page order
//!    twice their size; 4 KiB responses 1.89; claims alone 1.16, on a store of 300,000 records
//!    too; `docs/design.md`, "A full disk").
//! 2. **Refusing before it is needed.** A claim that would write a record (a new key, a
//!    released or expired one, a takeover) is refused with [`Error::DiskFull`] while the
//!    reserve is not held or less than `R` bytes are free beside it: room for the next
//!    checkpoint. Nothing else is refused: replays, in-progress and mismatch answers read what
//!    is stored, and completions, releases and purges go on (a purge makes room). The free
//!    space is read (`statvfs(2)`) at most every [`RECHECK`]; when `2R` bytes are free again,
//!    the reserve is made anew and claims succeed, without a restart.
//!
//! If the disk fills anyway (another writer took the space, or completions of held claims
//! filled it), a checkpoint fails with ENOSPC and the store halts; its heal is an open, which
//! then finds less than `R` free and uses the reserve.

use crate::error::{Error, Result};
use crate::file::platform;
use crate::sync::{AtomicBool, AtomicU64, Mutex, Ordering};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The reserve's default size, in journals: what one epoch's commit can need, with margin.
pub(crate) const RESERVE_PER_JOURNAL: u64 = 3;

/// How long an open waits for the reserve's lock before it answers `AlreadyOpen`.
const LOCK_PATIENCE: Duration = Duration::from_secs(1);

/// How long a measurement of the free space is used before it is taken again.
pub(crate) const RECHECK: Duration = Duration::from_millis(20);

/// The disk bytes one byte of records is taken to need, to tell when a measurement is out of
/// date: above the 2.04 measured for a whole epoch (see [`RESERVE_PER_JOURNAL`]).
pub(crate) const GROWTH: u64 = 3;

/// The reserve file of the store at `store`: `<store>-reserve`.
pub(crate) fn reserve_path(store: &Path) -> PathBuf {
    platform::beside(store, "-reserve")
}

/// A store file's free space and its reserve.
///
/// The reserve file is also the store's first lock: it is created when missing and locked
/// (`flock(2)`, exclusive) before anything else is touched, so that an open of a store another
/// process holds cannot release that process's reserve. Released, it is truncated to nothing,
/// never deleted.
#[derive(Debug)]
pub(crate) struct Space {
    /// The directory of the store's files, whose filesystem is measured.
    dir: PathBuf,
    /// `R`.
    bytes: u64,
    /// The reserve file, locked; its lock is also held while the space is measured.
    file: Mutex<std::fs::File>,
    /// Whether the reserve file holds its `R` bytes.
    held: AtomicBool,
    /// The last measurement's verdict: claims that would write a record are refused.
    full: AtomicBool,
    /// The bytes free at the last measurement.
    available: AtomicU64,
    /// The bytes of records stored at the last measurement.
    at_bytes: AtomicU64,
    /// When the next measurement is due, in nanoseconds since `started`.
    due: AtomicU64,
    started: Instant,
}

impl Space {
    /// Locks the reserve of the store at `store` (creating an empty one if missing). `None` if
    /// no reserve is kept (`bytes` 0, or a system where the free space cannot be read).
    ///
    /// # Errors
    /// [`Error::AlreadyOpen`] if another handle holds it; [`Error::Io`] if the free space
    /// cannot be read or the file cannot be made.
    pub(crate) fn lock(store: &Path, bytes: u64) -> Result<Option<Space>> {
        let dir = platform::parent_dir(store).to_owned();
        if bytes == 0 || platform::available_bytes(&dir)?.is_none() {
            return Ok(None);
        }
        let reserve = reserve_path(store);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&reserve)?;
        // A lock belongs to the open file description, which a child process forked by another
        // thread shares until its exec closes it (close-on-exec): a store dropped and opened
        // again at that moment finds its own lock held for a few milliseconds. Found by the CLI
        // tests, which spawn processes while they reopen stores.
        let deadline = Instant::now() + LOCK_PATIENCE;
        while !platform::try_lock(&file)? {
            if Instant::now() >= deadline {
                return Err(Error::AlreadyOpen);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let held = file.metadata()?.len() >= bytes;
        Ok(Some(Space {
            dir,
            bytes,
            file: Mutex::new(file),
            held: AtomicBool::new(held),
            full: AtomicBool::new(false),
            available: AtomicU64::new(0),
            at_bytes: AtomicU64::new(0),
            due: AtomicU64::new(0),
            started: Instant::now(),
        }))
    }

    /// Before an open's recovery: releases the reserve if less than `R` bytes are free (the
    /// replay and its checkpoint may need them), or if it is short of `R` (a crash while it
    /// was made, a larger `reserve_size` than before). Returns whether it released it.
    ///
    /// # Errors
    /// [`Error::Io`] if the free space cannot be read or the reserve cannot be truncated.
    pub(crate) fn before_recovery(&self) -> Result<bool> {
        let file = self.file.lock();
        let available = platform::available_bytes(&self.dir)?.unwrap_or(0);
        let len = file.metadata()?.len();
        if len > 0 && (len < self.bytes || available < self.bytes) {
            file.set_len(0)?;
            self.held.store(false, Ordering::Release);
            return Ok(true);
        }
        Ok(false)
    }

    /// Whether the reserve file holds its bytes.
    fn held(&self) -> bool {
        self.held.load(Ordering::Acquire)
    }

    /// The reserve's size, `R`.
    pub(crate) fn reserve_bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether a claim that writes a record may go on, given the bytes of the records written
    /// so far (`written`). Measures the free space again if the last measurement is older than
    /// [`RECHECK`], or if the records grew enough since that it may be out of date (each byte of
    /// records counted as [`GROWTH`] bytes of disk); makes the reserve if it is missing and
    /// there is room for it and a checkpoint.
    ///
    /// # Errors
    /// [`Error::DiskFull`] if there is too little room; nothing was changed.
    pub(crate) fn admit(&self, written: u64) -> Result<()> {
        let now = self.now();
        let grown = written.saturating_sub(self.at_bytes.load(Ordering::Relaxed));
        let slack = self
            .available
            .load(Ordering::Relaxed)
            .saturating_sub(self.needed());
        let stale =
            now >= self.due.load(Ordering::Relaxed) || grown.saturating_mul(GROWTH) >= slack;
        if stale {
            // Measured by one caller at a time; the others go by the last verdict.
            if let Some(file) = self.file.try_lock() {
                self.measure_locked(&file, written);
            }
        }
        if self.full.load(Ordering::Acquire) {
            return Err(self.refusal());
        }
        Ok(())
    }

    /// Whether the last measurement refuses claims.
    pub(crate) fn is_full(&self) -> bool {
        self.full.load(Ordering::Acquire)
    }

    /// Measures the free space now and decides, with `written` bytes of records stored (after
    /// an open, and from [`Space::admit`]).
    pub(crate) fn measure(&self, written: u64) {
        let file = self.file.lock();
        self.measure_locked(&file, written);
    }

    fn measure_locked(&self, file: &std::fs::File, written: u64) {
        let free = || platform::available_bytes(&self.dir);
        let Ok(Some(mut available)) = free() else {
            // Unreadable now: the last verdict stands.
            return;
        };
        let mut held = self.held.load(Ordering::Acquire);
        if !held && available >= self.bytes.saturating_mul(2) {
            held = make(file, self.bytes).is_ok();
            self.held.store(held, Ordering::Release);
            available = free().ok().flatten().unwrap_or(0);
        }
        self.available.store(available, Ordering::Relaxed);
        self.at_bytes.store(written, Ordering::Relaxed);
        let next = self
            .now()
            .saturating_add(u64::try_from(RECHECK.as_nanos()).unwrap_or(u64::MAX));
        self.due.store(next, Ordering::Relaxed);
        self.full
            .store(!held || available < self.bytes, Ordering::Release);
    }

    /// The free space claims need: `R` beside the reserve, `2R` while it is missing.
    fn needed(&self) -> u64 {
        if self.held() {
            self.bytes
        } else {
            self.bytes.saturating_mul(2)
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// The error a refused claim gets.
    fn refusal(&self) -> Error {
        Error::DiskFull {
            available: self.available.load(Ordering::Relaxed),
            needed: self.needed(),
        }
    }
}

/// Gives the reserve file its blocks, then flushes its size. A failure (ENOSPC) truncates
/// what was made.
fn make(file: &std::fs::File, bytes: u64) -> std::io::Result<()> {
    let made = platform::allocate(file, bytes).and_then(|()| file.sync_all());
    if made.is_err() {
        let _ = file.set_len(0);
    }
    made
}
