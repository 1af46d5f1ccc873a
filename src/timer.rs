//! A runtime-free sleep: one lazily started thread wakes registered wakers at their deadlines.
//! Async waits ([`crate::Store::wait_async`]) and the HTTP layer's lease heartbeat need timers,
//! but the crate must not depend on an async runtime. `futures-util` and `futures-channel` have
//! no timer; `futures-timer` is this same design (a global timer thread) as one more
//! dependency, for about a hundred lines.
//!
//! Every pending [`Delay`] is one entry of an ordered map, keyed by its deadline and a unique
//! id; a `Delay` dropped before its deadline removes its entry, so the map holds exactly the
//! delays that are waiting (a cancelled wait with a long timeout leaves nothing behind).

use crate::sync::{AtomicU64, Condvar, Mutex, OnceLock, Ordering};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// A pending delay's place in the map: its deadline, then a unique id.
type Entry = (Instant, u64);

struct Timers {
    pending: Mutex<BTreeMap<Entry, Waker>>,
    /// Signalled when an entry earlier than every other is added.
    changed: Condvar,
    next_id: AtomicU64,
}

fn timers() -> &'static Timers {
    static TIMERS: OnceLock<&'static Timers> = OnceLock::new();
    TIMERS.get_or_init(|| {
        let t: &'static Timers = Box::leak(Box::new(Timers {
            pending: Mutex::new(BTreeMap::new()),
            changed: Condvar::new(),
            next_id: AtomicU64::new(0),
        }));
        std::thread::Builder::new()
            .name("idemdb-timer".into())
            .spawn(move || run(t))
            .expect("spawn the idemdb-timer thread");
        t
    })
}

fn run(t: &'static Timers) {
    let mut pending = t.pending.lock();
    loop {
        let now = Instant::now();
        while let Some(entry) = pending.first_entry() {
            if entry.key().0 > now {
                break;
            }
            entry.remove().wake();
        }
        match pending.first_key_value() {
            Some((&(at, _), _)) => {
                t.changed.wait_until(&mut pending, at);
            }
            None => t.changed.wait(&mut pending),
        }
    }
}

/// Resolves at `deadline`.
pub(crate) struct Delay {
    deadline: Instant,
    /// Its entry in the map once polled, until it fires or is dropped.
    entry: Option<Entry>,
}

/// Resolves after `d` (or in [`far_future`] if `d` overflows the clock).
pub(crate) fn sleep(d: Duration) -> Delay {
    sleep_until(Instant::now().checked_add(d).unwrap_or_else(far_future))
}

/// Resolves at `deadline`.
pub(crate) fn sleep_until(deadline: Instant) -> Delay {
    Delay {
        deadline,
        entry: None,
    }
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
        let mut pending = t.pending.lock();
        match self.entry {
            // Still waiting: only the waker may have changed.
            Some(entry) if pending.contains_key(&entry) => {
                if let Some(waker) = pending.get_mut(&entry) {
                    if !waker.will_wake(cx.waker()) {
                        waker.clone_from(cx.waker());
                    }
                }
            }
            // Not yet registered, or woken early (the deadline passed while the thread ran
            // late): register, so that a wake is due.
            _ => {
                let entry = (self.deadline, t.next_id.fetch_add(1, Ordering::Relaxed));
                let first = pending.first_key_value().is_none_or(|(k, _)| entry < *k);
                pending.insert(entry, cx.waker().clone());
                drop(pending);
                if first {
                    t.changed.notify_one();
                }
                self.entry = Some(entry);
            }
        }
        Poll::Pending
    }
}

impl Drop for Delay {
    fn drop(&mut self) {
        if let Some(entry) = self.entry {
            timers().pending.lock().remove(&entry);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::thread_waker;

    fn poll_once(delay: &mut Delay) -> Poll<()> {
        let waker = thread_waker();
        Pin::new(delay).poll(&mut Context::from_waker(&waker))
    }

    /// A dropped `Delay` used to remove its waker but leave its entry in the timer's heap, so
    /// every cancelled wait with a long timeout stayed there until its deadline: a leak that
    /// grew with each cancelled `wait_async`.
    #[test]
    fn cancelled_delays_leave_nothing_behind() {
        let mut delays: Vec<Delay> = (0..10_000)
            .map(|_| sleep(Duration::from_secs(3600)))
            .collect();
        for d in &mut delays {
            assert!(poll_once(d).is_pending());
        }
        let entries: Vec<Entry> = delays.iter().filter_map(|d| d.entry).collect();
        assert_eq!(entries.len(), 10_000);
        let held = |entries: &[Entry]| {
            let pending = timers().pending.lock();
            entries.iter().filter(|e| pending.contains_key(e)).count()
        };
        assert_eq!(held(&entries), 10_000);
        drop(delays);
        assert_eq!(held(&entries), 0, "dropped delays stay in the timer");
    }

    #[test]
    fn a_delay_fires_at_its_deadline_and_then_leaves_nothing() {
        let mut delay = sleep(Duration::from_millis(20));
        let started = Instant::now();
        while poll_once(&mut delay).is_pending() {
            std::thread::park_timeout(Duration::from_millis(100));
        }
        assert!(started.elapsed() >= Duration::from_millis(20));
        let entry = delay.entry.expect("it was registered");
        assert!(!timers().pending.lock().contains_key(&entry));
    }

    #[test]
    fn polling_again_keeps_one_entry() {
        let mut delay = sleep(Duration::from_secs(3600));
        for _ in 0..100 {
            assert!(poll_once(&mut delay).is_pending());
        }
        let entry = delay.entry.expect("registered");
        let same = timers()
            .pending
            .lock()
            .keys()
            .filter(|k| k.0 == entry.0)
            .count();
        assert_eq!(same, 1);
    }
}
