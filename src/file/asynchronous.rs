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

use crate::error::Result;
use crate::file::store::{Attempt, FileStore};
use crate::model::claim::Claim;
use crate::model::fingerprint::Fingerprint;
use crate::model::response::Response;
use crate::model::scope::Scope;
use crate::model::ticket::Ticket;
use std::time::Duration;

impl FileStore {
    pub(crate) async fn claim_async(
        &self,
        scope: &Scope,
        key: &str,
        fingerprint: Fingerprint,
    ) -> Result<Claim> {
        let key = self.index_key(scope, key)?;
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
                    return Ok(Claim::Acquired(unreceived.receive()));
                }
            }
        }
    }

    pub(crate) async fn complete_async(&self, ticket: Ticket, response: Response) -> Result<()> {
        let (seq, hash, fence) = self.complete_start(ticket, response)?;
        self.inner.pipeline.durable(seq).await?;
        self.mark_durable(&hash, fence);
        Ok(())
    }

    pub(crate) async fn release_async(&self, mut ticket: Ticket) -> Result<()> {
        let seq = self.release_start(&mut ticket)?;
        self.inner.pipeline.durable(seq).await
    }

    pub(crate) async fn extend_async(&self, ticket: &Ticket, by: Duration) -> Result<()> {
        let (seq, lease_until) = self.extend_start(ticket, by)?;
        self.inner.pipeline.durable(seq).await?;
        ticket.renewed(lease_until);
        Ok(())
    }
}

/// An acquired claim on its way to the caller: withdrawn if the future carrying it is dropped
/// (or fails) before the caller receives the ticket.
struct Unreceived<'s> {
    store: &'s FileStore,
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
