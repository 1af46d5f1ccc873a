//! The direct lane: a blocking caller with nothing else in flight sends its statement on a
//! connection its own thread drives, instead of handing the job to the engine's thread and
//! parking until that thread wakes it.
//!
//! Why: through the queue a lone caller's job crosses threads twice (the engine's thread is
//! woken, then the caller's), and on a virtual machine each wake of an idle CPU costs tens of
//! microseconds. Measured side by side with a raw client, that was about half of what a lone
//! claim cost on top of the bare insert (`docs/performance-history.md`). The lane's connection belongs
//! to a current-thread runtime that only the thread holding the lane polls, so the statement's
//! I/O happens on the caller's thread, as with a plain synchronous client.
//!
//! When: only for blocking operations called outside any tokio runtime (inside one, blocking
//! on another runtime is not allowed, and async callers use the queue anyway), only while no
//! job of the store is queued or running on the engine's thread, and only by one caller at a
//! time (taken with `try_lock`: a second caller goes through the queue). Under load the
//! queue's batches, one statement and one commit for many callers, are the faster way.
//!
//! Order: a job a caller sent through the queue (a withdrawal, a dropped ticket's orphan mark)
//! counts as queued until its batch ends, so that caller's next operation cannot overtake it
//! through the lane. What the lane runs is committed before its caller returns. Correctness
//! never rests on the lane being alone: each statement is atomic on the server, which orders it
//! against the batches of this store and of every other.

use super::batches;
use super::pool::Conn;
use super::scheduler::{Context, Job, Sorted};
use crate::sync::{Arc, Mutex, Ordering};

/// The lane's runtime and connection (opened on first use, and again after it closed).
pub(crate) struct Lane {
    runtime: tokio::runtime::Runtime,
    conn: Option<Arc<Conn>>,
}

impl Lane {
    /// Closes the connection without blocking (a store may be dropped inside a runtime, where
    /// dropping a runtime would panic).
    pub(crate) fn close(self) {
        drop(self.conn);
        self.runtime.shutdown_background();
    }
}

/// Runs `job` on the lane, answering it through its reply, if this caller may use the lane
/// (see the module's text); otherwise gives the job back for the queue.
pub(crate) fn try_run(context: &Context, lane: &Mutex<Option<Lane>>, job: Job) -> Option<Job> {
    if context.queued.load(Ordering::Acquire) != 0 || tokio::runtime::Handle::try_current().is_ok()
    {
        return Some(job);
    }
    let Some(mut guard) = lane.try_lock() else {
        return Some(job);
    };
    if guard.is_none() {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return Some(job);
        };
        *guard = Some(Lane {
            runtime,
            conn: None,
        });
    }
    let Lane { runtime, conn } = guard.as_mut().expect("built above");
    runtime.block_on(async {
        // The connection's task runs only while a caller is in here: give it a turn to read
        // what arrived meanwhile (the server closing the session), so that a closed
        // connection is replaced instead of failing the job.
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        let open = match conn.take() {
            Some(open) if open.usable() => Ok(open),
            _ => context.pool.connect().await.map(Arc::new),
        };
        if let Ok(open) = &open {
            *conn = Some(Arc::clone(open));
        }
        batches::run_sorted(context, open, Sorted::of(vec![job])).await;
    });
    None
}
