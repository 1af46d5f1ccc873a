//! Reading what a store holds, record by record: [`crate::Store::scan`] and
//! [`crate::Store::list`], for an operator's inspection (the `idemdb` command) and for a
//! service that offers the same inspection live, since a file store cannot be opened twice.

use crate::model::claim::Entry;
use crate::model::moved::Moved;
use crate::model::scope::Scope;
use std::time::SystemTime;

/// Where a record stands, as an operator sorts records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum RecordStatus {
    /// Claimed, its lease running, its holder alive as far as the store knows.
    InProgress,
    /// Claimed, and its lease ran out: its holder may be slow or gone. A claim takes it over
    /// (under [`crate::StalePolicy::TakeOver`]); [`crate::Store::reap`] offers it.
    Stale,
    /// Claimed, and its holder is known to be gone (a previous process left it, or its ticket
    /// was dropped unspent), whatever its lease says. [`crate::Store::reap`] offers it at once.
    Orphan,
    /// Completed, replayed to every retry until it expires.
    Completed,
    /// Completed, and its TTL ran out: invisible to claims, its space freed by the next
    /// [`crate::Store::purge_expired`].
    Expired,
}

impl RecordStatus {
    /// Every status, in the order above.
    pub const ALL: [RecordStatus; 5] = [
        RecordStatus::InProgress,
        RecordStatus::Stale,
        RecordStatus::Orphan,
        RecordStatus::Completed,
        RecordStatus::Expired,
    ];

    /// The status's name: `in-progress`, `stale`, `orphan`, `completed` or `expired`.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordStatus::InProgress => "in-progress",
            RecordStatus::Stale => "stale",
            RecordStatus::Orphan => "orphan",
            RecordStatus::Completed => "completed",
            RecordStatus::Expired => "expired",
        }
    }

    /// Whether the record is a claim not yet finished (in progress, stale or orphan).
    pub fn is_claim(self) -> bool {
        matches!(
            self,
            RecordStatus::InProgress | RecordStatus::Stale | RecordStatus::Orphan
        )
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

impl std::fmt::Display for RecordStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for RecordStatus {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RecordStatus::ALL
            .into_iter()
            .find(|status| status.as_str() == s)
            .ok_or_else(|| {
                format!("unknown status {s:?}: expected in-progress, stale, orphan, completed or expired")
            })
    }
}

/// Which records [`crate::Store::scan`] hands over. Every record by default; each method
/// narrows it.
///
/// ```
/// use idemdb::{Query, RecordStatus};
/// use std::time::{Duration, SystemTime};
/// let stuck = Query::all()
///     .tenant("tenant_42")
///     .status(RecordStatus::Stale)
///     .status(RecordStatus::Orphan)
///     .claimed_before(SystemTime::now() - Duration::from_secs(3600))
///     .limit(100);
/// # let _ = stuck;
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[must_use]
pub struct Query {
    tenant: Option<String>,
    endpoint: Option<String>,
    /// Bits of [`RecordStatus::bit`]; 0 for every status.
    statuses: u8,
    claimed_before: Option<SystemTime>,
    limit: Option<usize>,
}

impl Query {
    /// Every record, expired ones not yet purged included.
    pub fn all() -> Query {
        Query::default()
    }

    /// Only records of this tenant.
    pub fn tenant(mut self, tenant: impl Into<String>) -> Query {
        self.tenant = Some(tenant.into());
        self
    }

    /// Only records of this endpoint.
    pub fn endpoint(mut self, endpoint: impl Into<String>) -> Query {
        self.endpoint = Some(endpoint.into());
        self
    }

    /// Only records with this status; called again, with this one or the earlier ones.
    pub fn status(mut self, status: RecordStatus) -> Query {
        self.statuses |= status.bit();
        self
    }

    /// Only records claimed before `time`.
    pub fn claimed_before(mut self, time: SystemTime) -> Query {
        self.claimed_before = Some(time);
        self
    }

    /// At most `n` records.
    pub fn limit(mut self, n: usize) -> Query {
        self.limit = Some(n);
        self
    }

    /// The most records the query hands over.
    pub fn max_records(&self) -> usize {
        self.limit.unwrap_or(usize::MAX)
    }

    /// The tenant asked for, if one is.
    #[cfg(feature = "postgres")]
    pub(crate) fn tenant_filter(&self) -> Option<&str> {
        self.tenant.as_deref()
    }

    /// The endpoint asked for, if one is.
    #[cfg(feature = "postgres")]
    pub(crate) fn endpoint_filter(&self) -> Option<&str> {
        self.endpoint.as_deref()
    }

    /// The claim time records must be before, if one is given.
    #[cfg(feature = "postgres")]
    pub(crate) fn claimed_before_filter(&self) -> Option<SystemTime> {
        self.claimed_before
    }

    /// The statuses asked for as bits of `1 << status` (in declaration order); 0 for all.
    #[cfg(feature = "postgres")]
    pub(crate) fn status_bits(&self) -> u8 {
        self.statuses
    }

    /// Whether a record with `status` can match, before its key is read.
    pub(crate) fn wants_status(&self, status: RecordStatus) -> bool {
        self.statuses == 0 || self.statuses & status.bit() != 0
    }

    fn matches(&self, record: &ListedRecord) -> bool {
        self.wants_status(record.status)
            && self
                .tenant
                .as_deref()
                .is_none_or(|t| record.scope.tenant() == t)
            && self
                .endpoint
                .as_deref()
                .is_none_or(|e| record.scope.endpoint() == e)
            && self
                .claimed_before
                .is_none_or(|t| record.entry.claimed_at < t)
    }
}

/// One record as [`crate::Store::scan`] hands it over: its key, where it stands, and all of
/// it (the stored response of a completed one).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListedRecord {
    /// The scope the key belongs to.
    pub scope: Scope,
    /// The idempotency key.
    pub key: String,
    /// Where it stands, at the store's clock when it was read.
    pub status: RecordStatus,
    /// The record: fence, fingerprint, times, and the response once completed.
    pub entry: Entry,
}

/// Applies `query` to the records an engine reads, handing the matches to `each` until the
/// limit or `each` says stop. Returns the scan's callback for the engine: `Break` once done.
pub(crate) fn filtered<'q>(
    query: &'q Query,
    mut each: impl FnMut(ListedRecord) -> std::ops::ControlFlow<()> + 'q,
    handed: &'q mut u64,
) -> impl FnMut(Moved, bool, u64) -> std::ops::ControlFlow<()> + 'q {
    use std::ops::ControlFlow;
    move |moved, orphan, now| {
        if usize::try_from(*handed).unwrap_or(usize::MAX) >= query.max_records() {
            return ControlFlow::Break(());
        }
        let record = moved.listed(orphan, now);
        if !query.matches(&record) {
            return ControlFlow::Continue(());
        }
        *handed += 1;
        each(record)?;
        if usize::try_from(*handed).unwrap_or(usize::MAX) >= query.max_records() {
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    }
}
