//! The `metrics` half of [`super::Observer`]: every instrument's name, unit and description,
//! written once here, and the handles a store records through. `docs/operations.md` is the
//! operator's list of them.

use crate::sync::{AtomicI64, Ordering};
use metrics::{Counter, Gauge, Histogram, Label, Unit};
use std::path::{Path, PathBuf};

const CLAIMS: &str = "idemdb_claims_total";
const COMPLETES: &str = "idemdb_completes_total";
const RELEASES: &str = "idemdb_releases_total";
const TAKEOVERS: &str = "idemdb_takeovers_total";
const REAPED: &str = "idemdb_reaped_total";
const PURGED: &str = "idemdb_purged_total";
const HALTS: &str = "idemdb_halts_total";
const HEALS: &str = "idemdb_heals_total";
const CHECKPOINTS: &str = "idemdb_checkpoints_total";
const CLAIM_SECONDS: &str = "idemdb_claim_duration_seconds";
const BATCH_SIZE: &str = "idemdb_commit_batch_size";
const FSYNC_SECONDS: &str = "idemdb_fsync_duration_seconds";
const LIVE: &str = "idemdb_live_records";
const IN_PROGRESS: &str = "idemdb_in_progress_records";
const STALE: &str = "idemdb_stale_claims";
const FILE_BYTES: &str = "idemdb_file_bytes";

/// The claim decisions, in the order of `Decision`'s discriminants.
const DECISIONS: [&str; 4] = ["acquired", "replay", "in_progress", "mismatch"];

/// Tells the installed recorder each instrument's unit and meaning.
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        CLAIMS,
        Unit::Count,
        "Claims answered, by decision: acquired (takeovers included), replay, in_progress, mismatch"
    );
    describe_counter!(COMPLETES, Unit::Count, "Claims completed (durably)");
    describe_counter!(RELEASES, Unit::Count, "Claims released (durably)");
    describe_counter!(
        TAKEOVERS,
        Unit::Count,
        "Acquired claims that took over a stale claim"
    );
    describe_counter!(
        REAPED,
        Unit::Count,
        "Stale claims a reap resolver released or completed"
    );
    describe_counter!(PURGED, Unit::Count, "Expired records deleted by purges");
    describe_counter!(
        HALTS,
        Unit::Count,
        "Failed commits that halted the store file"
    );
    describe_counter!(HEALS, Unit::Count, "Halted store files reopened in place");
    describe_counter!(
        CHECKPOINTS,
        Unit::Count,
        "Durable redb commits after which the journal starts over"
    );
    describe_histogram!(
        CLAIM_SECONDS,
        Unit::Seconds,
        "Time a claim took, from the call to its answer (durable, when acquired)"
    );
    describe_histogram!(
        BATCH_SIZE,
        Unit::Count,
        "Operations in one group commit (one journal entry and one fdatasync)"
    );
    describe_histogram!(
        FSYNC_SECONDS,
        Unit::Seconds,
        "Time to write one batch's journal entry and fdatasync the journal"
    );
    describe_gauge!(
        LIVE,
        Unit::Count,
        "Records in the index: claims in progress and completions (expired ones not yet purged included)"
    );
    describe_gauge!(
        IN_PROGRESS,
        Unit::Count,
        "Claims in progress (stale ones included)"
    );
    describe_gauge!(
        STALE,
        Unit::Count,
        "Claims in progress whose lease ran out or whose holder is gone, as the last reap found them"
    );
    describe_gauge!(
        FILE_BYTES,
        Unit::Bytes,
        "Size of the store file and of its journal"
    );
}

pub(super) struct Meters {
    /// By decision, in [`DECISIONS`] order.
    pub(super) claims: [Counter; 4],
    pub(super) completes: Counter,
    pub(super) releases: Counter,
    pub(super) takeovers: Counter,
    pub(super) reaped: Counter,
    pub(super) purged: Counter,
    pub(super) halts: Counter,
    pub(super) heals: Counter,
    pub(super) checkpoints: Counter,
    pub(super) claim_seconds: Histogram,
    batch_size: Histogram,
    pub(super) fsync: Histogram,
    live: Gauge,
    in_progress: Gauge,
    pub(super) stale: Gauge,
    store_bytes: Gauge,
    journal_bytes: Gauge,
    /// Live records by state, changed with the index (under its stripe locks); read into the
    /// gauges by each commit.
    in_progress_records: AtomicI64,
    completed_records: AtomicI64,
    /// The store file and its journal, stated for the file gauges.
    files: Option<(PathBuf, PathBuf)>,
}

impl Default for Meters {
    /// Instruments that record nothing, for a configuration not yet opened.
    fn default() -> Meters {
        Meters {
            claims: std::array::from_fn(|_| Counter::noop()),
            completes: Counter::noop(),
            releases: Counter::noop(),
            takeovers: Counter::noop(),
            reaped: Counter::noop(),
            purged: Counter::noop(),
            halts: Counter::noop(),
            heals: Counter::noop(),
            checkpoints: Counter::noop(),
            claim_seconds: Histogram::noop(),
            batch_size: Histogram::noop(),
            fsync: Histogram::noop(),
            live: Gauge::noop(),
            in_progress: Gauge::noop(),
            stale: Gauge::noop(),
            store_bytes: Gauge::noop(),
            journal_bytes: Gauge::noop(),
            in_progress_records: AtomicI64::new(0),
            completed_records: AtomicI64::new(0),
            files: None,
        }
    }
}

impl Meters {
    /// Registers every instrument with the recorder installed now.
    pub(super) fn register(name: Option<&str>, file: Option<&Path>) -> Meters {
        describe();
        let base: Vec<Label> = name
            .map(|n| Label::new("store", n.to_owned()))
            .into_iter()
            .collect();
        let with = |key: &'static str, value: &'static str| {
            let mut labels = base.clone();
            labels.push(Label::new(key, value));
            labels
        };
        let counter = |name: &'static str| metrics::counter!(name, base.iter());
        Meters {
            claims: DECISIONS.map(|d| metrics::counter!(CLAIMS, with("decision", d).iter())),
            completes: counter(COMPLETES),
            releases: counter(RELEASES),
            takeovers: counter(TAKEOVERS),
            reaped: counter(REAPED),
            purged: counter(PURGED),
            halts: counter(HALTS),
            heals: counter(HEALS),
            checkpoints: counter(CHECKPOINTS),
            claim_seconds: metrics::histogram!(CLAIM_SECONDS, base.iter()),
            batch_size: metrics::histogram!(BATCH_SIZE, base.iter()),
            fsync: metrics::histogram!(FSYNC_SECONDS, base.iter()),
            live: metrics::gauge!(LIVE, base.iter()),
            in_progress: metrics::gauge!(IN_PROGRESS, base.iter()),
            stale: metrics::gauge!(STALE, base.iter()),
            store_bytes: metrics::gauge!(FILE_BYTES, with("file", "store").iter()),
            journal_bytes: metrics::gauge!(FILE_BYTES, with("file", "journal").iter()),
            in_progress_records: AtomicI64::new(0),
            completed_records: AtomicI64::new(0),
            files: file.map(|f| (f.to_owned(), crate::file::journal::file::journal_path(f))),
        }
    }

    pub(super) fn census(&self, in_progress: i64, completed: i64) {
        if in_progress != 0 {
            self.in_progress_records
                .fetch_add(in_progress, Ordering::Relaxed);
        }
        if completed != 0 {
            self.completed_records
                .fetch_add(completed, Ordering::Relaxed);
        }
    }

    /// An open (or a heal) rebuilt the index: the counts start from it.
    pub(super) fn opened(&self, in_progress: u64, completed: u64) {
        let signed = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.in_progress_records
            .store(signed(in_progress), Ordering::Relaxed);
        self.completed_records
            .store(signed(completed), Ordering::Relaxed);
        self.stale.set(0.0);
        if let Some((_, journal)) = &self.files {
            if let Ok(m) = std::fs::metadata(journal) {
                self.journal_bytes.set(m.len() as f64);
            }
        }
        self.committed(0);
    }

    /// After each commit: the batch's size, and every gauge a commit can move.
    pub(super) fn committed(&self, ops: usize) {
        if ops > 0 {
            self.batch_size.record(ops as f64);
        }
        let in_progress = self.in_progress_records.load(Ordering::Relaxed).max(0);
        let completed = self.completed_records.load(Ordering::Relaxed).max(0);
        self.in_progress.set(in_progress as f64);
        self.live.set((in_progress + completed) as f64);
        if let Some((store, _)) = &self.files {
            if let Ok(m) = std::fs::metadata(store) {
                self.store_bytes.set(m.len() as f64);
            }
        }
    }
}
