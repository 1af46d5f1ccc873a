//! Group commit. Callers queue their ops and wait; whichever waiter finds no commit running
//! becomes the leader, takes everything queued, writes it in one redb transaction with one
//! fsync, and wakes the others. A lone caller commits on its own thread, with no hand-off.
//!
//! Invariants:
//! - an op's sequence number is below `durable` only once the batch holding it is fsynced;
//! - after a failed commit the pipeline is halted: queued and later ops fail, and nothing is
//!   acknowledged again until the store is reopened (fail-stop; redb also refuses further writes
//!   after an I/O error).

use crate::disk::{write_batch, Op};
use crate::error::{Error, Result};
use crate::sync::{AtomicBool, AtomicU64, Condvar, Mutex, Ordering};
use redb::Database;

pub(crate) struct Pipeline {
    db: Database,
    state: Mutex<State>,
    done: Condvar,
    halted: AtomicBool,
    batches: AtomicU64,
}

struct State {
    queue: Vec<Op>,
    /// Sequence number the next queued op gets.
    next: u64,
    /// Every op numbered below this is durable.
    durable: u64,
    committing: bool,
    halted: Option<String>,
    /// The fence reservation on disk; only the leader touches it.
    reserved: u64,
}

/// A queued op's place in line; redeem it with [`Pipeline::wait`].
#[must_use = "an op is not durable until its ticket is waited on"]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seq(u64);

impl Pipeline {
    pub(crate) fn new(db: Database, reserved: u64) -> Pipeline {
        Pipeline {
            db,
            state: Mutex::new(State {
                queue: Vec::new(),
                next: 0,
                durable: 0,
                committing: false,
                halted: None,
                reserved,
            }),
            done: Condvar::new(),
            halted: AtomicBool::new(false),
            batches: AtomicU64::new(0),
        }
    }

    pub(crate) fn db(&self) -> &Database {
        &self.db
    }

    pub(crate) fn batches(&self) -> u64 {
        self.batches.load(Ordering::Relaxed)
    }

    /// Fails once any commit has failed.
    pub(crate) fn check(&self) -> Result<()> {
        if self.halted.load(Ordering::Acquire) {
            let cause = self.state.lock().halted.clone().unwrap_or_default();
            return Err(Error::Halted { cause });
        }
        Ok(())
    }

    /// Queues `op`. Call it while holding the stripe lock of the op's key, so the queue order
    /// of one key's ops is the order the index applied them.
    pub(crate) fn enqueue(&self, op: Op) -> Result<Seq> {
        let mut s = self.state.lock();
        if let Some(cause) = &s.halted {
            return Err(Error::Halted {
                cause: cause.clone(),
            });
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
                return Err(Error::Halted {
                    cause: cause.clone(),
                });
            }
            if s.committing {
                self.done.wait(&mut s);
                continue;
            }
            s.committing = true;
            let batch = std::mem::take(&mut s.queue);
            let upto = s.next;
            let mut reserved = s.reserved;
            drop(s);
            let result = {
                // A panic inside redb must not leave `committing` set forever.
                let guard = HaltOnUnwind(self);
                let r = write_batch(&self.db, &batch, &mut reserved);
                std::mem::forget(guard);
                r
            };
            s = self.state.lock();
            s.reserved = reserved;
            s.committing = false;
            match result {
                Ok(()) => {
                    s.durable = upto;
                    self.batches.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    s.halted = Some(e.to_string());
                    self.halted.store(true, Ordering::Release);
                    self.done.notify_all();
                    return Err(e);
                }
            }
            self.done.notify_all();
        }
    }
}

struct HaltOnUnwind<'a>(&'a Pipeline);

impl Drop for HaltOnUnwind<'_> {
    fn drop(&mut self) {
        let mut s = self.0.state.lock();
        s.committing = false;
        s.halted = Some("the commit panicked".into());
        self.0.halted.store(true, Ordering::Release);
        self.0.done.notify_all();
    }
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("batches", &self.batches())
            .finish_non_exhaustive()
    }
}
