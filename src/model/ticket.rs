//! The ticket that proves a claim is held, and what it knows of the engine that issued it.

use crate::model::claim::Takeover;
use crate::model::fingerprint::Fingerprint;
use crate::sync::{AtomicU64, Ordering, Weak};
use std::time::SystemTime;

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
    /// The engine that issued it, held weakly (a ticket outliving its store does nothing);
    /// `None` once the ticket was spent (completed or released), so that its drop does
    /// nothing.
    issuer: Option<Weak<dyn Issuer>>,
    /// The scoped key (`crate::model::scope::scoped_key`).
    key: Box<[u8]>,
    fence: u64,
    fingerprint: Fingerprint,
    /// Milliseconds since the epoch, by the issuing engine's clock.
    claimed_at: u64,
    lease_until: AtomicU64,
    takeover: Option<Takeover>,
}

/// The engine side of a ticket: an engine hands each ticket a weak reference to itself, so
/// that a ticket dropped unspent can say so. Both engines implement it; nothing else about an
/// engine crosses into a ticket.
pub(crate) trait Issuer: Send + Sync {
    /// A ticket of this engine was dropped unspent, still naming claim `fence` of `key`: the
    /// claim is an orphan now (nobody will finish it), if it is still held.
    fn holder_gone(&self, key: &[u8], fence: u64);
}

/// What an engine fills in when it issues a ticket.
pub(crate) struct Issued {
    pub(crate) key: Box<[u8]>,
    pub(crate) fence: u64,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) claimed_at: u64,
    pub(crate) lease_until: u64,
    pub(crate) takeover: Option<Takeover>,
}

impl Ticket {
    /// A ticket for a claim `issuer` just acquired.
    pub(crate) fn issue(issuer: Weak<dyn Issuer>, claim: Issued) -> Ticket {
        Ticket {
            issuer: Some(issuer),
            key: claim.key,
            fence: claim.fence,
            fingerprint: claim.fingerprint,
            claimed_at: claim.claimed_at,
            lease_until: AtomicU64::new(claim.lease_until),
            takeover: claim.takeover,
        }
    }

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

    /// The scoped key the claim holds.
    pub(crate) fn key(&self) -> &[u8] {
        &self.key
    }

    /// When the claim was acquired, in milliseconds since the epoch.
    pub(crate) fn claimed_at(&self) -> u64 {
        self.claimed_at
    }

    /// Records a renewed lease.
    pub(crate) fn renewed(&self, lease_until: u64) {
        self.lease_until.store(lease_until, Ordering::Relaxed);
    }

    /// Whether `issuer` (an engine's address) issued this ticket, and it is unspent.
    pub(crate) fn issued_by(&self, issuer: *const ()) -> bool {
        self.issuer
            .as_ref()
            .is_some_and(|own| std::ptr::addr_eq(own.as_ptr(), issuer))
    }

    /// Marks the ticket spent: its claim was completed or released through it.
    pub(crate) fn spend(&mut self) {
        self.issuer = None;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(issuer) = self.issuer.take().and_then(|weak| weak.upgrade()) {
            issuer.holder_gone(&self.key, self.fence);
        }
    }
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("key", &crate::model::scope::display_scoped_key(&self.key))
            .field("fence", &self.fence)
            .field("fingerprint", &self.fingerprint)
            .field("claimed_at", &self.claimed_at)
            .field("lease_until", &self.lease_until)
            .field("takeover", &self.takeover)
            .finish_non_exhaustive()
    }
}
