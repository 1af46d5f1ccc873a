//! Group commit. Callers queue their ops and wait; whichever waiter finds no commit running
//! becomes the leader, takes everything queued, makes it durable as one batch (one journal
//! entry and one `fdatasync` of the journal, then a redb transaction applied without a sync; or,
//! when the journal is full or absent, one durable redb commit: a checkpoint), and wakes the
//! callers it made durable plus one caller of the next batch. A lone caller commits on its own
//! thread, with no hand-off.
//!
//! Async callers never block their executor thread on an fsync: they register a waker and a
//! `idemdb-flush` thread, started on first use, leads commits while any async caller waits.
//! Sync leaders wake async waiters too, so both kinds share batches. Ops nobody waits for (a
//! withdrawn claim's release) are handed to the same thread ([`Pipeline::commit_soon`]), and a
//! store closed cleanly commits what is still queued.
//!
//! Invariants:
//! - an op's sequence number is below `durable` only once the batch holding it is fsynced;
//! - after a failed commit the pipeline is halted: queued and later ops fail, and nothing is
//!   acknowledged again through it (fail-stop; redb also refuses further writes after an I/O
//!   error). The store heals by reopening the file into a new pipeline (`heal.rs`), once this
//!   one has let go of its files ([`Pipeline::release_files`]).

use crate::error::{Error, Result};
use crate::file::disk::{write_batch, Commit, FileState, Op};
use crate::file::journal::{Appended, Journal};
use crate::observe::{Lap, Observer};
use crate::sync::{Arc, AtomicBool, AtomicU64, Condvar, Mutex, MutexGuard, Ordering, RwLock};
use redb::Database;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Once, Weak};
use std::task::{Context, Poll, Waker};

pub(crate) struct Pipeline {
    /// `None` once released after a halt ([`Pipeline::release_files`]) and while dropping. A
    /// read or a commit holds it shared for its duration.
    db: RwLock<Option<Database>>,
    /// A commit panicked inside redb, leaving its locks poisoned.
    poisoned: AtomicBool,
    state: Mutex<State>,
    /// Callers whose op is in an odd / even numbered batch wait on `done[batch & 1]`: a commit
    /// wakes the callers it made durable, and one caller of the next batch to lead it, instead
    /// of every waiter (half of whom would only go back to sleep).
    done: [Condvar; 2],
    halted: AtomicBool,
    batches: AtomicU64,
    /// The bytes of every record's value in the file as of the last commit (changed only by
    /// the leader, under `state`).
    record_bytes: AtomicU64,
    checkpoints: Arc<AtomicU64>,
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

const FLUSHER_NAME: &str = "idemdb-flush";

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
    pub(crate) fn new(
        db: Database,
        file: FileState,
        record_bytes: u64,
        journal: Option<Journal>,
        on_halt: Box<dyn Fn() + Send + Sync>,
        observer: Observer,
    ) -> Pipeline {
        let checkpoints = Arc::new(AtomicU64::new(0));
        Pipeline {
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
                    file,
                    journal,
                    checkpoints: Arc::clone(&checkpoints),
                    observer: observer.clone(),
                }),
                wakers: Vec::new(),
            }),
            done: [Condvar::new(), Condvar::new()],
            halted: AtomicBool::new(false),
            batches: AtomicU64::new(0),
            record_bytes: AtomicU64::new(record_bytes),
            checkpoints,
            flusher: Arc::default(),
            flusher_started: Once::new(),
            on_halt,
            observer,
        }
    }

    /// Runs a read of the file. A panic inside redb (it panics on some damaged pages it had not
    /// read before) becomes [`Error::Corrupted`] for this caller, and the file is leaked rather
    /// than dropped when the store closes (redb's `Drop` would panic again on its poisoned
    /// locks).
    ///
    /// # Errors
    /// [`Error::Halted`] once the files were released; the read's own errors.
    pub(crate) fn read<T>(&self, read: impl FnOnce(&Database) -> Result<T>) -> Result<T> {
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
    /// (redb locks its file while open). Waits for running reads; later reads fail with
    /// [`Error::Halted`]. Returns whether the files are closed: not if the pipeline is not
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

    /// The bytes of the records' values as of the last commit.
    pub(crate) fn record_bytes(&self) -> u64 {
        self.record_bytes.load(Ordering::Relaxed)
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
            self.lead(&mut s)?;
        }
    }

    /// Returns once every op queued so far is durable.
    ///
    /// # Errors
    /// As [`Pipeline::wait`].
    pub(crate) fn flush(&self) -> Result<()> {
        let next = self.state.lock().next;
        match next.checked_sub(1) {
            Some(last) => self.wait(Seq(last)),
            None => Ok(()),
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

    /// Commits one batch: everything queued. Called with the state locked and no commit
    /// running; returns with the state locked.
    fn lead(&self, s: &mut MutexGuard<'_, State>) -> Result<()> {
        s.committing = true;
        s.batch += 1;
        s.committing_upto = s.next;
        let batch = std::mem::take(&mut s.queue);
        let upto = s.next;
        let mut writer = s.writer.take().expect("one leader at a time");
        let result = MutexGuard::unlocked(s, || {
            let db = self.db.read();
            let Some(db) = db.as_ref() else {
                return Err(halted("the store file was closed"));
            };
            // A panic inside redb (damaged pages) fails the batch and halts the store like any
            // failed commit, instead of escaping into the caller that happened to lead.
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| writer.commit(db, &batch)))
                .unwrap_or_else(|panic| {
                    self.poisoned.store(true, Ordering::Release);
                    Err(crate::error::storage_panic(panic))
                })
        });
        s.writer = Some(writer);
        s.committing = false;
        let outcome = match result {
            Ok(bytes) => {
                s.durable = upto;
                self.batches.fetch_add(1, Ordering::Relaxed);
                let now = self.record_bytes.load(Ordering::Relaxed);
                self.record_bytes
                    .store(now.saturating_add_signed(bytes), Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                let cause = e.to_string();
                self.observer.halted(&cause);
                s.halted = Some(cause);
                self.halted.store(true, Ordering::Release);
                Err(e)
            }
        };
        self.done[parity(s.batch)].notify_all();
        if s.halted.is_some() {
            self.done[parity(s.batch + 1)].notify_all();
        } else if s.next > upto {
            // Ops queued meanwhile: wake one of their callers to lead the next batch.
            self.done[parity(s.batch + 1)].notify_one();
        }
        let durable = s.durable;
        let all = s.halted.is_some();
        s.wakers.retain(|(seq, waker)| {
            let ready = all || *seq < durable;
            if ready {
                waker.wake_by_ref();
            }
            !ready
        });
        if all {
            MutexGuard::unlocked(s, || (self.on_halt)());
        }
        outcome
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
                let cause = "could not start the idemdb-flush thread";
                self.observer.halted(cause);
                s.halted = Some(cause.into());
                self.halted.store(true, Ordering::Release);
                drop(s);
                (self.on_halt)();
            }
        });
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

fn parity(batch: u64) -> usize {
    usize::from(batch & 1 == 1)
}

/// What the commit leader owns: the fence reservation in the file and the journal (none for a
/// store in memory).
struct Writer {
    file: FileState,
    journal: Option<Journal>,
    checkpoints: Arc<AtomicU64>,
    observer: Observer,
}

impl Writer {
    /// Makes `ops` durable: appended to the journal and synced, then applied to redb without a
    /// sync; or, when the journal is full (or absent), committed durably into redb, which
    /// checkpoints everything before them too.
    /// Returns by how much the batch changed the records' bytes.
    ///
    /// The gauges are brought up to date here, by the leader with the state unlocked: a commit
    /// stats the store file.
    fn commit(&mut self, db: &Database, ops: &[Op]) -> Result<i64> {
        let bytes = self.make_durable(db, ops)?;
        self.observer.committed(ops.len());
        Ok(bytes)
    }

    fn make_durable(&mut self, db: &Database, ops: &[Op]) -> Result<i64> {
        let Some(journal) = &mut self.journal else {
            return write_batch(db, ops, &mut self.file, Commit::Durable);
        };
        let lap = Lap::start();
        match journal.append(ops)? {
            Appended::Durable => {
                self.observer.synced(&lap);
                write_batch(db, ops, &mut self.file, Commit::Journaled)
            }
            Appended::Full => {
                let lap = Lap::start();
                let bytes = journal.checkpoint(db, ops, &mut self.file)?;
                self.checkpoints.fetch_add(1, Ordering::Relaxed);
                self.observer.checkpointed(ops.len(), &lap);
                Ok(bytes)
            }
        }
    }

    /// At a clean close: a checkpoint, so that the journal holds nothing the store file lacks.
    /// Damage to the journal's last entry (which cannot be told from a crash's torn write) then
    /// loses nothing, and the next open has nothing to replay.
    fn close(&mut self, db: &Database) -> Result<()> {
        match &mut self.journal {
            Some(journal) if journal.has_entries() => {
                journal.checkpoint(db, &[], &mut self.file).map(drop)
            }
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
        if !self.poisoned.load(Ordering::Acquire) && !std::thread::panicking() {
            // Ops nobody waits for (a withdrawn claim's release, a completion whose future was
            // dropped) still land when the store is closed cleanly; a failure here changes
            // nothing that was acknowledged.
            let mut s = self.state.lock();
            if !s.queue.is_empty() && s.halted.is_none() && !s.committing {
                let _ = self.lead(&mut s);
            }
            if s.halted.is_none() && !s.committing {
                if let (Some(writer), Some(db)) = (s.writer.as_mut(), self.db.get_mut().as_ref()) {
                    let closed =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| writer.close(db)));
                    if closed.is_err() {
                        self.poisoned.store(true, Ordering::Release);
                    }
                }
            }
        }
        self.flusher.shut_down();
        let Some(db) = self.db.get_mut().take() else {
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
