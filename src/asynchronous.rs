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
    /// A claim nobody received cannot have started a side effect, so it never holds the key:
    /// if the future is dropped before it returns (a client hung up, a timeout fired, a
    /// `select!` took another branch), a claim it acquired is released at once (the release is
    /// committed in the background), and the next claim of the key is `Acquired`. A dropped
    /// takeover is not released, since the attempt it replaced may have acted: its lease ends
    /// at once, so the next claim takes the key over again, with the takeover flag.
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
                    let unreceived = Unreceived {
                        store: self,
                        ticket: Some(ticket),
                    };
                    self.inner.pipeline.durable(seq).await?;
                    return Ok(self.claim_finish(unreceived.receive()));
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
    pub async fn release_async(&self, mut ticket: Ticket) -> Result<()> {
        let seq = self.release_start(&mut ticket)?;
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

/// An acquired claim on its way to the caller: withdrawn if the future carrying it is dropped
/// (or fails) before the caller receives the ticket.
struct Unreceived<'s> {
    store: &'s Store,
    ticket: Option<Ticket>,
}

impl Unreceived<'_> {
    fn receive(mut self) -> Ticket {
        self.ticket.take().expect("received once")
    }
}

impl Drop for Unreceived<'_> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            self.store.withdraw(ticket);
        }
    }
}
