//! The database's clock, as this store estimates it between statements. Leases and expiries
//! are the database's time on PostgreSQL (every statement reads `now()` there); the estimate
//! here only decides whether a cached completion is safely far from its expiry, and a test
//! may inject a clock whose time replaces the database's in every statement.

use crate::config::Config;
use crate::sync::{Arc, AtomicI64, Ordering};
use std::time::Instant;

/// How far ahead of the database's time (as estimated here) a cached completion's expiry must
/// be for the cache to replay it. The estimate trails the database's clock by up to a round
/// trip and drifts with this machine's clock rate between statements; a second covers both
/// with room to spare, and a replay that is not served from the cache is read from the
/// database, which decides exactly.
pub(super) const CACHE_MARGIN_MS: i64 = 1000;

/// `DatabaseClock::offset` before any statement answered.
const UNSEEN: i64 = i64::MIN;

/// The database's time as last seen: its time minus `started`'s elapsed milliseconds, at the
/// moment of a statement's answer.
pub(super) struct DatabaseClock {
    offset: AtomicI64,
    started: Instant,
}

impl DatabaseClock {
    pub(super) fn new() -> DatabaseClock {
        DatabaseClock {
            offset: AtomicI64::new(UNSEEN),
            started: Instant::now(),
        }
    }

    fn elapsed_ms(&self) -> i64 {
        i64::try_from(self.started.elapsed().as_millis()).unwrap_or(i64::MAX)
    }

    /// Notes the database's time `now`, as a statement just answered it.
    pub(super) fn saw(&self, now: i64) {
        self.offset
            .store(now.saturating_sub(self.elapsed_ms()), Ordering::Relaxed);
    }

    /// The database's time now, as estimated here (`injected`, a test clock's time, exactly);
    /// `None` before any statement answered.
    pub(super) fn now(&self, injected: Option<i64>) -> Option<i64> {
        if injected.is_some() {
            return injected;
        }
        match self.offset.load(Ordering::Relaxed) {
            UNSEEN => None,
            offset => Some(offset.saturating_add(self.elapsed_ms())),
        }
    }
}

/// The time statements use instead of the database's: `None` (the database's clock) unless a
/// clock was injected with [`crate::StoreBuilder::clock`], which is for tests (a
/// [`crate::ManualClock`]); the machine's own clock never counts on PostgreSQL.
pub(super) fn clock_adjustment(config: &Config) -> Box<dyn Fn() -> Option<i64> + Send + Sync> {
    if !config.clock_injected {
        return Box::new(|| None);
    }
    let clock = Arc::clone(&config.clock);
    Box::new(move || Some(i64::try_from(crate::clock::to_millis(clock.now())).unwrap_or(i64::MAX)))
}
