//! What a claim returns, what a reap hands over and decides, and what a read shows.

use crate::model::fingerprint::Fingerprint;
use crate::model::response::Response;
use crate::model::ticket::Ticket;
use std::time::{Duration, SystemTime};

/// The outcome of [`crate::Store::claim`]. Every variant is an expected answer, not an error.
///
/// | variant | HTTP | what the caller does |
/// | --- | --- | --- |
/// | `Acquired` | — | run the side effect, then `complete` (or `release`) the ticket |
/// | `Replay` | stored status | return the stored response unchanged |
/// | `InProgress` | 409 + `Retry-After` | tell the client to retry later |
/// | `Mismatch` | 422 | the key was reused for a different request |
#[derive(Debug)]
#[must_use = "a claim that is ignored leaves the key in progress until its lease runs out"]
pub enum Claim {
    /// The key is now held by this caller, durably: the in-progress record was fsynced before
    /// `claim` returned.
    Acquired(Ticket),
    /// The key was completed with the same fingerprint; here is the stored response, byte for
    /// byte as it was stored.
    Replay(Response),
    /// Another attempt holds the key (or its completion is being made durable).
    InProgress {
        /// How long to wait before retrying: the store's `retry_after` hint, capped by what is
        /// left of the holder's lease.
        retry_after: Duration,
        /// What is left of the holder's lease. Zero in two cases: the lease ran out and the
        /// stale policy is [`crate::StalePolicy::Keep`], or the holder already completed and
        /// the completion is being made durable (a retry after `retry_after` replays it).
        lease_remaining: Duration,
        /// The holder is known gone: its ticket was dropped unspent (it failed ambiguously or
        /// panicked), or its process ended before settling it (the claim was found at open). A
        /// slow holder in another process is not known gone until its lease runs out; under
        /// [`crate::StalePolicy::TakeOver`] its claim is then taken over, under
        /// [`crate::StalePolicy::Keep`] it stays as it is (an orphan stays one) until a reap or
        /// [`crate::Store::resolve`] settles it.
        orphan: bool,
    },
    /// The key is held or completed for a request with another fingerprint. Nothing changed.
    Mismatch {
        /// Whether the existing record is completed (`true`) or in progress.
        completed: bool,
    },
}

impl Claim {
    /// The `InProgress` answer, by the one rule both engines follow. `lease_remaining` is zero
    /// when no live lease bounds the wait (a completion being made durable, or a stale claim
    /// kept for the reaper): the `hint` stands alone then. When the holder is gone (`orphan`:
    /// its ticket was dropped, or its process died) nothing but the lease's end (or a reap)
    /// frees the key, so the honest retry time is the lease's end, not the short hint.
    pub(crate) fn in_progress(hint: Duration, lease_remaining: Duration, orphan: bool) -> Claim {
        let retry_after = if lease_remaining.is_zero() {
            hint
        } else if orphan {
            lease_remaining
        } else {
            hint.min(lease_remaining)
        };
        Claim::InProgress {
            retry_after,
            lease_remaining,
            orphan,
        }
    }
}

/// The abandoned attempt a takeover replaced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Takeover {
    /// The fence of the abandoned claim.
    pub previous_fence: u64,
    /// When the abandoned claim was acquired.
    pub previous_claimed_at: SystemTime,
    /// Whether the abandoned claim was an orphan: its holder was known to be gone (a previous
    /// process left it, or its ticket was dropped unspent), rather than merely slow.
    pub orphan: bool,
}

/// A claim whose lease ran out, or that a previous process left behind, as handed to the
/// resolver of [`crate::Store::reap`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleClaim {
    /// The scope the key belongs to.
    pub scope: crate::Scope,
    /// The idempotency key.
    pub key: String,
    /// The fence of the stale claim.
    pub fence: u64,
    /// The fingerprint it was claimed with.
    pub fingerprint: Fingerprint,
    /// When it was claimed.
    pub claimed_at: SystemTime,
    /// When its lease ran out (or runs out, for an orphan).
    pub lease_deadline: SystemTime,
    /// Its holder is gone whatever its lease says: a previous process left it, or its ticket
    /// was dropped unspent.
    pub orphan: bool,
}

/// What a reap resolver decided for one [`StaleClaim`]. `R` is what a completion stores:
/// [`crate::Store::reap`] and [`crate::Store::resolve`] take a `Resolution<Response>` (the
/// default), and the resolver of the agent gateway's [`crate::agent::Gateway::reap`] decides a
/// `Resolution<ToolResult>` (a [`crate::agent::ToolResult`], stored as the tool's result).
///
/// ```
/// use idemdb::agent::ToolResult;
/// use idemdb::{Resolution, Response};
/// let found: Resolution = Resolution::Complete(Response::new(201, "paid"));
/// let tool_ran: Resolution<ToolResult> = Resolution::Complete(Ok(b"INC-9".to_vec()));
/// assert_ne!(found, Resolution::Keep);
/// assert_ne!(tool_ran, Resolution::Release);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution<R = Response> {
    /// The side effect did not happen (or was undone): delete the claim so a retry executes.
    Release,
    /// The side effect happened: store this, so retries replay it.
    Complete(R),
    /// Undecided: leave the claim in progress, to be offered again on the next reap.
    Keep,
}

/// A record as [`crate::Store::get`] shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The fence of the claim that wrote it.
    pub fence: u64,
    /// The fingerprint it was claimed with.
    pub fingerprint: Fingerprint,
    /// When it was claimed.
    pub claimed_at: SystemTime,
    /// Its state.
    pub state: EntryState,
}

impl Entry {
    /// Where the record stands at `now`: a claim is an orphan if its holder is gone, stale once
    /// its lease ran out, else in progress; a completion is expired once its TTL ran out.
    ///
    /// ```
    /// use idemdb::{Claim, Fingerprint, RecordStatus, Scope, Store};
    /// use std::time::{Duration, SystemTime};
    /// let store = Store::in_memory()?;
    /// let scope = Scope::new("t", "POST /x");
    /// let Claim::Acquired(ticket) = store.claim(&scope, "k", Fingerprint::of(b"x"))? else { panic!() };
    /// let entry = store.get(&scope, "k")?.unwrap();
    /// assert_eq!(entry.status_at(SystemTime::now()), RecordStatus::InProgress);
    /// let later = SystemTime::now() + store.lease_duration() + Duration::from_secs(1);
    /// assert_eq!(entry.status_at(later), RecordStatus::Stale);
    /// # drop(ticket);
    /// # Ok::<(), idemdb::Error>(())
    /// ```
    pub fn status_at(&self, now: SystemTime) -> crate::RecordStatus {
        use crate::RecordStatus;
        match &self.state {
            EntryState::InProgress { orphan: true, .. } => RecordStatus::Orphan,
            EntryState::InProgress { lease_deadline, .. } if *lease_deadline <= now => {
                RecordStatus::Stale
            }
            EntryState::InProgress { .. } => RecordStatus::InProgress,
            EntryState::Completed { expires_at, .. } if *expires_at <= now => RecordStatus::Expired,
            EntryState::Completed { .. } => RecordStatus::Completed,
        }
    }
}

/// The state part of an [`Entry`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryState {
    /// Claimed and not finished.
    InProgress {
        /// When the lease runs out.
        lease_deadline: SystemTime,
        /// Its holder is gone: a previous process left it, or its ticket was dropped.
        orphan: bool,
    },
    /// Finished.
    Completed {
        /// When the record stops being replayed.
        expires_at: SystemTime,
        /// The stored response.
        response: Response,
    },
}
