//! A runtime-free sleep: one lazily started thread wakes registered wakers at their deadlines.
//! Async waits ([`crate::Store::wait_async`]) and the HTTP layer's lease heartbeat need timers,
//! but the crate must not depend on an async runtime. `futures-util` and `futures-channel` have
//! no timer; `futures-timer` is this same design (a global timer thread) as one more
//! dependency, for about a hundred lines.

use parking_lot::{Condvar, Mutex};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

struct Timers {
    due: Mutex<BinaryHeap<Reverse<(Instant, u64)>>>,
    wakers: Mutex<std::collections::HashMap<u64, Waker>>,
    changed: Condvar,
    next_id: std::sync::atomic::AtomicU64,
}

fn timers() -> &'static Timers {
    static TIMERS: OnceLock<&'static Timers> = OnceLock::new();
    TIMERS.get_or_init(|| {
        let t: &'static Timers = Box::leak(Box::new(Timers {
            due: Mutex::new(BinaryHeap::new()),
            wakers: Mutex::new(std::collections::HashMap::new()),
            changed: Condvar::new(),
            next_id: std::sync::atomic::AtomicU64::new(0),
        }));
        std::thread::Builder::new()
            .name("idemdb-timer".into())
            .spawn(move || run(t))
            .expect("spawn the idemdb-timer thread");
        t
    })
}

fn run(t: &'static Timers) {
    let mut due = t.due.lock();
    loop {
        let now = Instant::now();
        while let Some(Reverse((at, id))) = due.peek().copied() {
            if at > now {
                break;
            }
            due.pop();
            if let Some(w) = t.wakers.lock().remove(&id) {
                w.wake();
            }
        }
        match due.peek() {
            Some(Reverse((at, _))) => {
                let at = *at;
                t.changed.wait_until(&mut due, at);
            }
            None => t.changed.wait(&mut due),
        }
    }
}

/// Resolves at `deadline`.
pub(crate) struct Delay {
    deadline: Instant,
    id: Option<u64>,
}

/// Resolves after `d` (or in [`far_future`] if `d` overflows the clock).
pub(crate) fn sleep(d: Duration) -> Delay {
    sleep_until(Instant::now().checked_add(d).unwrap_or_else(far_future))
}

/// Resolves at `deadline`.
pub(crate) fn sleep_until(deadline: Instant) -> Delay {
    Delay { deadline, id: None }
}

/// An instant no wait reaches: about 30 years from now.
pub(crate) fn far_future() -> Instant {
    let now = Instant::now();
    now.checked_add(Duration::from_secs(30 * 365 * 24 * 3600))
        .unwrap_or(now)
}

impl Delay {
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }
}

impl Future for Delay {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.deadline {
            return Poll::Ready(());
        }
        let t = timers();
        match self.id {
            Some(id) => {
                t.wakers.lock().insert(id, cx.waker().clone());
            }
            None => {
                let id = t.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                t.wakers.lock().insert(id, cx.waker().clone());
                t.due.lock().push(Reverse((self.deadline, id)));
                t.changed.notify_one();
                self.id = Some(id);
            }
        }
        Poll::Pending
    }
}

impl Drop for Delay {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            timers().wakers.lock().remove(&id);
        }
    }
}
