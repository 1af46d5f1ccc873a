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

use crate::error::{Error, Result};
use crate::file::disk::{write_batch, Commit, FileState, Op};
use crate::file::journal::{Appended, Journal};
use crate::observe::{Lap, Observer};
use crate::sync::{
    Arc, AtomicBool, AtomicU64, Condvar, Mutex, MutexGuard, Once, Ordering, RwLock, Weak,
};
use redb::Database;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;

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

const FLUSHER_NAME: &str = "idemdb-flush";
const APPLIER_NAME: &str = "idemdb-apply";

/// How long the applier, having emptied the backlog, waits for more batches before it sleeps
/// until woken. While it waits, a leader adds its batch without waking it (a wake-up costs the
/// leader, on the callers' path, a `futex` call and an inter-processor interrupt), and the
/// batches that arrive meanwhile are applied in one redb transaction. A reader or a checkpoint
/// that needs them applied wakes it at once.
const APPLY_DELAY: std::time::Duration = std::time::Duration::from_millis(1);

/// The applier is woken, whatever it is doing, once the backlog holds this many batches.
const MAX_BACKLOG: usize = 256;

/// Tells the flusher thread there is an async caller to serve, or that the store is closing.
/// The thread holds only this and a `Weak` to the pipeline while idle, and the store's drop
/// waits until it lets go of a strong reference it took ([`Pipeline::close`]), so dropping the
/// last `Store` closes the file before the drop returns.
#[derive(Default)]
struct FlushSignal {
    state: Mutex<FlushState>,
    wake: Condvar,
}

#[derive(Default)]
struct FlushState {
    /// An async caller waits for a commit.
    pending: bool,
    /// The store is closing: the thread exits.
    shutdown: bool,
    /// The thread holds a strong reference to the pipeline.
    busy: bool,
}

impl FlushSignal {
    fn raise(&self) {
        self.state.lock().pending = true;
        self.wake.notify_all();
    }

    /// Stops the thread and returns once it holds no strong reference to the pipeline (at
    /// once on a flusher thread itself: a waker run inline may drop the last `Store` there,
    /// and a thread cannot wait for itself).
    fn shut_down(&self) {
        let mut s = self.state.lock();
        s.shutdown = true;
        self.wake.notify_all();
        let on_a_flusher = std::thread::current().name() == Some(FLUSHER_NAME);
        while s.busy && !on_a_flusher {
            self.wake.wait(&mut s);
        }
    }
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

    /// A future that resolves once `seq` is durable, without blocking the thread that polls
    /// it: the flusher thread commits on its behalf.
    pub(crate) fn durable(self: &Arc<Self>, seq: Seq) -> Durable {
        self.start_flusher();
        Durable {
            pipeline: Arc::clone(self),
            seq: seq.0,
        }
    }

    /// Has the flusher commit `seq` soon, with nobody waiting for it.
    pub(crate) fn commit_soon(self: &Arc<Self>, seq: Seq) {
        self.start_flusher();
        self.state
            .lock()
            .wakers
            .push((seq.0, Waker::noop().clone()));
        self.flusher.raise();
    }

    /// Called when the store is dropped: stops the flusher thread and waits until it holds no
    /// reference to the pipeline, so the pipeline (and the file) is dropped by the caller.
    pub(crate) fn close(&self) {
        self.flusher.shut_down();
    }

    fn start_flusher(self: &Arc<Self>) {
        self.flusher_started.call_once(|| {
            let weak = Arc::downgrade(self);
            let signal = Arc::clone(&self.flusher);
            let spawned = std::thread::Builder::new()
                .name(FLUSHER_NAME.into())
                .spawn(move || flush_loop(&weak, &signal));
            if spawned.is_err() {
                // Without a flusher, async waiters would wait forever: halt instead.
                let mut s = self.state.lock();
                self.halt(&mut s, "could not start the idemdb-flush thread".into());
            }
        });
    }

    /// Lets the applier apply what is left of the backlog, and waits for it to exit.
    fn stop_applier(&self) {
        let Some(handle) = self.applier.lock().take() else {
            return;
        };
        self.apply.lock().exit = true;
        self.backlog_signal.notify_all();
        // The loop contains redb's panics; a join error would be a bug in the loop itself, and
        // a drop must not panic.
        let _ = handle.join();
    }
}

impl Shared {
    /// Runs a read of the file, once redb holds every batch answered so far. A panic inside
    /// redb (it panics on some damaged pages it had not read before) becomes
    /// [`Error::Corrupted`] for this caller, and the file is leaked rather than dropped when
    /// the store closes (redb's `Drop` would panic again on its poisoned locks).
    ///
    /// # Errors
    /// [`Error::Halted`] once the files were released, or if the pipeline halted before redb
    /// held what the read must see; the read's own errors.
    pub(crate) fn read<T>(&self, read: impl FnOnce(&Database) -> Result<T>) -> Result<T> {
        self.settle()?;
        let db = self.db.read();
        let Some(db) = db.as_ref() else {
            return Err(self.halted_error());
        };
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| read(db))).unwrap_or_else(
            |panic| {
                self.poisoned.store(true, Ordering::Release);
                Err(crate::error::storage_panic(panic))
            },
        )
    }

    /// Returns once redb holds every batch answered so far (at once when nothing is behind).
    ///
    /// # Errors
    /// As [`Shared::wait_applied`].
    fn settle(&self) -> Result<()> {
        let durable = self.durable_seq.load(Ordering::Acquire);
        if self.applied_seq.load(Ordering::Acquire) < durable {
            self.wait_applied(durable)?;
        }
        Ok(())
    }

    /// Returns once redb holds every op numbered below `seq`.
    ///
    /// # Errors
    /// [`Error::Halted`] if the pipeline halted and nothing more will be applied.
    fn wait_applied(&self, seq: u64) -> Result<()> {
        let mut a = self.apply.lock();
        loop {
            if self.applied_seq.load(Ordering::Acquire) >= seq {
                return Ok(());
            }
            if self.is_halted() && a.backlog.is_empty() && !a.busy {
                drop(a);
                return Err(self.halted_error());
            }
            self.backlog_signal.notify_one();
            self.applied_signal.wait(&mut a);
        }
    }

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

    fn halted_error(&self) -> Error {
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

    pub(crate) fn checkpoints(&self) -> u64 {
        self.checkpoints.load(Ordering::Relaxed)
    }

    /// Fails once any commit has failed.
    pub(crate) fn check(&self) -> Result<()> {
        if self.halted.load(Ordering::Acquire) {
            let s = self.state.lock();
            return Err(halted(s.halted.as_deref().unwrap_or_default()));
        }
        Ok(())
    }

    /// Queues `op`. Call it while holding the stripe lock of the op's key, so the queue order
    /// of one key's ops is the order the index applied them.
    pub(crate) fn enqueue(&self, op: Op) -> Result<Seq> {
        let mut s = self.state.lock();
        if let Some(cause) = &s.halted {
            return Err(halted(cause));
        }
        s.queue.push(op);
        s.next += 1;
        Ok(Seq(s.next - 1))
    }

    /// Returns once `seq` is durable, committing batches as the leader when nobody else is.
    ///
    /// # Errors
    /// [`Error::Halted`] (or the commit's own error, for the leader) if the batch holding
    /// `seq`, or any before it, failed.
    pub(crate) fn wait(&self, seq: Seq) -> Result<()> {
        let mut s = self.state.lock();
        loop {
            if seq.0 < s.durable {
                return Ok(());
            }
            if let Some(cause) = &s.halted {
                return Err(halted(cause));
            }
            if s.committing {
                let batch = if seq.0 < s.committing_upto {
                    s.batch
                } else {
                    s.batch + 1
                };
                self.done[parity(batch)].wait(&mut s);
                continue;
            }
            if let Err(e) = self.lead(&mut s) {
                // A batch answered before its apply failed is durable all the same.
                if seq.0 >= s.durable {
                    return Err(e);
                }
            }
        }
    }

    /// Returns once every op queued so far is durable.
    ///
    /// # Errors
    /// As [`Shared::wait`].
    pub(crate) fn flush(&self) -> Result<()> {
        let next = self.state.lock().next;
        match next.checked_sub(1) {
            Some(last) => self.wait(Seq(last)),
            None => Ok(()),
        }
    }

    /// Commits one batch: everything queued. Called with the state locked and no commit
    /// running; returns with the state locked.
    fn lead(&self, s: &mut MutexGuard<'_, State>) -> Result<()> {
        s.committing = true;
        s.batch += 1;
        s.committing_upto = s.next;
        let batch = std::mem::take(&mut s.queue);
        let first = s.durable;
        let upto = s.next;
        let mut writer = s.writer.take().expect("one leader at a time");
        let made = MutexGuard::unlocked(s, || {
            // A panic inside redb (damaged pages) fails the batch and halts the store like any
            // failed commit, instead of escaping into the caller that happened to lead.
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.make_durable(&mut writer, &batch, first)
            }))
            .unwrap_or_else(|panic| {
                self.poisoned.store(true, Ordering::Release);
                Err(crate::error::storage_panic(panic))
            })
        });
        let mut outcome = Ok(());
        let mut apply_here = None;
        match made {
            Ok(made) => {
                s.durable = upto;
                self.durable_seq.store(upto, Ordering::Release);
                self.batches.fetch_add(1, Ordering::Relaxed);
                writer.observer.committed(batch.len());
                match made {
                    Made::Committed(bytes) => {
                        let _ = self.applied(&mut self.apply.lock(), Ok(bytes), upto);
                    }
                    Made::Journaled if self.background => {
                        let put_bytes = put_bytes(&batch);
                        self.backlog_put_bytes
                            .fetch_add(put_bytes, Ordering::Relaxed);
                        let mut a = self.apply.lock();
                        a.backlog.push_back(Journaled {
                            ops: batch,
                            upto,
                            put_bytes,
                        });
                        let wake = a.idle || a.backlog.len() >= MAX_BACKLOG;
                        drop(a);
                        if wake {
                            self.backlog_signal.notify_one();
                        }
                    }
                    Made::Journaled => apply_here = Some(batch),
                }
            }
            Err(e) => {
                // A checkpoint waiting for the applier finds the pipeline halted by it.
                if s.halted.is_none() {
                    self.halt(s, e.to_string());
                }
                outcome = Err(e);
            }
        }
        // The batch is durable: its callers go on while it is applied.
        self.done[parity(s.batch)].notify_all();
        self.wake_async(s);
        if let Some(ops) = apply_here {
            let applied = MutexGuard::unlocked(s, || self.apply(&ops));
            let applied = self.applied(&mut self.apply.lock(), applied, upto);
            if let Err(e) = applied {
                if s.halted.is_none() {
                    self.halt(s, format!("applying a journaled batch: {e}"));
                }
                outcome = Err(e);
            }
        }
        s.writer = Some(writer);
        s.committing = false;
        if s.halted.is_some() {
            self.done[parity(s.batch + 1)].notify_all();
        } else if s.next > upto {
            // Ops queued meanwhile: wake one of their callers to lead the next batch.
            self.done[parity(s.batch + 1)].notify_one();
        }
        outcome
    }

    /// Makes `ops` (numbered from `first`) durable: appended to the journal and synced; or,
    /// when the journal is full (or absent), committed durably into redb, which checkpoints
    /// everything before them too, once redb holds every earlier batch.
    fn make_durable(&self, writer: &mut Writer, ops: &[Op], first: u64) -> Result<Made> {
        let Some(journal) = &mut writer.journal else {
            let db = self.db.read();
            let db = db
                .as_ref()
                .ok_or_else(|| halted("the store file was closed"))?;
            let bytes = write_batch(db, ops, &mut self.file.lock(), Commit::Durable)?;
            return Ok(Made::Committed(bytes));
        };
        let lap = Lap::start();
        match journal.append(ops)? {
            Appended::Durable => {
                writer.observer.synced(&lap);
                Ok(Made::Journaled)
            }
            Appended::Full => {
                self.wait_applied(first)?;
                let lap = Lap::start();
                let db = self.db.read();
                let db = db
                    .as_ref()
                    .ok_or_else(|| halted("the store file was closed"))?;
                let bytes = journal.checkpoint(db, ops, &mut self.file.lock())?;
                writer.checkpoints.fetch_add(1, Ordering::Relaxed);
                writer.observer.checkpointed(ops.len(), &lap);
                Ok(Made::Committed(bytes))
            }
        }
    }

    /// Applies journaled `ops` to redb without a sync.
    fn apply(&self, ops: &[Op]) -> Result<i64> {
        let db = self.db.read();
        let Some(db) = db.as_ref() else {
            return Err(halted("the store file was closed"));
        };
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            write_batch(db, ops, &mut self.file.lock(), Commit::Journaled)
        }))
        .unwrap_or_else(|panic| {
            self.poisoned.store(true, Ordering::Release);
            Err(crate::error::storage_panic(panic))
        })
    }

    /// Records the outcome of applying every batch before `upto`, with `apply` locked (the
    /// caller's guard is `_locked`). The caller halts the pipeline on a failure, with `apply`
    /// unlocked: the lock order is `state`, then `apply`.
    fn applied(&self, _locked: &mut Applying, outcome: Result<i64>, upto: u64) -> Result<()> {
        let result = outcome.map(|bytes| {
            self.add_record_bytes(bytes);
            self.applied_seq.store(upto, Ordering::Release);
        });
        self.applied_signal.notify_all();
        result
    }

    /// The `idemdb-apply` thread: applies the backlog in order, every batch waiting at once
    /// in one redb transaction, until told to exit with nothing left.
    fn apply_loop(&self) {
        let mut a = self.apply.lock();
        loop {
            if a.backlog.is_empty() {
                if a.exit {
                    return;
                }
                if a.idle {
                    self.backlog_signal.wait(&mut a);
                } else if self
                    .backlog_signal
                    .wait_for(&mut a, APPLY_DELAY)
                    .timed_out()
                    && a.backlog.is_empty()
                {
                    a.idle = true;
                }
                continue;
            }
            a.idle = false;
            let mut waiting = a.backlog.drain(..);
            let Journaled {
                mut ops,
                mut upto,
                mut put_bytes,
            } = waiting.next().expect("not empty");
            for more in waiting {
                ops.extend(more.ops);
                upto = more.upto;
                put_bytes += more.put_bytes;
            }
            a.busy = true;
            let applied = MutexGuard::unlocked(&mut a, || {
                #[cfg(test)]
                let _gate = self.apply_gate.lock();
                let applied = self.apply(&ops);
                drop(ops);
                applied
            });
            a.busy = false;
            self.backlog_put_bytes
                .fetch_sub(put_bytes, Ordering::Relaxed);
            if let Err(e) = self.applied(&mut a, applied, upto) {
                // What is left in the backlog is in the journal, which the reopen replays.
                self.drop_backlog(&mut a);
                MutexGuard::unlocked(&mut a, || {
                    let mut s = self.state.lock();
                    if s.halted.is_none() {
                        self.halt(&mut s, format!("applying a journaled batch: {e}"));
                    }
                });
            }
        }
    }

    /// After a halt: the batches left to apply are never applied by this pipeline (the
    /// journal holds them, and the reopen replays them).
    fn drop_backlog(&self, a: &mut Applying) {
        let dropped: u64 = a.backlog.drain(..).map(|batch| batch.put_bytes).sum();
        self.backlog_put_bytes.fetch_sub(dropped, Ordering::Relaxed);
        self.applied_signal.notify_all();
    }

    fn add_record_bytes(&self, bytes: i64) {
        let now = self.record_bytes.load(Ordering::Relaxed);
        self.record_bytes
            .store(now.saturating_add_signed(bytes), Ordering::Relaxed);
    }

    /// Wakes the async callers whose ops are durable (all of them once halted).
    fn wake_async(&self, s: &mut MutexGuard<'_, State>) {
        let durable = s.durable;
        let all = s.halted.is_some();
        s.wakers.retain(|(seq, waker)| {
            let ready = all || *seq < durable;
            if ready {
                waker.wake_by_ref();
            }
            !ready
        });
    }

    /// Halts the pipeline for `cause`: every waiter, async caller and reader is woken to see
    /// it, and `on_halt` runs (with the state unlocked).
    fn halt(&self, s: &mut MutexGuard<'_, State>, cause: String) {
        self.observer.halted(&cause);
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

    /// Leads commits while an async caller waits for an op not yet durable.
    fn flush_for_async(&self) {
        let mut s = self.state.lock();
        loop {
            if s.halted.is_some() {
                for (_, waker) in s.wakers.drain(..) {
                    waker.wake();
                }
                return;
            }
            let durable = s.durable;
            if !s.wakers.iter().any(|(seq, _)| *seq >= durable) {
                return;
            }
            if s.committing {
                let batch = s.batch;
                self.done[parity(batch)].wait(&mut s);
                continue;
            }
            // Errors reach the waiters through the halted state.
            let _ = self.lead(&mut s);
        }
    }
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

/// What the commit leader owns: the journal (none for a store in memory).
struct Writer {
    journal: Option<Journal>,
    checkpoints: Arc<AtomicU64>,
    observer: Observer,
}

impl Writer {
    /// At a clean close, once redb holds every batch: a checkpoint, so that the journal holds
    /// nothing the store file lacks. Damage to the journal's last entry (which cannot be told
    /// from a crash's torn write) then loses nothing, and the next open has nothing to replay.
    fn close(&mut self, db: &Database, file: &mut FileState) -> Result<()> {
        match &mut self.journal {
            Some(journal) if journal.has_entries() => journal.checkpoint(db, &[], file).map(drop),
            _ => Ok(()),
        }
    }
}

fn flush_loop(pipeline: &Weak<Pipeline>, signal: &FlushSignal) {
    loop {
        {
            let mut s = signal.state.lock();
            while !s.pending && !s.shutdown {
                signal.wake.wait(&mut s);
            }
            if s.shutdown {
                return;
            }
            s.pending = false;
            s.busy = true;
        }
        if let Some(p) = pipeline.upgrade() {
            p.flush_for_async();
        }
        signal.state.lock().busy = false;
        signal.wake.notify_all();
    }
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

/// Resolves once an op is durable; see [`Pipeline::durable`].
pub(crate) struct Durable {
    pipeline: Arc<Pipeline>,
    seq: u64,
}

impl Future for Durable {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let p = &self.pipeline;
        let mut s = p.state.lock();
        if self.seq < s.durable {
            return Poll::Ready(Ok(()));
        }
        if let Some(cause) = &s.halted {
            return Poll::Ready(Err(halted(cause)));
        }
        match s.wakers.iter_mut().find(|(seq, _)| *seq == self.seq) {
            Some((_, waker)) => waker.clone_from(cx.waker()),
            None => s.wakers.push((self.seq, cx.waker().clone())),
        }
        drop(s);
        p.flusher.raise();
        Poll::Pending
    }
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("batches", &self.batches())
            .finish_non_exhaustive()
    }
}
