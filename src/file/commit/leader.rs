//! The group-commit leader: callers queue their ops and wait; whichever waiter finds no
//! commit running leads the next batch and makes it durable (a journal append and its
//! `fdatasync`, or a checkpoint).

use super::checkpoint::checkpoint;
use super::Journaled;
use crate::error::Result;
use crate::file::batch::{write_batch, Commit, FileState, Op};
use crate::file::commit::applier::MAX_BACKLOG;
use crate::file::commit::halted;
use crate::file::commit::parity;
use crate::file::commit::put_bytes;
use crate::file::commit::Made;
use crate::file::commit::Seq;
use crate::file::commit::Shared;
use crate::file::commit::State;
use crate::file::journal::{Appended, Journal};
use crate::observe::{Lap, Observer};
use crate::sync::{Arc, AtomicU64, MutexGuard, Ordering};
use redb::Database;

impl Shared {
    /// Queues `op`. Call it while holding the stripe lock of the op's key, so the queue order
    /// of one key's ops is the order the index applied them.
    pub(crate) fn enqueue(&self, op: Op) -> Result<Seq> {
        self.enqueue_with(|| (op, ())).map(|(seq, ())| seq)
    }

    /// Queues the op `make` returns, made under the queue's lock: whatever it draws from a
    /// counter is in queue order. A completion takes its fence so, and completions are then
    /// appended to the records table in rising order, which keeps its leaves full (keys taken
    /// outside the lock arrive a little out of order, and leave them far emptier: see
    /// `docs/design.md`). `make` must be quick (a copy and a
    /// checksum): every queueing caller waits for it.
    pub(crate) fn enqueue_with<T>(&self, make: impl FnOnce() -> (Op, T)) -> Result<(Seq, T)> {
        let mut s = self.state.lock();
        if let Some(cause) = &s.halted {
            return Err(halted(cause));
        }
        let (op, made) = make();
        s.queue.push(op);
        s.next += 1;
        Ok((Seq(s.next - 1), made))
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
    pub(super) fn lead(&self, s: &mut MutexGuard<'_, State>) -> Result<()> {
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
                s.undurable.extend(batch.iter().flat_map(super::fences));
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
    pub(super) fn make_durable(&self, writer: &mut Writer, ops: &[Op], first: u64) -> Result<Made> {
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
                let bytes = checkpoint(journal, db, ops, &mut self.file.lock())?;
                writer.checkpoints.fetch_add(1, Ordering::Relaxed);
                writer.observer.checkpointed(ops.len(), &lap);
                Ok(Made::Committed(bytes))
            }
        }
    }
}

/// What the commit leader owns: the journal (none for a store in memory).
pub(super) struct Writer {
    pub(super) journal: Option<Journal>,
    pub(super) checkpoints: Arc<AtomicU64>,
    pub(super) observer: Observer,
}

impl Writer {
    /// At a clean close, once redb holds every batch: a checkpoint, so that the journal holds
    /// nothing the store file lacks. Damage to the journal's last entry (which cannot be told
    /// from a crash's torn write) then loses nothing, and the next open has nothing to replay.
    pub(super) fn close(&mut self, db: &Database, file: &mut FileState) -> Result<()> {
        match &mut self.journal {
            Some(journal) if journal.has_entries() => checkpoint(journal, db, &[], file).map(drop),
            _ => Ok(()),
        }
    }
}
