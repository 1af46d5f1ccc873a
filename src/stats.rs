//! Counters an operator watches.

use crate::model::report::EngineFigures;
use crate::sync::{AtomicU64, Ordering};

/// A snapshot of the store's counters since it was opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Stats {
    /// Claims that returned [`crate::Claim::Acquired`] (takeovers included).
    pub acquired: u64,
    /// Claims that returned [`crate::Claim::Replay`].
    pub replays: u64,
    /// Claims that returned [`crate::Claim::InProgress`].
    pub in_progress: u64,
    /// Claims that returned [`crate::Claim::Mismatch`].
    pub mismatches: u64,
    /// Successful [`crate::Store::complete`] calls.
    pub completes: u64,
    /// Successful [`crate::Store::release`] calls.
    pub releases: u64,
    /// Acquired claims that took over a stale claim.
    pub takeovers: u64,
    /// Stale claims a [`crate::Store::reap`] resolver or [`crate::Store::resolve`] released
    /// or completed, durably (a reap stopped by an oversize response counts what it resolved
    /// before).
    pub reaped: u64,
    /// Acquired claims withdrawn because nobody received them (a
    /// [`crate::Store::claim_async`] future dropped before it returned the ticket).
    pub withdrawn: u64,
    /// Expired records deleted by [`crate::Store::purge_expired`].
    pub purged: u64,
    /// Write transactions committed (each one fsync); `acquired + completes + ...` divided by
    /// this is the mean batch size.
    pub commit_batches: u64,
    /// Commits that were checkpoints: durable redb commits after which the journal starts over.
    pub checkpoints: u64,
    /// Records the store holds now (in progress or completed, expired ones not yet purged
    /// included), on a file: the index's count, read without touching the disk. `None` on
    /// PostgreSQL, where counting means reading the whole table: ask
    /// [`crate::Store::record_count`], which can fail, when the figure is worth that.
    pub live_records: Option<u64>,
    /// Bytes of the records in the store file as of the last commit: each record's encoded
    /// key, fingerprint, times and response, what [`crate::StoreBuilder::max_store_bytes`]
    /// limits. The files are larger (redb's pages and free space, the journal). Always 0 on
    /// PostgreSQL.
    pub stored_bytes: u64,
    /// Times the store reopened itself after a failed write or sync had halted it
    /// ([`crate::StoreBuilder::heal_after`]); always 0 on PostgreSQL.
    pub heals: u64,
    /// Whether claims that would write a record are refused now with
    /// [`crate::Error::DiskFull`]: at the last measurement, the filesystem had less free space
    /// than the store keeps for its recovery and its next checkpoint
    /// ([`crate::StoreBuilder::reserve_size`]). Always `false` on PostgreSQL.
    pub disk_full: bool,
}

/// The answers the store gave, counted once above the engines: the observer classifies every
/// answer at the seam (`crate::observe`), whichever engine gave it.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) acquired: AtomicU64,
    pub(crate) replays: AtomicU64,
    pub(crate) in_progress: AtomicU64,
    pub(crate) mismatches: AtomicU64,
    pub(crate) completes: AtomicU64,
    pub(crate) releases: AtomicU64,
    pub(crate) takeovers: AtomicU64,
    pub(crate) reaped: AtomicU64,
    pub(crate) purged: AtomicU64,
}

impl Counters {
    pub(crate) fn bump(counter: &AtomicU64, by: u64) {
        counter.fetch_add(by, Ordering::Relaxed);
    }

    /// The counters as they are now, with the engine's figures.
    pub(crate) fn snapshot(&self, engine: EngineFigures) -> Stats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Stats {
            acquired: get(&self.acquired),
            replays: get(&self.replays),
            in_progress: get(&self.in_progress),
            mismatches: get(&self.mismatches),
            completes: get(&self.completes),
            releases: get(&self.releases),
            takeovers: get(&self.takeovers),
            reaped: get(&self.reaped),
            withdrawn: engine.withdrawn,
            purged: get(&self.purged),
            commit_batches: engine.commit_batches,
            checkpoints: engine.checkpoints,
            live_records: engine.live_records,
            stored_bytes: engine.stored_bytes,
            heals: engine.heals,
            disk_full: engine.disk_full,
        }
    }
}
