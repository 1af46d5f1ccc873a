//! Waiting for a key's claim to end: [`Store::wait`] and [`Store::wait_async`].
//!
//! A waiter checks the key under its stripe lock and, if a claim still holds it, registers a
//! `Waker` before the lock is released. Every change that can end a claim (a completion made
//! durable, a release, a withdrawn claim, a reap's release) wakes the key's waiters after
//! making the change under the same stripe lock, so no wake-up is lost: either the waiter's
//! check saw the change, or its registration was in place before the change was made. A lease
//! that runs out changes nothing in memory; the waiter sleeps until the lease's end by the
//! store's [`crate::Clock`] (and a clock moved by hand wakes it, see
//! [`crate::Clock::wake_on_change`]).
//!
//! The registry is one list per store: waiters are rare (duplicates of in-flight requests), and
//! the common path pays one relaxed load to learn that nobody waits.

use crate::config::StalePolicy;
use crate::error::Result;
use crate::file::index::{KeyHash, SlotState};
use crate::file::store::FileStore;
use crate::model::scope::Scope;
use crate::sync::{AtomicU64, AtomicUsize, Mutex, Ordering};
use crate::timer::{far_future, sleep_until, Delay};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// The waiters of one store: (registration id, key hash, waker).
#[derive(Default)]
pub(crate) struct Watchers {
    /// `list.len()`, readable without the lock.
    count: AtomicUsize,
    list: Mutex<Vec<(u64, KeyHash, Waker)>>,
    next_id: AtomicU64,
}

impl std::fmt::Debug for Watchers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watchers")
            .field("count", &self.count.load(Ordering::Relaxed))
            .finish()
    }
}

impl Watchers {
    /// Wakes the waiters of `hash`. Call it after changing the key's slot, with its stripe
    /// lock taken at or after the change.
    pub(crate) fn notify(&self, hash: &KeyHash) {
        if self.count.load(Ordering::SeqCst) == 0 {
            return;
        }
        let mut woken = Vec::new();
        {
            let mut list = self.list.lock();
            list.retain(|(_, h, waker)| {
                let hit = h == hash;
                if hit {
                    woken.push(waker.clone());
                }
                !hit
            });
            self.count.store(list.len(), Ordering::SeqCst);
        }
        // Outside the lock: a waker may run the waiter inline, which looks again.
        woken.into_iter().for_each(Waker::wake);
    }

    /// Wakes every waiter (the store halted: they must see the error).
    pub(crate) fn notify_all(&self) {
        let woken = std::mem::take(&mut *self.list.lock());
        self.count.store(0, Ordering::SeqCst);
        woken.into_iter().for_each(|(_, _, waker)| waker.wake());
    }

    /// Registers (or renews) registration `id` for `hash`. Call it with the key's stripe lock
    /// held, after seeing that a claim holds the key.
    fn arm(&self, id: u64, hash: KeyHash, waker: &Waker) {
        let mut list = self.list.lock();
        match list.iter_mut().find(|(i, _, _)| *i == id) {
            Some(entry) => {
                entry.1 = hash;
                entry.2.clone_from(waker);
            }
            None => list.push((id, hash, waker.clone())),
        }
        self.count.store(list.len(), Ordering::SeqCst);
    }

    fn disarm(&self, id: u64) {
        if self.count.load(Ordering::SeqCst) == 0 {
            return;
        }
        let mut list = self.list.lock();
        list.retain(|(i, _, _)| *i != id);
        self.count.store(list.len(), Ordering::SeqCst);
    }
}

/// What a waiter found.
enum Seen {
    /// No claim holds the key: a claim now would not answer `InProgress`.
    Free,
    /// A claim holds it until the lease ends (milliseconds since the epoch, by the store's
    /// clock), unless something ends it sooner.
    HeldUntil(u64),
    /// A claim holds it until something ends it (a completion being made durable, or a stale
    /// claim kept for the reaper).
    Held,
}

/// One waiter's registration; removed when dropped.
struct Watch {
    /// Owned, so that a future waiting on it borrows nothing (the store it came from may be
    /// replaced meanwhile by a healed one; this one then answers `Halted`).
    store: FileStore,
    hash: KeyHash,
    id: u64,
}

impl Watch {
    fn new(store: &FileStore, hash: KeyHash) -> Watch {
        let id = store.inner.watchers.next_id.fetch_add(1, Ordering::Relaxed);
        Watch {
            store: store.clone(),
            hash,
            id,
        }
    }

    /// Looks at the key and, while a claim holds it, registers `waker` (also with the clock,
    /// in case a test moves it by hand).
    fn look(&self, waker: &Waker) -> Result<Seen> {
        let store = &self.store;
        let inner = &*store.inner;
        inner.pipeline.check()?;
        let now = store.now();
        let stripe = inner.index.lock(&self.hash);
        let seen = match stripe.get(&self.hash).map(crate::file::index::Slot::state) {
            None => Seen::Free,
            Some(SlotState::Completed { durable: true, .. }) => Seen::Free,
            Some(SlotState::Completed { expires_at, .. }) if now >= expires_at => Seen::Free,
            Some(SlotState::Completed { .. }) => Seen::Held,
            Some(SlotState::InProgress { lease_until, .. }) if now < lease_until => {
                Seen::HeldUntil(lease_until)
            }
            Some(SlotState::InProgress { .. })
                if inner.config.stale_policy == StalePolicy::Keep =>
            {
                Seen::Held
            }
            Some(SlotState::InProgress { .. }) => Seen::Free,
        };
        if !matches!(seen, Seen::Free) {
            inner.watchers.arm(self.id, self.hash, waker);
        }
        drop(stripe);
        if !matches!(seen, Seen::Free) {
            inner.config.clock.wake_on_change(waker);
        }
        Ok(seen)
    }

    /// When to look again if nothing wakes the waiter first: its deadline, or the lease's end.
    fn next_look(&self, seen: &Seen, deadline: Instant) -> Instant {
        match seen {
            Seen::HeldUntil(lease_until) => {
                let left = Duration::from_millis(lease_until.saturating_sub(self.store.now()));
                Instant::now()
                    .checked_add(left)
                    .map_or(deadline, |at| at.min(deadline))
            }
            Seen::Held | Seen::Free => deadline,
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.store.inner.watchers.disarm(self.id);
    }
}

impl FileStore {
    pub(crate) fn wait(&self, scope: &Scope, key: &str, timeout: Duration) -> Result<bool> {
        let key = self.claim_key(scope, key)?;
        let deadline = Instant::now()
            .checked_add(timeout)
            .unwrap_or_else(far_future);
        let watch = Watch::new(self, key.hash);
        let waker = crate::sync::thread_waker();
        loop {
            let seen = watch.look(&waker)?;
            if matches!(seen, Seen::Free) {
                return Ok(true);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            std::thread::park_timeout(watch.next_look(&seen, deadline) - now);
        }
    }

    pub(crate) fn wait_async(
        &self,
        scope: &Scope,
        key: &str,
        timeout: Duration,
    ) -> impl Future<Output = Result<bool>> + Send + 'static {
        let deadline = Instant::now()
            .checked_add(timeout)
            .unwrap_or_else(far_future);
        let waiting = self.claim_key(scope, key).map(|key| WaitFuture {
            watch: Watch::new(self, key.hash),
            deadline,
            timer: None,
        });
        async move { waiting?.await }
    }
}

struct WaitFuture {
    watch: Watch,
    deadline: Instant,
    timer: Option<Delay>,
}

impl Future for WaitFuture {
    type Output = Result<bool>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<bool>> {
        let this = &mut *self;
        loop {
            let seen = match this.watch.look(cx.waker()) {
                Ok(seen) => seen,
                Err(e) => return Poll::Ready(Err(e)),
            };
            if matches!(seen, Seen::Free) {
                return Poll::Ready(Ok(true));
            }
            if Instant::now() >= this.deadline {
                return Poll::Ready(Ok(false));
            }
            let at = this.watch.next_look(&seen, this.deadline);
            let timer = match &mut this.timer {
                Some(t) if t.deadline() == at => t,
                slot => slot.insert(sleep_until(at)),
            };
            if Pin::new(timer).poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
    }
}
