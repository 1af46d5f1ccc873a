//! The async face of the store: the same operations, awaiting durability without blocking the
//! executor thread on an fsync.
//!
//! Each operation does its in-memory part inline (a stripe lock held for microseconds, as in
//! the blocking API), queues its write, and awaits a future that the commit pipeline completes
//! once the write's batch is fsynced. Commits for async callers are led by one `idemdb-flush`
//! thread, started on first use; blocking and async callers share batches. Any executor works:
//! the futures only use the `Waker` they are polled with.
//!
//! A replay reads the stored body from the file inline (a page-cache read, typically a few
//! microseconds).

use crate::claim::{Claim, Ticket};
use crate::error::Result;
use crate::fingerprint::Fingerprint;
use crate::response::Response;
use crate::scope::Scope;
use crate::stats::Counters;
use crate::store::{Attempt, Store};
use crate::sync::Ordering;
use std::time::Duration;

impl Store {
    /// [`Store::claim`], awaiting the claim's fsync instead of blocking on it.
    ///
    /// # Cancellation
    /// Dropping the future after the claim was queued does not undo it: the claim lands and,
    /// its ticket lost, stays in progress until its lease runs out, like a dropped ticket.
    ///
    /// # Errors
    /// As [`Store::claim`].
    pub async fn claim_async(
        &self,
        scope: &Scope,
        key: &str,
        fingerprint: Fingerprint,
    ) -> Result<Claim> {
        let key = self.claim_key(scope, key)?;
        loop {
            match self.claim_start(&key, fingerprint)? {
                Attempt::Answer(claim) => return Ok(claim),
                Attempt::Again => continue,
                Attempt::Queued(seq, ticket) => {
                    self.inner.pipeline.durable(seq).await?;
                    return Ok(self.claim_finish(ticket));
                }
            }
        }
    }

    /// [`Store::complete`], awaiting the completion's fsync instead of blocking on it.
    ///
    /// # Cancellation
    /// Dropping the future after the completion was queued does not undo it: it lands.
    ///
    /// # Errors
    /// As [`Store::complete`].
    pub async fn complete_async(&self, ticket: Ticket, response: Response) -> Result<()> {
        let (seq, ticket) = self.complete_start(ticket, response)?;
        self.inner.pipeline.durable(seq).await?;
        self.complete_finish(&ticket);
        Ok(())
    }

    /// [`Store::release`], awaiting the fsync instead of blocking on it.
    ///
    /// # Errors
    /// As [`Store::release`].
    pub async fn release_async(&self, ticket: Ticket) -> Result<()> {
        let seq = self.release_start(&ticket)?;
        self.inner.pipeline.durable(seq).await?;
        Counters::bump(&self.inner.counters.releases, 1);
        Ok(())
    }

    /// [`Store::extend`], awaiting the fsync instead of blocking on it.
    ///
    /// # Errors
    /// As [`Store::extend`].
    pub async fn extend_async(&self, ticket: &Ticket, by: Duration) -> Result<()> {
        let (seq, lease_until) = self.extend_start(ticket, by)?;
        self.inner.pipeline.durable(seq).await?;
        ticket.lease_until.store(lease_until, Ordering::Relaxed);
        Ok(())
    }
}
