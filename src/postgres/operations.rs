//! Claim, complete, release, extend, get and wait: each operation's job for the engine's
//! thread, and what its answer means for the caller. What each promises is documented once,
//! on the public [`crate::Store`].

use super::bridge::{answer, block, blocking};
use super::clock::CACHE_MARGIN_MS;
use super::pool::query_one;
use super::rows::{
    db_error, encode_headers, fence_column, fence_of, fingerprint_of, millis_column, record_row,
    response_of, time_of, ClaimRow, Held, Target,
};
use super::scheduler::Job;
use super::wakes::{FIRST_LOOK, LISTENING_POLL, WANT_MARGIN, WANT_SPAN};
use super::{stopped, Caller, PgStore, Shared};
use crate::config::StalePolicy;
use crate::error::{Error, Result};
use crate::model::claim::{Claim, Entry, EntryState, Takeover};
use crate::model::fingerprint::Fingerprint;
use crate::model::response::Response;
use crate::model::scope::{scoped_key, Scope};
use crate::model::ticket::{Issued, Issuer, Ticket};
use crate::replay_cache::Cached;
use crate::sync::{Arc, Ordering, Weak};
use futures_channel::oneshot;
use std::future::Future;
use std::time::{Duration, Instant};

/// A claim's reply on its way to an async caller: if the caller's future is dropped first,
/// a claim that was acquired is withdrawn (the engine withdraws it itself when the reply
/// finds nobody; this guard covers a reply that arrived but was never read).
struct Unreceived<'s> {
    store: &'s PgStore,
    scoped: &'s [u8],
    rx: Option<oneshot::Receiver<Result<ClaimRow>>>,
}

impl Drop for Unreceived<'_> {
    fn drop(&mut self) {
        if let Some(mut rx) = self.rx.take() {
            rx.close();
            match rx.try_recv() {
                Ok(Some(Ok(ClaimRow::Won {
                    fence, replaced, ..
                }))) => self.store.withdraw(self.scoped, fence, replaced.is_some()),
                // Answered without a claim, or failed: nothing to undo.
                Ok(Some(_)) => {}
                // Still in flight (a closed, empty channel reads as `Canceled`): the engine
                // withdraws it when its reply finds nobody; the barrier makes that land before
                // this caller's next operation.
                Ok(None) | Err(oneshot::Canceled) => {
                    let _ = self.store.shared.submit(Job::Barrier);
                }
            }
        }
    }
}

impl PgStore {
    fn claim_job(
        &self,
        key: &[u8],
        fingerprint: Fingerprint,
        caller: Caller,
    ) -> Result<oneshot::Receiver<Result<ClaimRow>>> {
        let (reply, rx) = oneshot::channel();
        self.shared.send(
            Job::Claim {
                target: Target::of(key),
                fingerprint: *fingerprint.as_bytes(),
                reply,
            },
            caller,
        )?;
        Ok(rx)
    }

    /// A claim answered from the cache of completed responses: a completion is final until
    /// it expires, so while its expiry is well ahead of the database's time its replay (or,
    /// for another fingerprint, its mismatch) needs no statement.
    pub(super) fn cached(&self, scoped: &[u8], fingerprint: Fingerprint) -> Option<Claim> {
        let hit = self.shared.replays.get_bytes(scoped)?;
        let now = self.shared.database_time()?;
        let expires_at = i64::try_from(hit.expires_at).unwrap_or(i64::MAX);
        if expires_at.saturating_sub(now) <= CACHE_MARGIN_MS {
            return None;
        }
        Some(if hit.fingerprint == fingerprint {
            Claim::Replay(hit.response.clone())
        } else {
            Claim::Mismatch { completed: true }
        })
    }

    pub(crate) fn claim(
        &self,
        scope: &Scope,
        key: &str,
        fingerprint: Fingerprint,
    ) -> Result<Claim> {
        let scoped = scoped_key(scope, key)?;
        if let Some(answer) = self.cached(&scoped, fingerprint) {
            return Ok(answer);
        }
        let row = block(self.claim_job(&scoped, fingerprint, Caller::Blocking)?)?;
        self.decide(scoped, fingerprint, row)
    }

    pub(crate) async fn claim_async(
        &self,
        scope: &Scope,
        key: &str,
        fingerprint: Fingerprint,
    ) -> Result<Claim> {
        let scoped = scoped_key(scope, key)?;
        if let Some(answer) = self.cached(&scoped, fingerprint) {
            return Ok(answer);
        }
        let mut unreceived = Unreceived {
            store: self,
            scoped: &scoped,
            rx: Some(self.claim_job(&scoped, fingerprint, Caller::Async)?),
        };
        let rx = unreceived.rx.as_mut().expect("set above");
        let row = rx.await.unwrap_or_else(|oneshot::Canceled| Err(stopped()));
        unreceived.rx = None;
        drop(unreceived);
        self.decide(scoped.clone(), fingerprint, row?)
    }

    pub(super) fn withdraw(&self, scoped: &[u8], fence: i64, takeover: bool) {
        self.shared.withdrawn.fetch_add(1, Ordering::Relaxed);
        let fenced = (Target::of(scoped), fence);
        let _ = self.shared.submit(if takeover {
            Job::Extend {
                fenced,
                by: 0,
                orphan: true,
                reply: None,
            }
        } else {
            Job::Release {
                fenced,
                reply: None,
            }
        });
    }

    /// The claim a statement's row means for a caller with `fingerprint`.
    fn decide(&self, scoped: Box<[u8]>, fingerprint: Fingerprint, row: ClaimRow) -> Result<Claim> {
        match row {
            ClaimRow::Won {
                fence,
                claimed_at,
                lease_until,
                replaced,
                ..
            } => {
                let takeover = replaced.map(|(previous, previous_claimed_at, orphan)| Takeover {
                    previous_fence: fence_of(previous),
                    previous_claimed_at: time_of(previous_claimed_at),
                    orphan,
                });
                let issuer: Weak<dyn Issuer> = Arc::downgrade(&self.shared) as Weak<Shared>;
                Ok(Claim::Acquired(Ticket::issue(
                    issuer,
                    Issued {
                        key: scoped,
                        fence: fence_of(fence),
                        fingerprint,
                        claimed_at: u64::try_from(claimed_at).unwrap_or_default(),
                        lease_until: u64::try_from(lease_until).unwrap_or_default(),
                        takeover,
                    },
                )))
            }
            ClaimRow::Held { now, record } => {
                self.shared.clock.saw(now);
                if record.fingerprint.as_slice() != fingerprint.as_bytes().as_slice() {
                    return Ok(Claim::Mismatch {
                        completed: record.completed,
                    });
                }
                if record.completed {
                    let response = response_of(&scoped, &record)?;
                    if let Some(expires_at) = record.expires_at {
                        self.shared.replays.insert(
                            scoped.clone(),
                            Cached {
                                key: scoped,
                                fingerprint,
                                response: response.clone(),
                                expires_at: u64::try_from(expires_at).unwrap_or_default(),
                            },
                        );
                    }
                    return Ok(Claim::Replay(response));
                }
                let left = record.lease_until.unwrap_or(now).saturating_sub(now);
                Ok(Claim::in_progress(
                    self.shared.config.retry_after,
                    Duration::from_millis(u64::try_from(left).unwrap_or_default()),
                    record.orphan,
                ))
            }
        }
    }

    /// The ticket's fenced columns (the seam checked the ticket is this store's).
    pub(super) fn fenced(ticket: &Ticket) -> (Target, i64) {
        (Target::of(ticket.key()), fence_column(ticket.fence()))
    }

    fn complete_job(
        &self,
        ticket: Ticket,
        response: Response,
        caller: Caller,
    ) -> Result<(Ticket, oneshot::Receiver<Result<Option<i64>>>)> {
        let fenced = Self::fenced(&ticket);
        let (reply, rx) = oneshot::channel();
        self.shared.send(
            Job::Complete {
                fenced,
                status: i32::from(response.status),
                headers: encode_headers(&response.headers),
                body: response.body,
                reply,
            },
            caller,
        )?;
        Ok((ticket, rx))
    }

    fn complete_finish(mut ticket: Ticket, done: Result<Option<i64>>) -> Result<()> {
        let completed = done?.is_some();
        ticket.spend();
        if completed {
            Ok(())
        } else {
            Err(Error::LeaseLost {
                fence: ticket.fence(),
            })
        }
    }

    pub(crate) fn complete(&self, ticket: Ticket, response: Response) -> Result<()> {
        let (ticket, rx) = self.complete_job(ticket, response, Caller::Blocking)?;
        Self::complete_finish(ticket, block(rx))
    }

    pub(crate) async fn complete_async(&self, ticket: Ticket, response: Response) -> Result<()> {
        let (ticket, rx) = self.complete_job(ticket, response, Caller::Async)?;
        Self::complete_finish(ticket, answer(rx).await)
    }

    fn release_job(
        &self,
        ticket: &Ticket,
        caller: Caller,
    ) -> Result<oneshot::Receiver<Result<bool>>> {
        let fenced = Self::fenced(ticket);
        let (reply, rx) = oneshot::channel();
        self.shared.send(
            Job::Release {
                fenced,
                reply: Some(reply),
            },
            caller,
        )?;
        Ok(rx)
    }

    fn release_finish(mut ticket: Ticket, done: Result<bool>) -> Result<()> {
        let released = done?;
        ticket.spend();
        if released {
            Ok(())
        } else {
            Err(Error::LeaseLost {
                fence: ticket.fence(),
            })
        }
    }

    pub(crate) fn release(&self, ticket: Ticket) -> Result<()> {
        let rx = self.release_job(&ticket, Caller::Blocking)?;
        Self::release_finish(ticket, block(rx))
    }

    pub(crate) async fn release_async(&self, ticket: Ticket) -> Result<()> {
        let rx = self.release_job(&ticket, Caller::Async)?;
        Self::release_finish(ticket, answer(rx).await)
    }

    fn extend_job(
        &self,
        ticket: &Ticket,
        by: Duration,
        caller: Caller,
    ) -> Result<oneshot::Receiver<Result<Option<i64>>>> {
        let fenced = Self::fenced(ticket);
        let (reply, rx) = oneshot::channel();
        self.shared.send(
            Job::Extend {
                fenced,
                by: millis_column(by),
                orphan: false,
                reply: Some(reply),
            },
            caller,
        )?;
        Ok(rx)
    }

    fn extend_finish(ticket: &Ticket, done: Result<Option<i64>>) -> Result<()> {
        match done? {
            Some(lease_until) => {
                ticket.renewed(u64::try_from(lease_until).unwrap_or_default());
                Ok(())
            }
            None => Err(Error::LeaseLost {
                fence: ticket.fence(),
            }),
        }
    }

    pub(crate) fn extend(&self, ticket: &Ticket, by: Duration) -> Result<()> {
        let rx = self.extend_job(ticket, by, Caller::Blocking)?;
        Self::extend_finish(ticket, block(rx))
    }

    pub(crate) async fn extend_async(&self, ticket: &Ticket, by: Duration) -> Result<()> {
        let rx = self.extend_job(ticket, by, Caller::Async)?;
        Self::extend_finish(ticket, answer(rx).await)
    }

    /// The record of `scoped` now, by the database's clock: `(now, record)`.
    pub(super) fn read(&self, scoped: &[u8]) -> oneshot::Receiver<Result<(i64, Option<Held>)>> {
        let target = Target::of(scoped);
        let adjust = self.shared.adjust();
        let owner = self.shared.context.params.owner.clone();
        let incarnation = self.shared.context.params.incarnation;
        self.shared.task(move |conn| async move {
            let row = query_one(
                &conn,
                &conn.get,
                &[
                    &adjust,
                    &target.tenant,
                    &target.endpoint,
                    &target.key,
                    &owner,
                    &incarnation,
                ],
            )
            .await
            .map_err(db_error)?;
            record_row(&row)
        })
    }

    pub(crate) fn get(&self, scope: &Scope, key: &str) -> Result<Option<Entry>> {
        let scoped = scoped_key(scope, key)?;
        let (now, held) = block(self.read(&scoped))?;
        let Some(record) = held else {
            return Ok(None);
        };
        let state = if record.completed {
            let expires_at = record.expires_at.unwrap_or(now);
            if now >= expires_at {
                return Ok(None);
            }
            EntryState::Completed {
                expires_at: time_of(expires_at),
                response: response_of(&scoped, &record)?,
            }
        } else {
            EntryState::InProgress {
                lease_deadline: time_of(record.lease_until.unwrap_or(now)),
                orphan: record.orphan,
            }
        };
        Ok(Some(Entry {
            fence: fence_of(record.fence),
            fingerprint: fingerprint_of(&scoped, &record)?,
            claimed_at: time_of(record.claimed_at),
            state,
        }))
    }

    /// Whether a claim of `scoped` would not answer `InProgress` now, and if not, how long
    /// until its lease ends.
    pub(super) fn look(&self, now: i64, held: Option<&Held>) -> Option<Duration> {
        let record = held?;
        if record.completed {
            return None;
        }
        let lease_until = record.lease_until.unwrap_or(now);
        if now < lease_until {
            return Some(Duration::from_millis(
                u64::try_from(lease_until - now).unwrap_or_default(),
            ));
        }
        match self.shared.config.stale_policy {
            StalePolicy::Keep => Some(Duration::MAX),
            _ => None,
        }
    }

    /// The pause before looking again: while notifications wake the waiter, a short look
    /// just after its `want` (see [`super::wakes`]) then a rare one for a notification lost;
    /// otherwise short at first and growing. Never past the lease's end or the deadline.
    fn poll_pause(
        round: u32,
        listening: Option<bool>,
        until_lease_end: Duration,
        deadline: Instant,
    ) -> Instant {
        let pause = match listening {
            Some(true) => FIRST_LOOK,
            Some(false) => LISTENING_POLL,
            None => Duration::from_millis(5u64 << round.min(5)),
        }
        .min(until_lease_end);
        Instant::now()
            .checked_add(pause)
            .map_or(deadline, |at| at.min(deadline))
    }

    pub(crate) fn wait(&self, scope: &Scope, key: &str, timeout: Duration) -> Result<bool> {
        blocking(self.wait_async(scope, key, timeout))
    }

    pub(crate) fn wait_async(
        &self,
        scope: &Scope,
        key: &str,
        timeout: Duration,
    ) -> impl Future<Output = Result<bool>> + Send + '_ {
        let deadline = Instant::now()
            .checked_add(timeout)
            .unwrap_or_else(crate::timer::far_future);
        let scoped = scoped_key(scope, key);
        async move {
            let scoped = scoped?;
            let watch = self.shared.context.wakes.watch(&Target::of(&scoped));
            // Until when the other replicas were told this waiter wants the key's change.
            let mut wanted: Option<Instant> = None;
            for round in 0.. {
                // Registered before the read: a change committed after it wakes this round.
                let changed = watch.notified();
                let mut just_wanted = false;
                let renew = wanted.is_none_or(|until| until <= Instant::now() + WANT_MARGIN);
                if watch.listening() && renew {
                    let how_long = deadline
                        .saturating_duration_since(Instant::now())
                        .min(WANT_SPAN);
                    if watch.want(how_long).await {
                        wanted = Instant::now().checked_add(how_long);
                        just_wanted = true;
                    }
                }
                let (now, held) = answer(self.read(&scoped)).await?;
                let Some(left) = self.look(now, held.as_ref()) else {
                    return Ok(true);
                };
                if Instant::now() >= deadline {
                    return Ok(false);
                }
                // `Some(first look?)` while notifications reach this waiter, else `None`.
                let listening = (watch.listening() && wanted.is_some()).then_some(just_wanted);
                let pause =
                    crate::timer::sleep_until(Self::poll_pause(round, listening, left, deadline));
                futures_util::future::select(std::pin::pin!(changed), std::pin::pin!(pause)).await;
            }
            unreachable!("the loop above only returns")
        }
    }
}
