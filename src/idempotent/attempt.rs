//! What a running closure sees of its claim.

use crate::error::{Error, Result};
use crate::model::claim::Takeover;
use crate::model::ticket::Ticket;
use crate::store::Store;
use crate::sync::{Arc, Weak};
use std::time::Duration;

#[cfg(doc)]
use super::{CallOutcome, Failure, IdempotentFn};

/// What the closure of an [`IdempotentFn`] (or a tool run by [`crate::agent::Gateway::call`])
/// sees of its claim: the fence to pass downstream, whether it took over an abandoned attempt,
/// and a way to renew its lease.
///
/// ```
/// use idemdb::{Failure, IdempotentFn, Scope, Store};
/// use std::time::Duration;
/// let f = IdempotentFn::new(Store::in_memory()?, Scope::new("acme", "export"));
/// f.call("k", b"", |attempt| {
///     assert!(attempt.takeover().is_none()); // nothing abandoned to reconcile
///     // A slow job keeps its claim; if it cannot, it stops before acting.
///     let renewed = attempt.extend_lease(Duration::from_secs(300));
///     renewed.map_err(|e| Failure::Transient(e.to_string().into_bytes()))?;
///     Ok(attempt.fence().to_string().into_bytes())
/// })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Attempt {
    store: Store,
    /// The claim's ticket, owned by the call: once the closure returned, the call settles it,
    /// and renewals through this handle fail with `LeaseLost`.
    ticket: Weak<Ticket>,
    fence: u64,
    takeover: Option<Takeover>,
}

impl Attempt {
    pub(crate) fn new(store: &Store, ticket: Ticket) -> (Attempt, Arc<Ticket>) {
        let held = Arc::new(ticket);
        let attempt = Attempt {
            store: store.clone(),
            ticket: Arc::downgrade(&held),
            fence: held.fence(),
            takeover: held.takeover().cloned(),
        };
        (attempt, held)
    }

    /// The claim's fencing token: larger than that of every earlier attempt with this key.
    /// Pass it downstream if the downstream can refuse stale writers (a conditional update that
    /// compares it), so an abandoned attempt's late write is refused there too.
    ///
    /// ```
    /// # use idemdb::{IdempotentFn, Scope, Store, Failure};
    /// # let f = IdempotentFn::new(Store::in_memory()?, Scope::new("acme", "f"));
    /// f.call("k", b"", |attempt| { assert!(attempt.fence() > 0); Ok(vec![]) })?;
    /// # Ok::<(), idemdb::Error>(())
    /// ```
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// `Some` when this attempt took over an earlier one that was abandoned (its process died,
    /// its future was dropped, it failed with [`Failure::Ambiguous`]) and whose lease ran out:
    /// the side effect may already have happened, so look it up downstream (by the key) before
    /// performing it again.
    ///
    /// ```
    /// # use idemdb::{IdempotentFn, Scope, Store, Failure};
    /// # let f = IdempotentFn::new(Store::in_memory()?, Scope::new("acme", "f"));
    /// f.call("k", b"", |attempt| {
    ///     if let Some(abandoned) = attempt.takeover() {
    ///         // e.g. ask the payment provider for a charge tagged with this key
    ///         let _ = abandoned.previous_fence;
    ///     }
    ///     Ok(vec![])
    /// })?;
    /// # Ok::<(), idemdb::Error>(())
    /// ```
    pub fn takeover(&self) -> Option<&Takeover> {
        self.takeover.as_ref()
    }

    /// Renews the claim's lease to run until `by` from now, durably, so that a slow closure is
    /// not taken over by a duplicate. Call it periodically from a closure that may outlast the
    /// store's lease ([`Store::lease_duration`]).
    ///
    /// ```
    /// # use idemdb::{IdempotentFn, Scope, Store, Failure};
    /// # use std::time::Duration;
    /// # let f = IdempotentFn::new(Store::in_memory()?, Scope::new("acme", "f"));
    /// f.call("k", b"", |attempt| {
    ///     attempt.extend_lease(Duration::from_secs(120)).map_err(|e| Failure::Transient(e.to_string().into_bytes()))?;
    ///     Ok(vec![])
    /// })?;
    /// # Ok::<(), idemdb::Error>(())
    /// ```
    ///
    /// # Concurrency
    /// While the lease is renewed, duplicates of the call keep waiting or getting
    /// [`CallOutcome::InProgress`]; none takes the key over. Renewals may come from any thread
    /// the closure hands the attempt to.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the claim was taken over or reaped (stop: another attempt owns
    /// the side effect now), or if the closure already returned; the store's write errors.
    pub fn extend_lease(&self, by: Duration) -> Result<()> {
        self.store.extend(&*self.held()?, by)
    }

    /// [`Attempt::extend_lease`] without blocking the thread.
    ///
    /// ```
    /// # use idemdb::{IdempotentFn, Scope, Store, Failure};
    /// # use std::time::Duration;
    /// # tokio::runtime::Builder::new_current_thread().build()?.block_on(async {
    /// let f = IdempotentFn::new(Store::in_memory()?, Scope::new("acme", "f"));
    /// f.call_async("k", b"", |attempt| async move {
    ///     attempt.extend_lease_async(Duration::from_secs(120)).await.map_err(|e| Failure::Transient(e.to_string().into_bytes()))?;
    ///     Ok(vec![])
    /// }).await?;
    /// # Ok::<(), idemdb::Error>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`Attempt::extend_lease`].
    pub async fn extend_lease_async(&self, by: Duration) -> Result<()> {
        let held = self.held()?;
        self.store.extend_async(&held, by).await
    }

    fn held(&self) -> Result<Arc<Ticket>> {
        self.ticket
            .upgrade()
            .ok_or(Error::LeaseLost { fence: self.fence })
    }
}
