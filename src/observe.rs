//! Observability: the store's own counters ([`crate::Stats`], always), a span per public
//! operation and events for what an operator must hear about (feature `tracing`), counters,
//! histograms and gauges (feature `metrics`). The rest of the crate calls only this module.
//! Every answer is classified here once, above both engines. With a feature off its half of
//! every function is compiled out and its fields are gone: with both off an operation pays
//! for its counter's atomic add and nothing else. `docs/operations.md` lists every metric,
//! span and event.
//!
//! Instruments are resolved once, when a store opens ([`Observer::attach`]), from the
//! `metrics` recorder installed then, so the hot path adds to a handle (an atomic) instead of
//! looking a name up. Spans are built at DEBUG: under a subscriber at INFO, as in production,
//! each costs one check of the level.

use crate::error::Result;
use crate::model::claim::Claim;
use crate::model::report::Tally;
use crate::model::scope::Scope;
use crate::model::ticket::Ticket;
use crate::stats::Counters;
use crate::sync::Arc;
use std::future::Future;
use std::path::Path;

/// Whether anything is observed at all. Work done only to be observed (counting the orphans an
/// open found) is skipped without.
pub(crate) const ACTIVE: bool = cfg!(any(feature = "metrics", feature = "tracing"));

/// A public operation other than `claim`, for its span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Complete,
    Release,
    Extend,
    Reap,
    Resolve,
    Purge,
    Wait,
}

/// What an operation's span names: the scope of a claim or a wait, the ticket of the others.
#[derive(Clone, Copy)]
#[cfg_attr(not(feature = "tracing"), allow(dead_code))]
pub(crate) enum Subject<'a> {
    Scope(&'a Scope),
    Ticket(&'a Ticket),
    Store,
}

/// One store's instruments, shared by its clones and by the stores a heal replaces it with.
#[derive(Clone, Default)]
pub(crate) struct Observer {
    counters: Arc<Counters>,
    #[cfg(feature = "metrics")]
    meters: Arc<meters::Meters>,
    #[cfg(feature = "tracing")]
    name: Option<Arc<str>>,
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer").finish_non_exhaustive()
    }
}

/// A started clock, for a duration an instrument records; empty when nothing is observed.
pub(crate) struct Lap {
    #[cfg(any(feature = "metrics", feature = "tracing"))]
    started: std::time::Instant,
}

impl Lap {
    pub(crate) fn start() -> Lap {
        Lap {
            #[cfg(any(feature = "metrics", feature = "tracing"))]
            started: std::time::Instant::now(),
        }
    }
}

/// An operation's span (and, for a claim, its latency), closed by one of the `finish` calls.
#[must_use]
#[cfg_attr(not(any(feature = "metrics", feature = "tracing")), allow(dead_code))]
pub(crate) struct Span<'o> {
    observer: &'o Observer,
    op: Option<Op>,
    #[cfg(feature = "tracing")]
    span: tracing::Span,
    /// When a claim started, for its latency.
    #[cfg(feature = "metrics")]
    lap: Option<Lap>,
}

/// Builds the span of `op`, one callsite per operation (a span's name is static).
#[cfg(feature = "tracing")]
macro_rules! op_span {
    ($name:literal, $store:expr) => {
        tracing::debug_span!(
            target: "idemdb",
            $name,
            store = $store,
            tenant = tracing::field::Empty,
            endpoint = tracing::field::Empty,
            fence = tracing::field::Empty,
            decision = tracing::field::Empty,
            takeover = tracing::field::Empty,
            count = tracing::field::Empty,
            error = tracing::field::Empty,
        )
    };
}

impl Observer {
    /// The instruments of a store being opened: registered with the `metrics` recorder
    /// installed now, each labelled `store = name` when the store has a name. `file`: the
    /// store's file, whose size (and its journal's) the file gauges report.
    #[allow(unused_variables)]
    pub(crate) fn attach(name: Option<&str>, file: Option<&Path>) -> Observer {
        Observer {
            counters: Arc::default(),
            #[cfg(feature = "metrics")]
            meters: Arc::new(meters::Meters::register(name, file)),
            #[cfg(feature = "tracing")]
            name: name.map(Arc::from),
        }
    }

    /// The store's counters, for [`crate::Stats`].
    pub(crate) fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The span of a claim; [`Span::claimed`] closes it.
    #[allow(unused_variables)]
    pub(crate) fn claim(&self, scope: &Scope) -> Span<'_> {
        Span {
            observer: self,
            op: None,
            #[cfg(feature = "tracing")]
            span: self.subject(op_span!("claim", self.name()), Subject::Scope(scope)),
            #[cfg(feature = "metrics")]
            lap: Some(Lap::start()),
        }
    }

    /// The span of `op` on `subject`.
    #[allow(unused_variables)]
    pub(crate) fn op(&self, op: Op, subject: Subject<'_>) -> Span<'_> {
        Span {
            observer: self,
            op: Some(op),
            #[cfg(feature = "tracing")]
            span: {
                let store = self.name();
                let span = match op {
                    Op::Complete => op_span!("complete", store),
                    Op::Release => op_span!("release", store),
                    Op::Extend => op_span!("extend", store),
                    Op::Reap => op_span!("reap", store),
                    Op::Resolve => op_span!("resolve", store),
                    Op::Purge => op_span!("purge", store),
                    Op::Wait => op_span!("wait", store),
                };
                self.subject(span, subject)
            },
            #[cfg(feature = "metrics")]
            lap: None,
        }
    }

    #[cfg(feature = "tracing")]
    fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// Records the subject's tenant, endpoint and fence, only if the span is enabled. The key,
    /// the fingerprint and any body are never recorded.
    #[cfg(feature = "tracing")]
    fn subject(&self, span: tracing::Span, subject: Subject<'_>) -> tracing::Span {
        if span.is_disabled() {
            return span;
        }
        match subject {
            Subject::Scope(scope) => {
                span.record("tenant", scope.tenant());
                span.record("endpoint", scope.endpoint());
            }
            Subject::Ticket(ticket) => {
                if let Some((tenant, endpoint, _)) =
                    crate::model::scope::scoped_key_parts(ticket.key())
                {
                    span.record("tenant", tenant);
                    span.record("endpoint", endpoint);
                }
                span.record("fence", ticket.fence());
            }
            Subject::Store => {}
        }
        span
    }

    /// Live records by state changed by `in_progress` and `completed` (a claim of a new key:
    /// `(1, 0)`; its completion: `(-1, 1)`). The gauges read these counts at the next commit.
    #[allow(unused_variables)]
    #[inline]
    pub(crate) fn census(&self, in_progress: i64, completed: i64) {
        #[cfg(feature = "metrics")]
        self.meters.census(in_progress, completed);
    }

    /// An open found less free space than its recovery may need and released the reserve.
    pub(crate) fn reserve_released(&self, bytes: u64) {
        #[cfg(feature = "tracing")]
        tracing::warn!(
            target: "idemdb",
            store = self.name(),
            bytes,
            "the filesystem is short of the space recovery may need: the reserve is released \
             for it, and claims are refused (DiskFull) until space is freed"
        );
        #[cfg(not(feature = "tracing"))]
        let _ = bytes;
    }

    /// An open found the marker of an earlier open that never finished: it verifies every page
    /// before trusting any.
    pub(crate) fn unfinished_open_found(&self) {
        #[cfg(feature = "tracing")]
        tracing::warn!(
            target: "idemdb",
            store = self.name(),
            "an earlier open of this store never finished (the process died in it): verifying \
             every page before trusting any"
        );
    }

    /// An open found the heads table unusable (`reason`) and rebuilt it from the records: a
    /// slower open, nothing lost (the records are the authority).
    #[allow(unused_variables)]
    pub(crate) fn heads_rebuilt(&self, reason: &str) {
        #[cfg(feature = "tracing")]
        tracing::warn!(
            target: "idemdb",
            store = self.name(),
            reason,
            "the heads table was rebuilt from the records: {reason}"
        );
    }

    /// A store file opened: `replayed` ops came back from the journal, and the index holds
    /// `in_progress` claims (every one an orphan: its holder was a previous process) and
    /// `completed` records.
    #[allow(unused_variables)]
    pub(crate) fn opened(&self, replayed: usize, in_progress: u64, completed: u64) {
        #[cfg(feature = "metrics")]
        self.meters.opened(in_progress, completed);
        #[cfg(feature = "tracing")]
        if replayed > 0 || in_progress > 0 {
            tracing::info!(
                target: "idemdb",
                store = self.name(),
                replayed,
                orphans = in_progress,
                records = in_progress + completed,
                "recovered: {replayed} ops replayed from the journal, {in_progress} orphaned claims"
            );
        } else {
            tracing::debug!(
                target: "idemdb",
                store = self.name(),
                records = completed,
                "opened with nothing to recover"
            );
        }
    }

    /// A batch of `ops` committed (the store's gauges are brought up to date).
    #[allow(unused_variables)]
    pub(crate) fn committed(&self, ops: usize) {
        #[cfg(feature = "metrics")]
        self.meters.committed(ops);
    }

    /// A journal entry was written and synced, since `lap` started.
    #[allow(unused_variables)]
    pub(crate) fn synced(&self, lap: &Lap) {
        #[cfg(feature = "metrics")]
        self.meters.fsync.record(lap.started.elapsed());
    }

    /// A checkpoint of a batch of `ops` finished, since `lap` started.
    #[allow(unused_variables)]
    pub(crate) fn checkpointed(&self, ops: usize, lap: &Lap) {
        #[cfg(feature = "metrics")]
        self.meters.checkpoints.increment(1);
        #[cfg(feature = "tracing")]
        tracing::debug!(
            target: "idemdb",
            store = self.name(),
            ops,
            seconds = lap.started.elapsed().as_secs_f64(),
            "checkpoint: the journal starts over"
        );
    }

    /// A commit failed: the store halted.
    #[allow(unused_variables)]
    pub(crate) fn halted(&self, cause: &str) {
        #[cfg(feature = "metrics")]
        self.meters.halts.increment(1);
        #[cfg(feature = "tracing")]
        tracing::error!(
            target: "idemdb",
            store = self.name(),
            cause,
            "halted: every operation fails until the store heals or is reopened"
        );
    }

    /// An attempt to heal a halted store: `Ok`, or why it failed and whether it will be
    /// attempted again.
    #[allow(unused_variables)]
    pub(crate) fn heal_attempted(&self, outcome: std::result::Result<(), (&str, bool)>) {
        #[cfg(feature = "metrics")]
        if outcome.is_ok() {
            self.meters.heals.increment(1);
        }
        #[cfg(feature = "tracing")]
        match outcome {
            Ok(()) => tracing::info!(
                target: "idemdb",
                store = self.name(),
                "healed: the store file was reopened and serves again"
            ),
            Err((why, true)) => tracing::warn!(
                target: "idemdb",
                store = self.name(),
                why,
                "a heal attempt failed; trying again later"
            ),
            Err((why, false)) => tracing::error!(
                target: "idemdb",
                store = self.name(),
                why,
                "the store cannot heal: it stays halted until the process reopens it"
            ),
        }
    }

    /// A reap found `stale` stale claims (the gauge of them).
    #[allow(unused_variables)]
    pub(crate) fn stale(&self, stale: usize) {
        #[cfg(feature = "metrics")]
        self.meters.stale.set(stale as f64);
    }
}

impl Span<'_> {
    /// Runs the claim `f` inside the span, and closes it with the claim's decision.
    pub(crate) fn claim(self, f: impl FnOnce() -> Result<Claim>) -> Result<Claim> {
        let claim = self.run(f);
        self.claimed(&claim);
        claim
    }

    /// [`Span::claim`] for an async claim.
    pub(crate) async fn claim_async(
        self,
        fut: impl Future<Output = Result<Claim>>,
    ) -> Result<Claim> {
        let claim = self.run_async(fut).await;
        self.claimed(&claim);
        claim
    }

    /// Runs the operation `f` inside the span, and closes it with its outcome.
    pub(crate) fn call<T>(self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let result = self.run(f);
        self.finish(&result);
        result
    }

    /// [`Span::call`] for an async operation.
    pub(crate) async fn call_async<T>(self, fut: impl Future<Output = Result<T>>) -> Result<T> {
        let result = self.run_async(fut).await;
        self.finish(&result);
        result
    }

    /// [`Span::call`] for a reap or a purge, which tallies how many records it resolved or
    /// deleted (counted even when an error stopped it).
    pub(crate) fn call_counted(self, f: impl FnOnce() -> Tally) -> Result<usize> {
        let tally = self.run(f);
        let result = match tally.stopped {
            None => Ok(tally.done),
            Some(e) => Err(e),
        };
        self.finish_counted(&result, tally.done as u64);
        result
    }

    /// [`Span::call`] for a resolve, which resolved one claim or none.
    pub(crate) fn call_resolved(self, f: impl FnOnce() -> Result<bool>) -> Result<bool> {
        let result = self.run(f);
        let count = u64::from(matches!(result, Ok(true)));
        self.finish_counted(&result, count);
        result
    }

    /// Runs `f` inside the span.
    fn run<T>(&self, f: impl FnOnce() -> T) -> T {
        #[cfg(feature = "tracing")]
        let _entered = self.span.enter();
        f()
    }

    /// Awaits `fut` inside the span (entered at each poll).
    async fn run_async<T>(&self, fut: impl Future<Output = T>) -> T {
        #[cfg(feature = "tracing")]
        let fut = tracing::Instrument::instrument(fut, self.span.clone());
        fut.await
    }

    /// Closes a claim's span with its decision (and its fence when acquired).
    fn claimed(self, claim: &Result<Claim>) {
        let decision = match claim {
            Ok(Claim::Acquired(_)) => Decision::Acquired,
            Ok(Claim::Replay(_)) => Decision::Replay,
            Ok(Claim::InProgress { .. }) => Decision::InProgress,
            Ok(Claim::Mismatch { .. }) => Decision::Mismatch,
            Err(_) => Decision::Error,
        };
        let takeover = match claim {
            Ok(Claim::Acquired(ticket)) => ticket.takeover(),
            _ => None,
        };
        let c = &self.observer.counters;
        let counter = match decision {
            Decision::Acquired => Some(&c.acquired),
            Decision::Replay => Some(&c.replays),
            Decision::InProgress => Some(&c.in_progress),
            Decision::Mismatch => Some(&c.mismatches),
            Decision::Error => None,
        };
        if let Some(counter) = counter {
            Counters::bump(counter, 1);
        }
        if takeover.is_some() {
            Counters::bump(&c.takeovers, 1);
        }
        #[cfg(feature = "metrics")]
        {
            let m = &self.observer.meters;
            if let Some(counter) = m.claims.get(decision as usize) {
                counter.increment(1);
            }
            if takeover.is_some() {
                m.takeovers.increment(1);
            }
            if let Some(lap) = &self.lap {
                m.claim_seconds.record(lap.started.elapsed());
            }
        }
        #[cfg(feature = "tracing")]
        {
            let span = &self.span;
            span.record("decision", decision.name());
            if let Ok(Claim::Acquired(ticket)) = claim {
                span.record("fence", ticket.fence());
                span.record("takeover", takeover.is_some());
            }
            if let Err(e) = claim {
                span.record("error", tracing::field::display(e));
            }
            if let (Some(t), Ok(Claim::Acquired(ticket))) = (takeover, claim) {
                let _in = span.enter();
                tracing::warn!(
                    target: "idemdb",
                    store = self.observer.name(),
                    fence = ticket.fence(),
                    previous_fence = t.previous_fence,
                    orphan = t.orphan,
                    "takeover: a stale claim's lease ran out and a retry took the key over; \
                     reconcile before repeating the side effect"
                );
            }
        }
        #[cfg(not(any(feature = "metrics", feature = "tracing")))]
        let _ = (decision, takeover);
    }

    /// Closes the span of an operation with its outcome.
    fn finish<T>(self, result: &Result<T>) {
        self.finish_counted(result, u64::from(result.is_ok()));
    }

    /// Closes the span of an operation that did something `count` times (a completion, a
    /// release: once), counting it.
    #[allow(unused_variables)]
    fn finish_counted<T>(self, result: &Result<T>, count: u64) {
        let c = &self.observer.counters;
        let counter = match self.op {
            Some(Op::Complete) => Some(&c.completes),
            Some(Op::Release) => Some(&c.releases),
            Some(Op::Reap | Op::Resolve) => Some(&c.reaped),
            Some(Op::Purge) => Some(&c.purged),
            _ => None,
        };
        if let Some(counter) = counter {
            Counters::bump(counter, count);
        }
        #[cfg(feature = "metrics")]
        {
            let m = &self.observer.meters;
            let counter = match self.op {
                Some(Op::Complete) => Some(&m.completes),
                Some(Op::Release) => Some(&m.releases),
                Some(Op::Reap | Op::Resolve) => Some(&m.reaped),
                Some(Op::Purge) => Some(&m.purged),
                _ => None,
            };
            if let (Some(counter), true) = (counter, count > 0) {
                counter.increment(count);
            }
        }
        #[cfg(feature = "tracing")]
        {
            let span = &self.span;
            match result {
                Err(e) => {
                    span.record("error", tracing::field::display(e));
                }
                Ok(_) if matches!(self.op, Some(Op::Reap | Op::Resolve | Op::Purge)) => {
                    span.record("count", count);
                }
                Ok(_) => {}
            }
            if self.op == Some(Op::Reap) && count > 0 {
                let _in = span.enter();
                tracing::info!(
                    target: "idemdb",
                    store = self.observer.name(),
                    resolved = count,
                    "reaped {count} stale claims"
                );
            }
        }
    }
}

/// What a claim answered, for its counter and span.
#[derive(Debug, Clone, Copy)]
enum Decision {
    Acquired = 0,
    Replay = 1,
    InProgress = 2,
    Mismatch = 3,
    Error = 4,
}

impl Decision {
    #[cfg_attr(not(feature = "tracing"), allow(dead_code))]
    fn name(self) -> &'static str {
        match self {
            Decision::Acquired => "acquired",
            Decision::Replay => "replay",
            Decision::InProgress => "in_progress",
            Decision::Mismatch => "mismatch",
            Decision::Error => "error",
        }
    }
}

#[cfg(feature = "metrics")]
mod meters;
