//! Commits for async callers: an `idemdb-flush` thread, started on first use, leads commits
//! while any async caller waits, and the future an async caller awaits.

use crate::error::Result;
use crate::file::commit::halted;
use crate::file::commit::parity;
use crate::file::commit::Pipeline;
use crate::file::commit::Seq;
use crate::file::commit::Shared;
use crate::file::commit::State;
use crate::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

pub(super) const FLUSHER_NAME: &str = "idemdb-flush";

/// Tells the flusher thread there is an async caller to serve, or that the store is closing.
/// The thread holds only this and a `Weak` to the pipeline while idle, and the store's drop
/// waits until it lets go of a strong reference it took ([`Pipeline::close`]), so dropping the
/// last `Store` closes the file before the drop returns.
#[derive(Default)]
pub(super) struct FlushSignal {
    state: Mutex<FlushState>,
    wake: Condvar,
}

#[derive(Default)]
pub(super) struct FlushState {
    /// An async caller waits for a commit.
    pending: bool,
    /// The store is closing: the thread exits.
    shutdown: bool,
    /// The thread holds a strong reference to the pipeline.
    busy: bool,
}

impl FlushSignal {
    pub(super) fn raise(&self) {
        self.state.lock().pending = true;
        self.wake.notify_all();
    }

    /// Stops the thread and returns once it holds no strong reference to the pipeline (at
    /// once on a flusher thread itself: a waker run inline may drop the last `Store` there,
    /// and a thread cannot wait for itself).
    pub(super) fn shut_down(&self) {
        let mut s = self.state.lock();
        s.shutdown = true;
        self.wake.notify_all();
        let on_a_flusher = std::thread::current().name() == Some(FLUSHER_NAME);
        while s.busy && !on_a_flusher {
            self.wake.wait(&mut s);
        }
    }
}

impl Pipeline {
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

    pub(super) fn start_flusher(self: &Arc<Self>) {
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
}

impl Shared {
    /// Wakes the async callers whose ops are durable (all of them once halted).
    pub(super) fn wake_async(&self, s: &mut MutexGuard<'_, State>) {
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

    /// Leads commits while an async caller waits for an op not yet durable.
    pub(super) fn flush_for_async(&self) {
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

pub(super) fn flush_loop(pipeline: &Weak<Pipeline>, signal: &FlushSignal) {
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
