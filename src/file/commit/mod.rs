//! Group commit. Callers queue their ops and wait; whichever waiter finds no commit running
//! becomes the leader, takes everything queued, makes it durable as one batch (one journal
//! entry and one `fdatasync` of the journal; or, when the journal is full or absent, one
//! durable redb commit: a checkpoint), and wakes the callers it made durable plus one caller of
//! the next batch. A lone caller commits on its own thread, with no hand-off.
//!
//! A journaled batch is answered once the journal's `fdatasync` returns, before redb holds it:
//! the `idemdb-apply` thread applies journaled batches to redb in order (`Durability::None`,
//! several waiting batches in one transaction) while the next batch is being synced. Reads of
//! the redb file first wait until every answered batch is applied ([`Shared::read`]), so no
//! reader sees the file behind what a caller was told. A store on the simulated disk applies
//! each batch on the leader's thread right after answering it, so that its I/O happens in one
//! order and a seed replays a run exactly.
//!
//! Async callers never block their executor thread on an fsync: they register a waker and a
//! `idemdb-flush` thread, started on first use, leads commits while any async caller waits.
//! Sync leaders wake async waiters too, so both kinds share batches. Ops nobody waits for (a
//! withdrawn claim's release) are handed to the same thread ([`Pipeline::commit_soon`]), and a
//! store closed cleanly commits what is still queued, applies it, and checkpoints.
//!
//! Invariants:
//! - an op's sequence number is below `durable` only once the batch holding it is fsynced (in
//!   the journal, or in a durable redb commit);
//! - `applied <= durable`: an op is below `applied` once redb holds it; the applier applies
//!   batches in queue order, and a checkpoint starts only once every earlier batch is applied;
//! - after a failed commit the pipeline is halted: queued and later ops fail, and nothing is
//!   acknowledged again through it (fail-stop; redb also refuses further writes after an I/O
//!   error). A failed apply halts it too: what it answered is in the journal, which the reopen
//!   replays. The store heals by reopening the file into a new pipeline (`heal.rs`), once this
//!   one has let go of its files ([`Shared::release_files`]).
//!
//! The rooms: this file is the pipeline's shared state and its life (halt, release, close);
//! `leader.rs` queues ops and leads group commits; `applier.rs` applies journaled batches to
//! redb and makes readers wait for them; `flusher.rs` commits for async callers;
//! `checkpoint.rs` is the one durable redb commit that lets the journal start over.

mod applier;
mod checkpoint;
mod flusher;
mod leader;

use crate::error::{Error, Result};
use crate::file::batch::{FileState, Op};
use crate::file::commit::applier::{APPLIER_NAME, APPLY_PACE};
use crate::file::commit::flusher::FlushSignal;
use crate::file::commit::leader::Writer;
use crate::file::journal::Journal;
use crate::observe::Observer;
use crate::sync::{Arc, AtomicBool, AtomicU64, Condvar, Mutex, MutexGuard, Once, Ordering, RwLock};
use redb::Database;
use std::collections::{HashSet, VecDeque};
use std::task::Waker;
use std::thread::JoinHandle;

pub(crate) use checkpoint::checkpoint;

/// The commit pipeline of one store file. Everything the applier thread shares with callers
/// is in [`Shared`]; the pipeline owns that thread and stops it when dropped.
pub(crate) struct Pipeline {
    shared: Arc<Shared>,
    /// The `idemdb-apply` thread; `None` for a store that applies on the leader's thread.
    applier: Mutex<Option<JoinHandle<()>>>,
}

impl std::ops::Deref for Pipeline {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.shared
    }
}

pub(crate) struct Shared {
    /// `None` once released after a halt ([`Shared::release_files`]) and while dropping. A
    /// read, a commit or an apply holds it shared for its duration.
    db: RwLock<Option<Database>>,
    /// A commit panicked inside redb, leaving its locks poisoned.
    poisoned: AtomicBool,
    state: Mutex<State>,
    /// Callers whose op is in an odd / even numbered batch wait on `done[batch & 1]`: a commit
    /// wakes the callers it made durable, and one caller of the next batch to lead it, instead
    /// of every waiter (half of whom would only go back to sleep).
    done: [Condvar; 2],
    /// What the applier shares with the leader and with readers (never locked while `state`
    /// is wanted: the lock order is `state`, then `apply`).
    apply: Mutex<Applying>,
    /// Signalled when `applied` moves, or the pipeline halts: readers and checkpoints wait
    /// here for the applier.
    applied_signal: Condvar,
    /// Signalled when the applier is wanted: a batch joined the backlog while it slept, a
    /// reader waits for it, or it is to exit.
    backlog_signal: Condvar,
    /// `State::durable`, readable without the lock.
    durable_seq: AtomicU64,
    /// Every op numbered below this is in the redb file. Raised only under `apply`; read
    /// without a lock by a read, which waits only when `durable_seq` is ahead of it.
    applied_seq: AtomicU64,
    halted: AtomicBool,
    batches: AtomicU64,
    /// The bytes of every record's value in the file as of the last apply (changed only under
    /// `apply`).
    record_bytes: AtomicU64,
    /// The bytes of the values the backlog's batches write (removals not subtracted).
    backlog_put_bytes: AtomicU64,
    checkpoints: Arc<AtomicU64>,
    /// The fence reservation and the head hashing: whoever writes to redb holds it (the
    /// applier, or the leader of a checkpoint).
    file: Mutex<FileState>,
    /// Journaled batches are applied by the `idemdb-apply` thread (not on the leader's).
    background: bool,
    /// Held by a test to keep the applier from applying.
    #[cfg(test)]
    pub(crate) apply_gate: Mutex<()>,
    flusher: Arc<FlushSignal>,
    flusher_started: Once,
    /// Called once the pipeline halts, so that waiters see the error.
    on_halt: Box<dyn Fn() + Send + Sync>,
    observer: Observer,
}

struct State {
    queue: Vec<Op>,
    /// Sequence number the next queued op gets.
    next: u64,
    /// Every op numbered below this is durable.
    durable: u64,
    committing: bool,
    /// Batches started; the running one, while `committing`.
    batch: u64,
    /// The sequence number the running batch ends before.
    committing_upto: u64,
    halted: Option<String>,
    /// Once halted: the fences the ops of every batch that did not become durable write or
    /// delete (the failed batch, and what was queued behind it). A key whose slot has none of
    /// them holds what the disk holds (`Pipeline::answers_from`).
    undurable: HashSet<u64>,
    /// Only the leader touches it; `None` while a commit runs.
    writer: Option<Writer>,
    /// Async callers waiting for their op: (sequence number, waker).
    wakers: Vec<(u64, Waker)>,
}

/// The batches between the journal and redb.
struct Applying {
    /// Durable batches redb does not hold yet, oldest first.
    backlog: VecDeque<Journaled>,
    /// The applier is applying batches it took from `backlog`.
    busy: bool,
    /// The applier sleeps until woken: the backlog was empty for [`APPLY_DELAY`].
    idle: bool,
    /// The applier exits once `backlog` is empty.
    exit: bool,
    /// A reader or a checkpoint waits for the backlog to be applied: apply it now.
    wanted: bool,
    /// [`APPLY_PACE`], or what a test sets.
    pace: std::time::Duration,
}

/// A batch the journal holds and redb does not yet.
struct Journaled {
    ops: Vec<Op>,
    /// The sequence number the batch ends before.
    upto: u64,
    /// The bytes of the values its puts write.
    put_bytes: u64,
}

/// How the leader made a batch durable.
enum Made {
    /// In the journal: redb is still to apply it.
    Journaled,
    /// In a durable redb commit, which holds every batch before it too; changed the records'
    /// bytes by this much.
    Committed(i64),
}

/// A queued op's place in line; redeem it with [`Pipeline::wait`] or [`Pipeline::durable`].
#[must_use = "an op is not durable until its ticket is waited on"]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seq(u64);

fn halted(cause: &str) -> Error {
    Error::Halted {
        cause: cause.to_owned(),
    }
}

impl Pipeline {
    /// `background`: journaled batches are applied by an `idemdb-apply` thread of the
    /// pipeline's own; otherwise by the leader, right after it answered them.
    pub(crate) fn new(
        db: Database,
        file: FileState,
        record_bytes: u64,
        journal: Option<Journal>,
        background: bool,
        on_halt: Box<dyn Fn() + Send + Sync>,
        observer: Observer,
    ) -> Pipeline {
        let checkpoints = Arc::new(AtomicU64::new(0));
        // Without a journal every batch is a durable redb commit: there is nothing to apply.
        let background = background && journal.is_some();
        let shared = Arc::new(Shared {
            db: RwLock::new(Some(db)),
            poisoned: AtomicBool::new(false),
            state: Mutex::new(State {
                queue: Vec::new(),
                next: 0,
                durable: 0,
                committing: false,
                batch: 0,
                committing_upto: 0,
                halted: None,
                undurable: HashSet::new(),
                writer: Some(Writer {
                    journal,
                    checkpoints: Arc::clone(&checkpoints),
                    observer: observer.clone(),
                }),
                wakers: Vec::new(),
            }),
            apply: Mutex::new(Applying {
                backlog: VecDeque::new(),
                busy: false,
                idle: true,
                exit: false,
                wanted: false,
                pace: APPLY_PACE,
            }),
            done: [Condvar::new(), Condvar::new()],
            applied_signal: Condvar::new(),
            backlog_signal: Condvar::new(),
            durable_seq: AtomicU64::new(0),
            applied_seq: AtomicU64::new(0),
            halted: AtomicBool::new(false),
            batches: AtomicU64::new(0),
            record_bytes: AtomicU64::new(record_bytes),
            backlog_put_bytes: AtomicU64::new(0),
            checkpoints,
            file: Mutex::new(file),
            background,
            #[cfg(test)]
            apply_gate: Mutex::new(()),
            flusher: Arc::default(),
            flusher_started: Once::new(),
            on_halt,
            observer,
        });
        let applier = if background {
            let applying = Arc::clone(&shared);
            let spawned = std::thread::Builder::new()
                .name(APPLIER_NAME.into())
                .spawn(move || applying.apply_loop());
            match spawned {
                Ok(handle) => Some(handle),
                Err(_) => {
                    // Nothing would ever be applied, and reads would wait forever: halt.
                    let mut s = shared.state.lock();
                    shared.halt(&mut s, "could not start the idemdb-apply thread".into());
                    None
                }
            }
        } else {
            None
        };
        Pipeline {
            shared,
            applier: Mutex::new(applier),
        }
    }

    /// Called when the store is dropped: stops the flusher thread and waits until it holds no
    /// reference to the pipeline, so the pipeline (and the file) is dropped by the caller.
    pub(crate) fn close(&self) {
        self.flusher.shut_down();
    }
}

impl Shared {
    /// Whether a commit failed: nothing is acknowledged through this pipeline again.
    pub(crate) fn is_halted(&self) -> bool {
        self.halted.load(Ordering::Acquire)
    }

    /// Whether redb panicked during a read or a commit: its file cannot be closed (see
    /// `Drop`), so it stays open, and locked, until the process exits.
    pub(crate) fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Acquire)
    }

    /// After a halt, closes the store file and the journal, so that they can be opened again
    /// (redb locks its file while open). Waits for running reads, commits and applies; later
    /// reads fail with [`Error::Halted`], and the backlog is dropped (the journal holds it, and
    /// the reopen replays it). Returns whether the files are closed: not if the pipeline is not
    /// halted, or is poisoned (then the file stays open).
    pub(crate) fn release_files(&self) -> bool {
        if !self.is_halted() || self.is_poisoned() {
            return false;
        }
        let mut s = self.state.lock();
        while s.committing {
            let batch = s.batch;
            self.done[parity(batch)].wait(&mut s);
        }
        // The journal's file handle goes with the writer; the pipeline never leads again.
        drop(s.writer.take());
        drop(s);
        let mut a = self.apply.lock();
        self.drop_backlog(&mut a);
        while a.busy {
            self.applied_signal.wait(&mut a);
        }
        drop(a);
        let Some(db) = self.db.write().take() else {
            return true;
        };
        // redb may try to write as it closes; the disk may still fail, and nothing here is
        // acknowledged. A panic in its `Drop` must not take the healer down.
        let closed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(db)));
        if closed.is_err() {
            self.poisoned.store(true, Ordering::Release);
        }
        true
    }

    /// Adds `note` to the cause every later `Halted` error gives.
    pub(crate) fn note_on_halt(&self, note: &str) {
        if let Some(cause) = &mut self.state.lock().halted {
            cause.push_str("; ");
            cause.push_str(note);
        }
    }

    pub(crate) fn halted_error(&self) -> Error {
        halted(
            self.state
                .lock()
                .halted
                .as_deref()
                .unwrap_or("the store file was closed"),
        )
    }

    pub(crate) fn batches(&self) -> u64 {
        self.batches.load(Ordering::Relaxed)
    }

    /// The bytes of the records' values as of the last answered batch: once redb holds it
    /// (as of the last apply, if the pipeline halted with batches left to apply).
    pub(crate) fn record_bytes(&self) -> u64 {
        let _ = self.settle();
        self.record_bytes.load(Ordering::Relaxed)
    }

    /// At least the bytes of the records' values as of the last answered batch, without
    /// waiting for the applier: the last apply's count plus every value the backlog writes.
    pub(crate) fn record_bytes_bound(&self) -> u64 {
        let pending = self.backlog_put_bytes.load(Ordering::Relaxed);
        self.record_bytes
            .load(Ordering::Relaxed)
            .saturating_add(pending)
    }

    /// Sets the applier's pace ([`APPLY_PACE`]), for tests that make it long.
    #[cfg(test)]
    pub(crate) fn set_apply_pace(&self, pace: std::time::Duration) {
        self.apply.lock().pace = pace;
    }

    pub(crate) fn checkpoints(&self) -> u64 {
        self.checkpoints.load(Ordering::Relaxed)
    }

    /// Whether a halted pipeline lets a claim answer from the index slot of a record at
    /// `fence`: every write of that record became durable (none is in a batch that failed or
    /// was queued when the pipeline halted), and no commit is still running, whose batch
    /// could yet fail. Such a slot holds what the disk holds, so a replay, an in-progress or a
    /// mismatch read from it is what a restart would answer.
    pub(crate) fn answers_from(&self, fence: u64) -> bool {
        let s = self.state.lock();
        s.halted.is_some() && !s.committing && !s.undurable.contains(&fence)
    }

    /// Fails once any commit has failed.
    pub(crate) fn check(&self) -> Result<()> {
        if self.halted.load(Ordering::Acquire) {
            let s = self.state.lock();
            return Err(halted(s.halted.as_deref().unwrap_or_default()));
        }
        Ok(())
    }

    fn add_record_bytes(&self, bytes: i64) {
        let now = self.record_bytes.load(Ordering::Relaxed);
        self.record_bytes
            .store(now.saturating_add_signed(bytes), Ordering::Relaxed);
    }

    /// Halts the pipeline for `cause`: every waiter, async caller and reader is woken to see
    /// it, and `on_halt` runs (with the state unlocked).
    fn halt(&self, s: &mut MutexGuard<'_, State>, cause: String) {
        self.observer.halted(&cause);
        let queued = std::mem::take(&mut s.queue);
        s.undurable.extend(queued.iter().flat_map(fences));
        s.halted = Some(cause);
        self.halted.store(true, Ordering::Release);
        for done in &self.done {
            done.notify_all();
        }
        // Under `apply`, so that a reader between its look at `halted` and its wait sees it.
        drop(self.apply.lock());
        self.applied_signal.notify_all();
        self.wake_async(s);
        MutexGuard::unlocked(s, || (self.on_halt)());
    }
}

/// The fences an op writes or deletes.
pub(super) fn fences(op: &Op) -> impl Iterator<Item = u64> {
    let (first, second) = match op {
        Op::Put {
            fence, replaces, ..
        } => (*fence, replaces.map(|gone| gone.fence)),
        Op::Delete(gone) => (gone.fence, None),
    };
    std::iter::once(first).chain(second)
}

fn put_bytes(ops: &[Op]) -> u64 {
    ops.iter()
        .map(|op| match op {
            Op::Put { value, .. } => value.len() as u64,
            Op::Delete(_) => 0,
        })
        .sum()
}

fn parity(batch: u64) -> usize {
    usize::from(batch & 1 == 1)
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        let clean = !self.poisoned.load(Ordering::Acquire) && !std::thread::panicking();
        if clean {
            // Ops nobody waits for (a withdrawn claim's release, a completion whose future was
            // dropped) still land when the store is closed cleanly; a failure here changes
            // nothing that was acknowledged.
            let mut s = self.state.lock();
            if !s.queue.is_empty() && s.halted.is_none() && !s.committing {
                let _ = self.lead(&mut s);
            }
        }
        self.stop_applier();
        if clean && !self.poisoned.load(Ordering::Acquire) {
            let shared = &*self.shared;
            let mut s = shared.state.lock();
            if s.halted.is_none() && !s.committing {
                let db = shared.db.read();
                if let (Some(writer), Some(db)) = (s.writer.as_mut(), db.as_ref()) {
                    let mut file = shared.file.lock();
                    let closed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        writer.close(db, &mut file)
                    }));
                    if closed.is_err() {
                        shared.poisoned.store(true, Ordering::Release);
                    }
                }
            }
        }
        self.flusher.shut_down();
        let Some(db) = self.db.write().take() else {
            return;
        };
        if self.poisoned.load(Ordering::Acquire) || std::thread::panicking() {
            // redb's own Drop unwraps locks a panic inside it poisoned, and would panic again
            // (while unwinding: an abort): leak it, and the process keeps the file open until it
            // exits.
            std::mem::forget(db);
        } else {
            // No panic escapes a store's drop.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(db)));
        }
    }
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("batches", &self.batches())
            .finish_non_exhaustive()
    }
}
