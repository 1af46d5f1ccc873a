//! Time, injected: leases and TTLs read a [`Clock`], so tests advance a [`ManualClock`] instead
//! of sleeping.

use crate::sync::{Arc, AtomicU64, Mutex, Ordering};
use std::task::Waker;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of wall-clock time. Deadlines are persisted, so they must be wall-clock (they
/// outlive the process); the store tolerates a clock that steps backwards (a lease then lasts
/// longer, a record lives longer) but never acts on a deadline before the clock reaches it.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// The current time.
    fn now(&self) -> SystemTime;

    /// Asks the clock to wake `waker` the next time it is moved other than by the passing of
    /// real time (a [`ManualClock`] advanced by a test), so that a waiter sleeping until a
    /// lease's end looks again. The default does nothing: a clock that follows real time
    /// reaches a deadline while its waiters sleep towards it.
    fn wake_on_change(&self, waker: &Waker) {
        let _ = waker;
    }
}

/// The operating system's wall clock (`clock_gettime(CLOCK_REALTIME)` on Linux).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that moves only when told to, for tests.
///
/// Clones share one time, so a test keeps a clone and advances the store's clock.
///
/// ```
/// use idemdb::{Clock, ManualClock};
/// use std::time::Duration;
/// let clock = ManualClock::new();
/// let t0 = clock.now();
/// clock.advance(Duration::from_secs(61));
/// assert_eq!(clock.now().duration_since(t0).unwrap(), Duration::from_secs(61));
/// ```
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<Manual>);

#[derive(Debug)]
struct Manual {
    millis: AtomicU64,
    /// Woken at the next `advance`.
    waiters: Mutex<Vec<Waker>>,
}

impl ManualClock {
    /// A clock at 2026-01-01T00:00:00Z.
    pub fn new() -> ManualClock {
        ManualClock::at(UNIX_EPOCH + Duration::from_secs(1_767_225_600))
    }

    /// A clock at `time` (times before the epoch read as the epoch).
    pub fn at(time: SystemTime) -> ManualClock {
        ManualClock(Arc::new(Manual {
            millis: AtomicU64::new(to_millis(time)),
            waiters: Mutex::new(Vec::new()),
        }))
    }

    /// Moves the clock forward by `by` (millisecond resolution), and wakes whoever waits for a
    /// deadline by it ([`Clock::wake_on_change`]).
    pub fn advance(&self, by: Duration) {
        self.0
            .millis
            .fetch_add(duration_millis(by), Ordering::SeqCst);
        let waiters = std::mem::take(&mut *self.0.waiters.lock());
        for waker in waiters {
            waker.wake();
        }
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        from_millis(self.0.millis.load(Ordering::SeqCst))
    }

    fn wake_on_change(&self, waker: &Waker) {
        let mut waiters = self.0.waiters.lock();
        if !waiters.iter().any(|w| w.will_wake(waker)) {
            waiters.push(waker.clone());
        }
    }
}

/// Milliseconds since the Unix epoch, saturating: the store's internal and on-disk time unit.
pub(crate) fn to_millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, duration_millis)
}

pub(crate) fn from_millis(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

pub(crate) fn duration_millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
