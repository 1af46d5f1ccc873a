//! The `idemdb-apply` thread: applies journaled batches to redb in queue order, without a
//! sync, several waiting batches per transaction; and the wait that keeps a reader (or a
//! checkpoint) from seeing the file behind what a caller was told.

use super::Journaled;
use crate::error::Result;
use crate::file::batch::{write_batch, Commit, Op};
use crate::file::commit::halted;
use crate::file::commit::Applying;
use crate::file::commit::Pipeline;
use crate::file::commit::Shared;
use crate::sync::{MutexGuard, Ordering};
use redb::Database;

pub(super) const APPLIER_NAME: &str = "idemdb-apply";

/// How long the applier, having emptied the backlog, waits for more batches before it sleeps
/// until woken. While it waits, a leader adds its batch without waking it (a wake-up costs the
/// leader, on the callers' path, a `futex` call and an inter-processor interrupt), and the
/// batches that arrive meanwhile are applied in one redb transaction. A reader or a checkpoint
/// that needs them applied wakes it at once.
pub(super) const APPLY_DELAY: std::time::Duration = std::time::Duration::from_millis(1);

/// The least time between the starts of two of the applier's transactions, unless a reader, a
/// checkpoint or a close waits for it, or the backlog reaches [`MAX_BACKLOG`]. A claim's batch
/// and its completion's, a millisecond or two apart under load, then mostly fall in one
/// transaction: the claim's put and the completion's deletion of it are both skipped
/// (`batch::moot`), and the completion is the only write. Measured (`cargo bench --bench
/// callers`, 64 threads, claim + complete): the applier's CPU per request 5.2-6.3 µs, against
/// 9.9-14.3 µs applying as soon as it could; with a 2 ms pace, 7.5-9.3 µs
/// (`docs/performance.md`).
pub(super) const APPLY_PACE: std::time::Duration = std::time::Duration::from_millis(5);

/// The applier is woken, whatever it is doing, once the backlog holds this many batches.
pub(super) const MAX_BACKLOG: usize = 256;

impl Pipeline {
    /// Lets the applier apply what is left of the backlog, and waits for it to exit.
    pub(super) fn stop_applier(&self) {
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
    pub(super) fn settle(&self) -> Result<()> {
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
    pub(super) fn wait_applied(&self, seq: u64) -> Result<()> {
        let mut a = self.apply.lock();
        loop {
            if self.applied_seq.load(Ordering::Acquire) >= seq {
                return Ok(());
            }
            if self.is_halted() && a.backlog.is_empty() && !a.busy {
                drop(a);
                return Err(self.halted_error());
            }
            a.wanted = true;
            self.backlog_signal.notify_one();
            self.applied_signal.wait(&mut a);
        }
    }

    /// Applies journaled `ops` to redb without a sync.
    pub(super) fn apply(&self, ops: &[Op]) -> Result<i64> {
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
    pub(super) fn applied(
        &self,
        _locked: &mut Applying,
        outcome: Result<i64>,
        upto: u64,
    ) -> Result<()> {
        let result = outcome.map(|bytes| {
            self.add_record_bytes(bytes);
            self.applied_seq.store(upto, Ordering::Release);
        });
        self.applied_signal.notify_all();
        result
    }

    /// The `idemdb-apply` thread: applies the backlog in order, every batch waiting at once
    /// in one redb transaction, at most one transaction per [`APPLY_PACE`] unless somebody
    /// waits for it, until told to exit with nothing left.
    pub(super) fn apply_loop(&self) {
        let mut a = self.apply.lock();
        let mut last = std::time::Instant::now();
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
            if !a.exit && !a.wanted && a.backlog.len() < MAX_BACKLOG {
                let since = last.elapsed();
                if since < a.pace {
                    let left = a.pace - since;
                    self.backlog_signal.wait_for(&mut a, left);
                    continue;
                }
            }
            a.wanted = false;
            last = std::time::Instant::now();
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
    pub(super) fn drop_backlog(&self, a: &mut Applying) {
        let dropped: u64 = a.backlog.drain(..).map(|batch| batch.put_bytes).sum();
        self.backlog_put_bytes.fetch_sub(dropped, Ordering::Relaxed);
        self.applied_signal.notify_all();
    }
}
