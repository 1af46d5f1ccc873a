//! What a claim returns, and the ticket that proves a claim is held.

use crate::file::index::IndexKey;
use crate::fingerprint::Fingerprint;
use crate::response::Response;
use crate::sync::{AtomicU64, Ordering, Weak};
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
    },
    /// The key is held or completed for a request with another fingerprint. Nothing changed.
    Mismatch {
        /// Whether the existing record is completed (`true`) or in progress.
        completed: bool,
    },
}

/// Proof that the caller holds a claim: pass it to [`crate::Store::complete`] or
/// [`crate::Store::release`].
///
/// A ticket carries a fencing token ([`Ticket::fence`]) that no other ticket of this store ever
/// carries, not even across restarts. Once the claim is released, completed, reaped or taken
/// over, operations with this ticket fail with [`crate::Error::LeaseLost`]. A ticket is only
/// valid in the `Store` (and process) that issued it: after a reopen, the claim it held is an
/// orphan that [`crate::Store::reap`] resolves.
///
/// Dropping a ticket (a panic in the handler, a cancelled task) leaves the claim in progress
/// until its lease runs out, exactly as if the process had crashed: a drop cannot tell whether
/// the side effect happened. The claim becomes an orphan at once: [`crate::Store::reap`] offers
/// it to the resolver straight away, and duplicates are told to retry when the lease ends
/// rather than after the usual short hint, since nobody is left to finish it.
#[must_use = "dropping a ticket leaves the key in progress until its lease runs out"]
pub struct Ticket {
    /// The engine that issued it; [`Holder::Spent`] once the ticket was spent (completed or
    /// released), so that its drop does nothing.
    pub(crate) holder: Holder,
    pub(crate) key: IndexKey,
    pub(crate) fence: u64,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) claimed_at: u64,
    pub(crate) lease_until: AtomicU64,
    pub(crate) takeover: Option<Takeover>,
}

impl Ticket {
    /// The fencing token: unique in this store (on PostgreSQL: among all replicas of it), and
    /// larger than the token of every earlier claim of the same key. Pass it downstream (for
    /// example as a column a conditional update compares) so a stale holder's late writes can
    /// be refused there too.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// `Some` when this claim took over an abandoned attempt whose lease ran out: the side effect
    /// may already have happened, so reconcile with the downstream system before repeating it.
    pub fn takeover(&self) -> Option<&Takeover> {
        self.takeover.as_ref()
    }

    /// The fingerprint the key was claimed with.
    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    /// When the lease runs out unless [`crate::Store::extend`] renews it.
    pub fn lease_deadline(&self) -> SystemTime {
        crate::clock::from_millis(self.lease_until.load(Ordering::Relaxed))
    }

    /// Marks the ticket spent: its claim was completed or released through it.
    pub(crate) fn spend(&mut self) {
        self.holder = Holder::Spent;
    }
}

/// Which engine issued a ticket, held weakly: a ticket outliving its store does nothing.
pub(crate) enum Holder {
    /// Completed or released through this ticket.
    Spent,
    File(Weak<crate::file::store::Inner>),
    #[cfg(feature = "postgres")]
    Postgres(Weak<crate::postgres::Shared>),
}

impl Drop for Ticket {
    fn drop(&mut self) {
        match std::mem::replace(&mut self.holder, Holder::Spent) {
            Holder::Spent => {}
            Holder::File(store) => {
                if let Some(inner) = store.upgrade() {
                    crate::file::FileStore { inner }.holder_gone(&self.key, self.fence);
                }
            }
            #[cfg(feature = "postgres")]
            Holder::Postgres(shared) => {
                if let Some(shared) = shared.upgrade() {
                    shared.holder_gone(&self.key.bytes, self.fence);
                }
            }
        }
    }
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("key", &self.key)
            .field("fence", &self.fence)
            .field("fingerprint", &self.fingerprint)
            .field("claimed_at", &self.claimed_at)
            .field("lease_until", &self.lease_until)
            .field("takeover", &self.takeover)
            .finish_non_exhaustive()
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

/// What a reap resolver decided for one [`StaleClaim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// The side effect did not happen (or was undone): delete the claim so a retry executes.
    Release,
    /// The side effect happened: store this response, so retries replay it.
    Complete(Response),
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
