//! The PostgreSQL engine: the same store on a database that many replicas share.
//!
//! Every decision is made by the database, in one statement per batch of operations (see
//! `sql.rs` and `docs/postgres.md`): nothing is decided from memory, because another replica
//! may have changed the key. The engine runs its connections on a thread of its own, so
//! blocking callers need no runtime and async callers any executor.
//!
//! The rooms, as in `crate::file`: this file is the handle and its lifetime (a store's
//! clones share one [`Shared`], which tickets point to weakly); `connect.rs` opens it;
//! `bridge.rs` lets blocking callers wait for the engine's thread; `operations.rs` is claim,
//! complete, release, extend, get and wait; `maintenance.rs` is reap, resolve, purge and the
//! count; `rows.rs` turns keys into columns and rows into records; `clock.rs` is the
//! database's time as this store estimates it. Underneath: `scheduler.rs` (the engine's
//! thread: jobs, batches, when a batch starts), `batches.rs` (one statement per kind per
//! batch), `pool.rs` (connections and the statements run on them), `direct.rs` (a lone
//! blocking caller's own connection), `schema.rs`, `plans.rs`, `sql.rs` and `transfer.rs`.

mod batches;
mod bridge;
mod clock;
mod connect;
mod direct;
mod maintenance;
mod operations;
mod plans;
mod pool;
pub(crate) mod pooler;
mod rows;
mod scheduler;
mod schema;
mod sql;
pub(crate) mod tls;
mod transfer;
mod url;
mod wakes;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::model::report::EngineFigures;
use crate::model::ticket::Issuer;
use crate::replay_cache::ReplayCache;
use crate::sync::{Arc, AtomicU64, Mutex, Ordering};
use futures_channel::oneshot;
use pool::Conn;
use rows::{fence_column, Target};
use scheduler::Job;
use std::future::Future;
use std::time::Duration;
use tokio::sync::mpsc;

pub(crate) use connect::connect;
pub(crate) use schema::check_name as check_schema_name;

/// The store on PostgreSQL; clones share one engine.
#[derive(Clone)]
pub(crate) struct PgStore {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("schema", &self.shared.schema)
            .field("owner", &self.shared.context.params.owner)
            .field("incarnation", &self.shared.context.params.incarnation)
            .finish_non_exhaustive()
    }
}

/// What tickets point to (weakly): the queue to the engine's thread and the settings.
pub(crate) struct Shared {
    jobs: mpsc::UnboundedSender<Job>,
    context: Arc<scheduler::Context>,
    config: Config,
    schema: String,
    /// Claims withdrawn by their callers (the engine's thread counts its own).
    withdrawn: AtomicU64,
    /// Completed responses this store has replayed, by scoped key.
    replays: ReplayCache<Box<[u8]>>,
    /// The database's time, as this store estimates it between statements.
    clock: clock::DatabaseClock,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// A lone blocking caller's own connection (`direct.rs`).
    direct: Mutex<Option<direct::Lane>>,
}

/// How a caller waits for its job's answer.
#[derive(Clone, Copy)]
pub(super) enum Caller {
    /// Blocking its thread (it may use the direct lane).
    Blocking,
    /// Awaiting it (always through the queue).
    Async,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Closing the queue ends the engine's thread once running batches finished; waiting
        // for it closes the connections before the last `Store` is gone.
        if let Some(lane) = self.direct.get_mut().take() {
            lane.close();
        }
        let (closed, _) = mpsc::unbounded_channel();
        drop(std::mem::replace(&mut self.jobs, closed));
        if let Some(thread) = self.thread.lock().take() {
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

impl Shared {
    pub(super) fn submit(&self, job: Job) -> Result<()> {
        self.context.queued.fetch_add(1, Ordering::AcqRel);
        self.jobs.send(job).map_err(|_| {
            self.context.queued.fetch_sub(1, Ordering::AcqRel);
            stopped()
        })
    }

    /// Sends `job` for a caller that blocks until it is answered: run on the caller's thread
    /// when the direct lane may take it (`direct.rs`), else through the queue.
    fn submit_blocking(&self, job: Job) -> Result<()> {
        match direct::try_run(&self.context, &self.direct, job) {
            None => Ok(()),
            Some(job) => self.submit(job),
        }
    }

    /// [`Shared::submit`] or [`Shared::submit_blocking`].
    pub(super) fn send(&self, job: Job, caller: Caller) -> Result<()> {
        match caller {
            Caller::Blocking => self.submit_blocking(job),
            Caller::Async => self.submit(job),
        }
    }

    /// Runs `f` on a pooled connection, in its turn with the batches.
    pub(super) fn task<T, F, Fut>(&self, f: F) -> oneshot::Receiver<Result<T>>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Conn>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let job = Job::Task(Box::new(move |conn| {
            Box::pin(async move {
                let result = match conn {
                    Ok(conn) => f(conn).await,
                    Err(e) => Err(e),
                };
                let _ = tx.send(result);
            })
        }));
        self.context.queued.fetch_add(1, Ordering::AcqRel);
        if let Err(mpsc::error::SendError(Job::Task(task))) = self.jobs.send(job) {
            self.context.queued.fetch_sub(1, Ordering::AcqRel);
            // The engine stopped: run the task's failure path so the receiver hears why.
            drop(task);
        }
        rx
    }

    pub(super) fn adjust(&self) -> Option<i64> {
        (self.context.adjust)()
    }

    /// The database's time now, as this store estimates it; `None` before any statement
    /// answered.
    pub(super) fn database_time(&self) -> Option<i64> {
        self.clock.now(self.adjust())
    }
}

impl Issuer for Shared {
    /// The claim becomes an orphan, in the background; if that fails, the claim stays in
    /// progress until its lease ends.
    fn holder_gone(&self, key: &[u8], fence: u64) {
        let _ = self.submit(Job::Abandon {
            fenced: (Target::of(key), fence_column(fence)),
        });
    }
}

/// The engine's thread stopped (it panicked, or the store is being dropped).
pub(super) fn stopped() -> Error {
    Error::Database {
        sqlstate: None,
        reason: "the PostgreSQL engine's thread has stopped".into(),
        driver: None,
    }
}

impl PgStore {
    /// The identity its tickets carry.
    pub(crate) fn issuer(&self) -> *const () {
        Arc::as_ptr(&self.shared).cast()
    }

    /// Nothing halts a PostgreSQL store: each operation reaches the database or fails alone.
    pub(crate) fn check(&self) -> Result<()> {
        Ok(())
    }

    pub(crate) fn lease_duration(&self) -> Duration {
        self.shared.config.lease
    }

    pub(crate) fn figures(&self) -> EngineFigures {
        let shared = &*self.shared;
        EngineFigures {
            withdrawn: shared.withdrawn.load(Ordering::Relaxed)
                + shared.context.withdrawn.load(Ordering::Relaxed),
            commit_batches: shared.context.commits.load(Ordering::Relaxed),
            ..EngineFigures::default()
        }
    }
}
