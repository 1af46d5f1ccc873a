//! The once protocol: one call of a body for a key, shared by
//! [`IdempotentFn`](super::IdempotentFn) and the agent gateway. What it promises:
//!
//! - **A durable claim before the body runs.** The body runs only on an acquired claim. A key
//!   completed with this fingerprint answers [`Ran::Replayed`], a key used with another
//!   fingerprint [`Ran::Mismatch`]; neither runs the body.
//! - **A bounded wait for an in-flight duplicate.** While another call holds the key, the call
//!   waits ([`Store::wait`]: woken when the holder settles or its lease ends, not by polling)
//!   and claims again, until `wait` has passed since the call began; then it answers
//!   [`Ran::InProgress`]. A zero `wait` answers at once. Under [`StalePolicy::Keep`] a key
//!   held by an orphan (its holder known gone) answers [`Ran::Orphaned`] at once: no holder
//!   will settle it, and the store will not take it over.
//! - **Settling by the body's [`Step`].** `Store` completes the claim, durably, before
//!   [`Ran::Executed`] is returned; `Release` releases the key, so the next call runs the body
//!   ([`Ran::Released`]); `Leave` drops the ticket unspent, so the claim stays in progress as
//!   an orphan until its lease runs out or it is reaped, and the next call runs with a takeover
//!   to reconcile ([`Ran::Unresolved`]). A completion or release that fails is the call's
//!   `Err`. The ticket is settled only once no [`Attempt`] renewal is in flight; renewals after
//!   that fail with `LeaseLost`.
//! - **A panic out of the body releases the key, then resumes** in the caller (the release is
//!   best effort: a lost lease means another attempt holds the key). That is what
//!   `IdempotentFn` promises. A caller for whom a panic means the side effect may have happened
//!   catches it inside the body and returns `Step::Leave`, as the agent gateway does.
//! - **A dropped [`Once::run_async`]** while the body runs drops the ticket unspent: an orphan,
//!   as after a crash.

use super::Attempt;
use crate::error::Result;
use crate::model::claim::{Claim, Takeover};
use crate::model::fingerprint::Fingerprint;
use crate::model::response::Response;
use crate::model::scope::Scope;
use crate::model::ticket::Ticket;
use crate::store::Store;
use crate::sync::Arc;
use crate::timer::far_future;
use crate::StalePolicy;
use futures_util::FutureExt as _;
use std::future::Future;
use std::panic::{self, AssertUnwindSafe};
use std::time::{Duration, Instant};

/// What the closure's outcome does to the claim. `Y` is handed back on success, `X` with a
/// failure that stores nothing.
pub(crate) enum Step<Y, X> {
    /// Complete the claim with this response.
    Store(Response, Y),
    /// Release the key: nothing happened.
    Release(X),
    /// Leave the claim in progress (an orphan): something may have happened.
    Leave(X),
}

/// What one call did.
pub(crate) enum Ran<Y, X> {
    Executed {
        value: Y,
        takeover: Option<Takeover>,
    },
    Replayed(Response),
    InProgress {
        retry_after: Duration,
    },
    Mismatch {
        completed: bool,
    },
    Released(X),
    Unresolved(X),
    /// Under [`crate::StalePolicy::Keep`], the key is held by an attempt known gone (an
    /// orphan): nothing but a reap or an operator will settle it, so waiting is pointless.
    Orphaned,
}

/// One call: claim (waiting for an in-flight duplicate up to `wait`), run, settle.
pub(crate) struct Once<'a> {
    pub(crate) store: &'a Store,
    pub(crate) scope: &'a Scope,
    pub(crate) key: &'a str,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) wait: Duration,
}

/// What to do after a claim.
enum Next<Y, X> {
    Run(Ticket),
    Done(Ran<Y, X>),
    Wait(Duration),
}

impl Once<'_> {
    fn deadline(&self) -> Instant {
        Instant::now()
            .checked_add(self.wait)
            .unwrap_or_else(far_future)
    }

    fn next<Y, X>(&self, claim: Claim, deadline: Instant) -> Next<Y, X> {
        match claim {
            Claim::Acquired(ticket) => Next::Run(ticket),
            Claim::Replay(stored) => Next::Done(Ran::Replayed(stored)),
            Claim::Mismatch { completed } => Next::Done(Ran::Mismatch { completed }),
            Claim::InProgress { orphan: true, .. }
                if self.store.stale_policy() == StalePolicy::Keep =>
            {
                Next::Done(Ran::Orphaned)
            }
            Claim::InProgress { retry_after, .. } => {
                let now = Instant::now();
                if now >= deadline {
                    Next::Done(Ran::InProgress { retry_after })
                } else {
                    // Woken when the holder finishes, or its lease ends.
                    Next::Wait(deadline - now)
                }
            }
        }
    }

    /// Runs `body` once for the key, blocking.
    pub(crate) fn run<Y, X>(&self, body: impl FnOnce(&Attempt) -> Step<Y, X>) -> Result<Ran<Y, X>> {
        let deadline = self.deadline();
        let ticket = loop {
            match self.next(
                self.store.claim(self.scope, self.key, self.fingerprint)?,
                deadline,
            ) {
                Next::Run(ticket) => break ticket,
                Next::Done(ran) => return Ok(ran),
                Next::Wait(left) => {
                    self.store.wait(self.scope, self.key, left)?;
                }
            }
        };
        let (attempt, held) = Attempt::new(self.store, ticket);
        let step = panic::catch_unwind(AssertUnwindSafe(|| body(&attempt)));
        drop(attempt);
        let ticket = Arc::into_inner(held)
            .expect("the closure only borrowed the attempt, so no renewal outlives it");
        match step {
            Ok(Step::Store(response, value)) => {
                let takeover = ticket.takeover().cloned();
                self.store.complete(ticket, response)?;
                Ok(Ran::Executed { value, takeover })
            }
            Ok(Step::Release(x)) => {
                self.store.release(ticket)?;
                Ok(Ran::Released(x))
            }
            Ok(Step::Leave(x)) => Ok(Ran::Unresolved(unresolved(ticket, x))),
            Err(panic) => {
                // A lost lease means another attempt holds the key now: nothing to release.
                let _ = self.store.release(ticket);
                panic::resume_unwind(panic)
            }
        }
    }

    /// Runs `body` once for the key, awaiting the store.
    pub(crate) async fn run_async<Y, X, Fut>(
        &self,
        body: impl FnOnce(Attempt) -> Fut,
    ) -> Result<Ran<Y, X>>
    where
        Fut: Future<Output = Step<Y, X>>,
    {
        let deadline = self.deadline();
        let ticket = loop {
            match self.next(
                self.store
                    .claim_async(self.scope, self.key, self.fingerprint)
                    .await?,
                deadline,
            ) {
                Next::Run(ticket) => break ticket,
                Next::Done(ran) => return Ok(ran),
                Next::Wait(left) => {
                    self.store.wait_async(self.scope, self.key, left).await?;
                }
            }
        };
        // From here until the step is settled, dropping this future drops `held`, and with it
        // the ticket unspent: the claim becomes an orphan, as after a crash.
        let (attempt, held) = Attempt::new(self.store, ticket);
        let step = AssertUnwindSafe(async move { body(attempt).await })
            .catch_unwind()
            .await;
        let mut held = held;
        let ticket = loop {
            match Arc::try_unwrap(held) {
                Ok(ticket) => break ticket,
                // An attempt moved out of the closure is renewing the lease: let it finish.
                Err(shared) => {
                    held = shared;
                    crate::timer::sleep(Duration::from_millis(1)).await;
                }
            }
        };
        match step {
            Ok(Step::Store(response, value)) => {
                let takeover = ticket.takeover().cloned();
                self.store.complete_async(ticket, response).await?;
                Ok(Ran::Executed { value, takeover })
            }
            Ok(Step::Release(x)) => {
                self.store.release_async(ticket).await?;
                Ok(Ran::Released(x))
            }
            Ok(Step::Leave(x)) => Ok(Ran::Unresolved(unresolved(ticket, x))),
            Err(panic) => {
                let _ = self.store.release_async(ticket).await;
                panic::resume_unwind(panic)
            }
        }
    }
}

/// Neither stored nor released: the ticket is dropped unspent, so the claim stays in progress
/// as an orphan, and once its lease runs out the next call runs with a takeover, to reconcile.
fn unresolved<X>(ticket: Ticket, x: X) -> X {
    drop(ticket);
    x
}
