//! The public store: one type over two engines. Every operation is documented here, once, and
//! dispatched through the engine seam (`crate::engine`) to the engine the store was opened on:
//! the file engine (`crate::file`) or the PostgreSQL engine (`crate::postgres`, feature
//! `postgres`). The rules both engines obey are applied here, before either sees a call: a
//! store that halted answers `Halted` before anything else, a ticket must be the serving
//! engine's, a response must fit the limit, and every answer is counted (`crate::observe`).

use crate::engine::{dispatch, Engine};
use crate::error::{Error, Result};
use crate::model::claim::{Claim, Entry, Resolution, StaleClaim};
use crate::model::fingerprint::Fingerprint;
use crate::model::listing::{ListedRecord, Query};
use crate::model::response::Response;
use crate::model::scope::Scope;
use crate::model::ticket::Ticket;
use crate::observe::{Observer, Op, Subject};
use crate::stats::Stats;
use std::future::Future;
use std::ops::ControlFlow;
use std::time::Duration;

/// An idempotency-key store: over one redb file owned by this process ([`Store::open`]), or over
/// a PostgreSQL database shared by many replicas (`Store::connect`, feature `postgres`). Both
/// engines answer every operation with the same semantics; `docs/design.md` and
/// `docs/postgres.md` say how each one keeps its promises.
///
/// `Store` is cheap to clone (an `Arc`), and `Send + Sync`: share one per file (or database)
/// across every thread. The plain operations block; the `*_async` ones do not. Each write
/// returns only once it is durable. Concurrent writes share one fsync on the file, one
/// statement and one commit on PostgreSQL (group commit).
///
/// ```
/// use idemdb::{Claim, Fingerprint, Response, Scope, Store};
/// let store = Store::in_memory()?;
/// let scope = Scope::new("tenant_42", "POST /v1/payments");
/// let body = br#"{"amount":5000}"#;
/// match store.claim(&scope, "7c9e6679-7425-40de", Fingerprint::of(body))? {
///     Claim::Acquired(ticket) => {
///         // ... charge the card, exactly once ...
///         store.complete(ticket, Response::new(201, r#"{"id":"pay_1"}"#))?;
///     }
///     other => unreachable!("a new key is acquired: {other:?}"),
/// }
/// // The retry after a lost response gets the stored response back.
/// let Claim::Replay(r) = store.claim(&scope, "7c9e6679-7425-40de", Fingerprint::of(body))? else {
///     unreachable!()
/// };
/// assert_eq!(r.body(), br#"{"id":"pay_1"}"#);
/// # Ok::<(), idemdb::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Store {
    pub(crate) engine: Engine,
    /// The store's counters, spans and metrics.
    observer: Observer,
    /// The largest response a completion may store ([`crate::StoreBuilder::max_response_bytes`]).
    max_response_bytes: usize,
    /// What becomes of a claim whose lease ran out ([`crate::StoreBuilder::stale_policy`]).
    stale_policy: crate::StalePolicy,
}

impl Store {
    pub(crate) fn new(engine: Engine, config: &crate::config::Config) -> Store {
        Store {
            engine,
            observer: config.observer.clone(),
            max_response_bytes: config.max_response_bytes,
            stale_policy: config.stale_policy,
        }
    }

    /// `ticket`, if `issuer` (the engine serving now) issued it and it is unspent; else
    /// `LeaseLost` (a ticket of another store, or of the store a heal replaced).
    fn held<T: std::borrow::Borrow<Ticket>>(ticket: T, issuer: *const ()) -> Result<T> {
        if ticket.borrow().issued_by(issuer) {
            Ok(ticket)
        } else {
            Err(Error::LeaseLost {
                fence: ticket.borrow().fence(),
            })
        }
    }

    /// `Err(ResponseTooLarge)` (without a ticket) if `response` is over the limit.
    fn fits(&self, response: &Response) -> Result<()> {
        let size = response.encoded_size();
        if size > self.max_response_bytes {
            return Err(Error::ResponseTooLarge {
                size,
                limit: self.max_response_bytes,
                ticket: None,
            });
        }
        Ok(())
    }

    /// A held ticket with a response that fits, ready for an engine to complete; an oversize
    /// response hands the ticket back in its error.
    fn completable(
        &self,
        ticket: Ticket,
        response: &Response,
        issuer: *const (),
    ) -> Result<Ticket> {
        let ticket = Self::held(ticket, issuer)?;
        match self.fits(response) {
            Ok(()) => Ok(ticket),
            Err(Error::ResponseTooLarge { size, limit, .. }) => Err(Error::ResponseTooLarge {
                size,
                limit,
                ticket: Some(Box::new(ticket)),
            }),
            Err(e) => Err(e),
        }
    }

    /// Claims `key` in `scope` for a request with `fingerprint`, before the side effect runs.
    ///
    /// - A new key (or one whose record expired) is [`Claim::Acquired`]; the in-progress record
    ///   is durable before this returns (its batch's journal entry is written and the journal
    ///   `fdatasync(2)`ed; see `docs/design.md`).
    /// - A completed key with the same fingerprint is [`Claim::Replay`] with the stored response.
    /// - A key in progress is [`Claim::InProgress`]; a stale one (lease run out) is taken over
    ///   under [`crate::StalePolicy::TakeOver`] (an `Acquired` whose ticket says so).
    /// - A key held or completed with another fingerprint is [`Claim::Mismatch`], and nothing
    ///   changes.
    ///
    /// # Concurrency
    /// Any number of threads may claim the same key at once: exactly one gets `Acquired`, the
    /// others `InProgress` (or, once it completed, `Replay`). If the holder panics or drops its
    /// ticket, the key stays in progress until the lease runs out.
    ///
    /// # Errors
    /// [`crate::Error::InvalidKey`] / [`crate::Error::InvalidScope`] for bad input (nothing stored);
    /// [`crate::Error::Halted`] after a failed commit; [`crate::Error::Io`] if the commit holding this claim
    /// failed, in which case the claim is not held.
    /// On PostgreSQL, [`crate::Error::Database`] if the database fails or cannot be reached.
    pub fn claim(&self, scope: &Scope, key: &str, fingerprint: Fingerprint) -> Result<Claim> {
        self.observer
            .claim(scope)
            .claim(|| dispatch!(&self.engine, e => e.claim(scope, key, fingerprint)))
    }

    /// Stores `response` for the ticket's key and ends the claim: every later claim with the
    /// same fingerprint replays it until the TTL runs out. Durable before this returns (journal
    /// entry and `fdatasync(2)`, as for `claim`).
    ///
    /// A claim may be completed after its lease ran out, as long as nobody took it over or
    /// reaped it.
    ///
    /// # Concurrency
    /// Claims of the key made while this runs answer `InProgress` until the completion is
    /// durable, then `Replay`.
    ///
    /// # Errors
    /// [`crate::Error::ResponseTooLarge`] (the claim is still held and the error hands the ticket
    /// back: release it or store a smaller response); [`crate::Error::LeaseLost`] if the claim was released, reaped or taken over, or the
    /// ticket is from another store; [`crate::Error::Halted`] / [`crate::Error::Io`] if the commit failed.
    /// On PostgreSQL, [`crate::Error::Database`] if the database fails or cannot be reached.
    pub fn complete(&self, ticket: Ticket, response: Response) -> Result<()> {
        self.observer
            .op(Op::Complete, Subject::Ticket(&ticket))
            .call(|| {
                dispatch!(&self.engine, e => {
                    e.check()?;
                    let ticket = self.completable(ticket, &response, e.issuer())?;
                    e.complete(ticket, response)
                })
            })
    }

    /// Deletes the claim, durably, so the next claim of the key is `Acquired` and executes.
    /// Use it when the failure belonged to the moment (a timeout, a 503 downstream), not to
    /// the request.
    ///
    /// # Concurrency
    /// A claim racing with the release either sees the key in progress or acquires it anew;
    /// it never sees a half-released key.
    ///
    /// # Errors
    /// [`crate::Error::LeaseLost`] if the claim is no longer held by this ticket;
    /// [`crate::Error::Halted`] / [`crate::Error::Io`] if the commit failed.
    /// On PostgreSQL, [`crate::Error::Database`] if the database fails or cannot be reached.
    pub fn release(&self, ticket: Ticket) -> Result<()> {
        self.observer
            .op(Op::Release, Subject::Ticket(&ticket))
            .call(|| {
                dispatch!(&self.engine, e => {
                    e.check()?;
                    e.release(Self::held(ticket, e.issuer())?)
                })
            })
    }

    /// Renews the ticket's lease to run until `by` from now, durably, so a slow handler is not
    /// taken over. May be called any number of times while the claim is held.
    ///
    /// # Errors
    /// [`crate::Error::LeaseLost`] if the claim is no longer held by this ticket (a takeover may
    /// already have happened: stop and reconcile); [`crate::Error::Halted`] / [`crate::Error::Io`] if the
    /// commit failed.
    /// On PostgreSQL, [`crate::Error::Database`] if the database fails or cannot be reached.
    pub fn extend(&self, ticket: &Ticket, by: Duration) -> Result<()> {
        self.observer
            .op(Op::Extend, Subject::Ticket(ticket))
            .call(|| {
                dispatch!(&self.engine, e => {
                    e.check()?;
                    e.extend(Self::held(ticket, e.issuer())?, by)
                })
            })
    }

    /// The record of `key` in `scope` as claims see it now: `None` if absent or expired.
    /// Completed records are read from disk for their response.
    ///
    /// # Concurrency
    /// A snapshot; it may be stale by the time it returns.
    ///
    /// # Errors
    /// [`crate::Error::InvalidKey`] / [`crate::Error::InvalidScope`]; [`crate::Error::Corrupted`] if the record fails
    /// its checksum; [`crate::Error::Halted`] after a failed commit.
    /// On PostgreSQL, [`crate::Error::Database`] if the database fails or cannot be reached.
    pub fn get(&self, scope: &Scope, key: &str) -> Result<Option<Entry>> {
        dispatch!(&self.engine, e => e.get(scope, key))
    }

    /// The lease a new claim gets ([`crate::StoreBuilder::lease`]); what a slow handler
    /// usually renews its claim by with [`Store::extend`].
    pub fn lease_duration(&self) -> Duration {
        dispatch!(&self.engine, e => e.lease_duration())
    }

    /// What becomes of a claim whose lease ran out ([`crate::StoreBuilder::stale_policy`]):
    /// taken over by the next claim, or kept for a reap or an operator.
    ///
    /// ```
    /// use idemdb::{StalePolicy, Store};
    /// assert_eq!(Store::in_memory()?.stale_policy(), StalePolicy::TakeOver);
    /// let keeps = Store::builder().stale_policy(StalePolicy::Keep).in_memory()?;
    /// assert_eq!(keeps.stale_policy(), StalePolicy::Keep);
    /// # Ok::<(), idemdb::Error>(())
    /// ```
    pub fn stale_policy(&self) -> crate::StalePolicy {
        self.stale_policy
    }

    /// The counters since the store was opened, and what the engine knows without asking the
    /// disk or the database: nothing here does I/O, so it may be called as often as a metrics
    /// scrape wants.
    ///
    /// ```
    /// use idemdb::{Claim, Fingerprint, Scope, Store};
    /// let store = Store::in_memory()?;
    /// let Claim::Acquired(t) = store.claim(&Scope::new("t", "POST /x"), "k", Fingerprint::of(b""))? else { panic!() };
    /// let stats = store.stats();
    /// assert_eq!((stats.acquired, stats.live_records), (1, Some(1)));
    /// # drop(t);
    /// # Ok::<(), idemdb::Error>(())
    /// ```
    pub fn stats(&self) -> Stats {
        self.observer.counters().snapshot(self.engine.figures())
    }

    /// How many records the store holds (in progress or completed, expired ones not yet
    /// purged included). On a file this is the index's count, as [`Stats::live_records`]
    /// has it; on PostgreSQL it counts the table's rows, a read of the whole table.
    ///
    /// # Errors
    /// [`crate::Error::Halted`] after a failed commit on a file; on PostgreSQL,
    /// [`crate::Error::Database`] if the database fails or cannot be reached.
    pub fn record_count(&self) -> Result<u64> {
        dispatch!(&self.engine, e => e.record_count())
    }

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
    /// On PostgreSQL, [`crate::Error::Database`] if the database fails or cannot be reached.
    pub async fn claim_async(
        &self,
        scope: &Scope,
        key: &str,
        fingerprint: Fingerprint,
    ) -> Result<Claim> {
        let span = self.observer.claim(scope);
        span.claim_async(async {
            dispatch!(&self.engine, e => e.claim_async(scope, key, fingerprint).await)
        })
        .await
    }

    /// [`Store::complete`], awaiting the completion's fsync instead of blocking on it.
    ///
    /// # Cancellation
    /// Dropping the future after the completion was queued does not undo it: it lands.
    ///
    /// # Errors
    /// As [`Store::complete`].
    /// On PostgreSQL, [`crate::Error::Database`] if the database fails or cannot be reached.
    pub async fn complete_async(&self, ticket: Ticket, response: Response) -> Result<()> {
        let span = self.observer.op(Op::Complete, Subject::Ticket(&ticket));
        span.call_async(async {
            dispatch!(&self.engine, e => {
                e.check()?;
                let ticket = self.completable(ticket, &response, e.issuer())?;
                e.complete_async(ticket, response).await
            })
        })
        .await
    }

    /// [`Store::release`], awaiting the fsync instead of blocking on it.
    ///
    /// # Errors
    /// As [`Store::release`].
    /// On PostgreSQL, [`crate::Error::Database`] if the database fails or cannot be reached.
    pub async fn release_async(&self, ticket: Ticket) -> Result<()> {
        let span = self.observer.op(Op::Release, Subject::Ticket(&ticket));
        span.call_async(async {
            dispatch!(&self.engine, e => {
                e.check()?;
                e.release_async(Self::held(ticket, e.issuer())?).await
            })
        })
        .await
    }

    /// [`Store::extend`], awaiting the fsync instead of blocking on it.
    ///
    /// # Errors
    /// As [`Store::extend`].
    /// On PostgreSQL, [`crate::Error::Database`] if the database fails or cannot be reached.
    pub async fn extend_async(&self, ticket: &Ticket, by: Duration) -> Result<()> {
        let span = self.observer.op(Op::Extend, Subject::Ticket(ticket));
        span.call_async(async {
            dispatch!(&self.engine, e => {
                e.check()?;
                e.extend_async(Self::held(ticket, e.issuer())?, by).await
            })
        })
        .await
    }

    /// Hands every stale claim to `resolver` and applies its decision: claims whose lease ran
    /// out, and every claim a previous process left (an orphan, stale at once whatever its
    /// lease says, since its holder is gone). Returns how many were released or completed.
    ///
    /// Reaping is how a crash between the side effect and `complete` is repaired: the resolver
    /// asks the downstream system whether the effect happened (complete with the response it
    /// should have had) or not (release, so the retry executes).
    ///
    /// ```
    /// use idemdb::{Claim, Fingerprint, ManualClock, Resolution, Scope, Store};
    /// use std::time::Duration;
    /// let clock = ManualClock::new();
    /// let store = Store::builder().lease(Duration::from_secs(60)).clock(clock.clone()).in_memory()?;
    /// let scope = Scope::new("t", "POST /x");
    /// let Claim::Acquired(ticket) = store.claim(&scope, "k1", Fingerprint::of(b"x"))? else { panic!() };
    /// drop(ticket); // as if the handler crashed
    /// clock.advance(Duration::from_secs(61));
    /// let resolved = store.reap(|stale| {
    ///     assert_eq!(stale.key, "k1");
    ///     Resolution::Release
    /// })?;
    /// assert_eq!(resolved, 1);
    /// assert!(matches!(store.claim(&scope, "k1", Fingerprint::of(b"x"))?, Claim::Acquired(_)));
    /// # Ok::<(), idemdb::Error>(())
    /// ```
    ///
    /// # Concurrency
    /// The resolver runs with no lock held, so it may take its time and may call the store. A
    /// claim that changes while the resolver runs (taken over, extended, completed) is left as
    /// it is and not counted. The holder of a reaped claim gets [`crate::Error::LeaseLost`] from its
    /// next `complete`, `release` or `extend`.
    ///
    /// # Errors
    /// [`crate::Error::ResponseTooLarge`] if the resolver returns an oversize response (claims resolved
    /// before it stay resolved and durable); [`crate::Error::Halted`] / [`crate::Error::Io`] if a commit fails.
    /// On PostgreSQL, [`crate::Error::Database`] if the database fails or cannot be reached.
    pub fn reap(&self, mut resolver: impl FnMut(&StaleClaim) -> Resolution) -> Result<usize> {
        let checked = |stale: &StaleClaim| {
            let decision = resolver(stale);
            if let Resolution::Complete(response) = &decision {
                self.fits(response)?;
            }
            Ok(decision)
        };
        self.observer
            .op(Op::Reap, Subject::Store)
            .call_counted(|| dispatch!(&self.engine, e => e.reap(checked)))
    }

    /// Resolves one stale claim, as [`Store::reap`] would if its resolver decided `resolution`
    /// for it: the claim of `key` in `scope` with fence `fence`, if its lease ran out or its
    /// holder is gone (an orphan). Returns `true` if it was released or completed; `false` if
    /// nothing changed: the key holds no record, or a record with another fence, or a
    /// completion, or a claim whose lease still runs (wait for it, or stop its holder), or
    /// `resolution` is [`Resolution::Keep`]. This is what an operator's reconcile of one stuck
    /// claim needs (`idemdb resolve`), without offering every stale claim to a resolver.
    ///
    /// ```
    /// use idemdb::{Claim, Fingerprint, ManualClock, Resolution, Response, Scope, Store};
    /// use std::time::Duration;
    /// let clock = ManualClock::new();
    /// let store = Store::builder().clock(clock.clone()).in_memory()?;
    /// let scope = Scope::new("t", "POST /x");
    /// let Claim::Acquired(ticket) = store.claim(&scope, "k1", Fingerprint::of(b"x"))? else { panic!() };
    /// let fence = ticket.fence();
    /// drop(ticket); // the handler crashed after charging the card
    /// // Its lease still runs out in the future? A dropped ticket's claim is an orphan at once.
    /// let charged = Response::new(201, "paid");
    /// assert!(store.resolve(&scope, "k1", fence, Resolution::Complete(charged))?);
    /// assert!(matches!(store.claim(&scope, "k1", Fingerprint::of(b"x"))?, Claim::Replay(_)));
    /// # Ok::<(), idemdb::Error>(())
    /// ```
    ///
    /// # Concurrency
    /// As a reap: the claim is changed only if it is still the stale claim with that fence;
    /// its holder, if any, gets [`crate::Error::LeaseLost`] from its next `complete`,
    /// `release` or `extend`.
    ///
    /// # Errors
    /// [`crate::Error::InvalidKey`] / [`crate::Error::InvalidScope`] for bad input;
    /// [`crate::Error::ResponseTooLarge`] for an oversize response (nothing changed);
    /// [`crate::Error::Halted`] / [`crate::Error::Io`] if the commit fails.
    /// On PostgreSQL, [`crate::Error::Database`] if the database fails or cannot be reached.
    pub fn resolve(
        &self,
        scope: &Scope,
        key: &str,
        fence: u64,
        resolution: Resolution,
    ) -> Result<bool> {
        self.observer
            .op(Op::Resolve, Subject::Scope(scope))
            .call_resolved(|| {
                dispatch!(&self.engine, e => {
                    e.check()?;
                    match &resolution {
                        Resolution::Complete(response) => self.fits(response)?,
                        Resolution::Release => {}
                        Resolution::Keep => {
                            crate::model::scope::scoped_key(scope, key)?;
                            return Ok(false);
                        }
                    }
                    e.resolve(scope, key, fence, resolution)
                })
            })
    }

    /// Deletes every record whose TTL ran out, and returns how many. Expired records are
    /// already invisible to every read; purging frees their space. On a file the due records
    /// are found in the in-memory index (a pass over it: about 10 ms per million live records),
    /// and deleted in commits of up to 4,096; on PostgreSQL an index on the expiry orders them,
    /// so the cost follows what expired. Call it from a timer (every minute or so).
    ///
    /// # Concurrency
    /// Runs alongside claims: each index stripe is locked only while its slots are read, and
    /// each record is deleted only if its slot is still the one read. A key re-claimed after
    /// it expired is left to its new claim.
    ///
    /// # Errors
    /// [`crate::Error::Halted`] / [`crate::Error::Io`] if a commit fails; [`crate::Error::Corrupted`] for a damaged
    /// record (read only with per-tenant limits, for its tenant).
    /// On PostgreSQL, [`crate::Error::Database`] if the database fails or cannot be reached.
    pub fn purge_expired(&self) -> Result<usize> {
        self.observer
            .op(Op::Purge, Subject::Store)
            .call_counted(|| dispatch!(&self.engine, e => e.purge_expired()))
    }

    /// Blocks until no claim holds `key` in `scope`, or `timeout` passes: until a claim of the
    /// key would no longer answer [`crate::Claim::InProgress`]. Returns `true` once the holder
    /// completed (and the completion is durable), released, was reaped or withdrawn, or its
    /// lease ran out (under [`crate::StalePolicy::TakeOver`]; under [`crate::StalePolicy::Keep`] a stale
    /// claim holds the key until it is reaped); `false` if `timeout` passed first. Returns at
    /// once if nothing holds the key.
    ///
    /// On a file it wakes as soon as the change happens, not at a polling interval: a duplicate
    /// that waits for an in-flight request gets its replay within microseconds of the
    /// completion's fsync. Lease ends are read from the store's [`crate::Clock`] (a
    /// [`crate::ManualClock`] moved by a test wakes the waiter); `timeout` is real time. On
    /// PostgreSQL it is woken by a completion or release of this replica directly, and of
    /// another replica through `LISTEN`/`NOTIFY` (about a millisecond after the other's
    /// commit); it also reads the record 50 ms after it starts and then every 2 s. Behind a
    /// transaction pooler, or while the store's listening connection is down, it reads again
    /// after 5 ms, then at doubling intervals up to 160 ms. Never past the lease's end or the
    /// timeout; lease ends are the database's. See `docs/postgres.md`, "Waiting".
    ///
    /// ```
    /// use idemdb::{Claim, Fingerprint, Response, Scope, Store};
    /// use std::time::Duration;
    /// let store = Store::in_memory()?;
    /// let scope = Scope::new("tenant_42", "POST /v1/payments");
    /// let fp = Fingerprint::of(b"{}");
    /// let Claim::Acquired(ticket) = store.claim(&scope, "k1", fp)? else { unreachable!() };
    /// let finisher = {
    ///     let store = store.clone();
    ///     std::thread::spawn(move || store.complete(ticket, Response::new(201, "done")))
    /// };
    /// // A duplicate waits for the first attempt instead of answering 409 at once.
    /// assert!(store.wait(&scope, "k1", Duration::from_secs(10))?);
    /// assert!(matches!(store.claim(&scope, "k1", fp)?, Claim::Replay(_)));
    /// finisher.join().unwrap()?;
    /// # Ok::<(), idemdb::Error>(())
    /// ```
    ///
    /// # Concurrency
    /// Any number of threads may wait on one key. `true` says the key was free at one moment;
    /// another claim may acquire it before the caller claims again, so callers loop: claim,
    /// and on `InProgress` wait again within what is left of their budget.
    ///
    /// # Errors
    /// [`crate::Error::InvalidKey`] / [`crate::Error::InvalidScope`] for bad input;
    /// [`crate::Error::Halted`] if the store halted (also while waiting).
    /// On PostgreSQL, [`crate::Error::Database`] if the database fails or cannot be reached.
    pub fn wait(&self, scope: &Scope, key: &str, timeout: Duration) -> Result<bool> {
        self.observer
            .op(Op::Wait, Subject::Scope(scope))
            .call(|| dispatch!(&self.engine, e => e.wait(scope, key, timeout)))
    }

    /// [`Store::wait`] without blocking the thread: the future is woken by the change itself,
    /// or by a timer (one `idemdb-timer` thread per process) at the deadline or the lease's
    /// end. Any executor works.
    ///
    /// The input is checked, and the timeout starts, when this is called; the future borrows
    /// only the store.
    ///
    /// # Cancellation
    /// Dropping the future removes the waiter; nothing else happens.
    ///
    /// # Errors
    /// As [`Store::wait`].
    /// On PostgreSQL, [`crate::Error::Database`] if the database fails or cannot be reached.
    pub fn wait_async(
        &self,
        scope: &Scope,
        key: &str,
        timeout: Duration,
    ) -> impl Future<Output = Result<bool>> + Send + '_ {
        let waiting: std::pin::Pin<Box<dyn Future<Output = Result<bool>> + Send + '_>> =
            dispatch!(&self.engine, e => Box::pin(e.wait_async(scope, key, timeout)));
        let span = self.observer.op(Op::Wait, Subject::Scope(scope));
        span.call_async(waiting)
    }

    /// Hands the records `query` selects to `each`, one at a time, until `each` returns
    /// `ControlFlow::Break` or the query's limit is reached, and returns how many it handed
    /// over. Each comes with its status at the store's clock (in progress, stale, orphan,
    /// completed, expired) and all of it, the stored response included. On a file the records
    /// come in the order they are stored: a claim in progress at its fence, a completion at the
    /// fence it took when it completed (so claims in progress come oldest first, completions in
    /// the order they completed, each naming its claim's fence); on PostgreSQL in key order.
    ///
    /// This is the inspection the `idemdb` command offers, for a service to offer it live: a
    /// file store cannot be opened by a second process while the service holds it.
    ///
    /// ```
    /// use idemdb::{Claim, Fingerprint, Query, RecordStatus, Response, Scope, Store};
    /// use std::ops::ControlFlow;
    /// let store = Store::in_memory()?;
    /// let scope = Scope::new("tenant_42", "POST /v1/payments");
    /// let Claim::Acquired(t) = store.claim(&scope, "k1", Fingerprint::of(b"a"))? else { panic!() };
    /// store.complete(t, Response::new(201, "paid"))?;
    /// let Claim::Acquired(held) = store.claim(&scope, "k2", Fingerprint::of(b"b"))? else { panic!() };
    /// let mut in_progress = Vec::new();
    /// store.scan(&Query::all().status(RecordStatus::InProgress), |record| {
    ///     in_progress.push(record.key);
    ///     ControlFlow::Continue(())
    /// })?;
    /// assert_eq!(in_progress, ["k2"]);
    /// # drop(held);
    /// # Ok::<(), idemdb::Error>(())
    /// ```
    ///
    /// # Concurrency
    /// On a file, the index is read once every queued write landed, then the records a
    /// thousand at a time, each thousand in one snapshot, while the store keeps serving: a
    /// record that changes during the scan is handed over as it was read, and a record claimed
    /// after the scan started may be missing. On PostgreSQL, a thousand rows per statement.
    /// The scan holds no lock while `each` runs, so `each` may call the store.
    ///
    /// # Errors
    /// [`crate::Error::Corrupted`] for a record that fails its checksum;
    /// [`crate::Error::Halted`] after a failed commit.
    /// On PostgreSQL, [`crate::Error::Database`] if the database fails or cannot be reached.
    pub fn scan(
        &self,
        query: &Query,
        each: impl FnMut(ListedRecord) -> ControlFlow<()>,
    ) -> Result<u64> {
        self.scan_with(query, None, each)
    }

    /// [`Store::scan`] past damage, to learn what a damaged store still holds: a record that
    /// fails its checks, or whose page cannot be read, goes to `damaged` as the
    /// [`crate::Error::Corrupted`] naming it (by fence and key, or by fence alone when its page
    /// hides its key), and the scan goes on. `each` gets every record that can be read; the
    /// count returned is theirs. What `idemdb verify` lists and `idemdb export --past-damage`
    /// carries into a new store.
    ///
    /// ```
    /// use idemdb::{Claim, Fingerprint, Query, Response, Scope, Store};
    /// use std::ops::ControlFlow;
    /// let store = Store::in_memory()?;
    /// let scope = Scope::new("t", "POST /x");
    /// let Claim::Acquired(t) = store.claim(&scope, "k", Fingerprint::of(b"x"))? else { panic!() };
    /// store.complete(t, Response::new(201, "ok"))?;
    /// let mut damaged = Vec::new();
    /// let intact = store.scan_past_damage(&Query::all(), |_| ControlFlow::Continue(()), |e| damaged.push(e))?;
    /// assert_eq!((intact, damaged.len()), (1, 0));
    /// # Ok::<(), idemdb::Error>(())
    /// ```
    ///
    /// # Concurrency
    /// As [`Store::scan`].
    ///
    /// # Errors
    /// As [`Store::scan`], except for damage to single records: [`crate::Error::Halted`], an
    /// I/O error, or on PostgreSQL [`crate::Error::Database`], end the scan.
    pub fn scan_past_damage(
        &self,
        query: &Query,
        each: impl FnMut(ListedRecord) -> ControlFlow<()>,
        mut damaged: impl FnMut(Error),
    ) -> Result<u64> {
        self.scan_with(query, Some(&mut damaged), each)
    }

    fn scan_with(
        &self,
        query: &Query,
        past_damage: crate::model::report::PastDamage<'_>,
        each: impl FnMut(ListedRecord) -> ControlFlow<()>,
    ) -> Result<u64> {
        let mut handed = 0;
        let mut filter = crate::model::listing::filtered(query, each, &mut handed);
        if query.max_records() > 0 {
            dispatch!(&self.engine, e => e.scan_each(query, past_damage, &mut filter))?;
        }
        drop(filter);
        Ok(handed)
    }

    /// What the store holds, counted: records by tenant and status, the bytes of the stored
    /// response bodies, the highest fence and the oldest claim not finished (what `idemdb
    /// stats` shows).
    ///
    /// ```
    /// use idemdb::{Claim, Fingerprint, Response, Scope, Store};
    /// let store = Store::in_memory()?;
    /// let Claim::Acquired(t) = store.claim(&Scope::new("acme", "POST /pay"), "k", Fingerprint::of(b""))? else { panic!() };
    /// store.complete(t, Response::new(201, "paid"))?;
    /// let census = store.census()?;
    /// assert_eq!((census.records(), census.response_bytes), (1, 4));
    /// assert_eq!(census.by_tenant["acme"][3], 1); // RecordStatus::ALL[3]: completed
    /// # Ok::<(), idemdb::Error>(())
    /// ```
    ///
    /// # Cost
    /// On a file, a [`Store::scan`] of every record. On PostgreSQL, two statements that
    /// aggregate in the database: one pass over the table, and no row leaves the server.
    ///
    /// # Concurrency
    /// As [`Store::scan`] on a file (a page at a time, while claims go on); one snapshot per
    /// statement on PostgreSQL.
    ///
    /// # Errors
    /// As [`Store::scan`].
    pub fn census(&self) -> Result<crate::Census> {
        #[cfg(feature = "postgres")]
        if let Engine::Postgres(pg) = &self.engine {
            return pg.census();
        }
        let mut census = crate::Census::default();
        self.scan(&Query::all(), |record| {
            census.add(&record);
            ControlFlow::Continue(())
        })?;
        Ok(census)
    }

    /// The records `query` selects, as [`Store::scan`] hands them over: mind the query's
    /// limit on a large store, since each record holds its whole response.
    ///
    /// # Errors
    /// As [`Store::scan`].
    pub fn list(&self, query: &Query) -> Result<Vec<ListedRecord>> {
        let mut out = Vec::new();
        self.scan(query, |record| {
            out.push(record);
            ControlFlow::Continue(())
        })?;
        Ok(out)
    }

    /// Writes every live record (claims in progress, completions not yet expired) to `out`,
    /// one JSON line each, with its fence, fingerprint, times and whole response, so that
    /// [`Store::import`] into another store (a PostgreSQL one, when a service outgrows one
    /// process) or [`crate::StoreBuilder::import_new`] into a new file answers every claim as this
    /// one did. Returns how many records it wrote. The line format is in `docs/postgres.md`.
    ///
    /// # Concurrency
    /// As [`Store::scan`]: for an exact move, stop the writers first (a claim made during the
    /// export may be missing from it).
    ///
    /// # Errors
    /// [`crate::Error::Io`] if `out` fails; the store's read errors
    /// ([`crate::Error::Corrupted`], [`crate::Error::Halted`], [`crate::Error::Database`]).
    #[cfg(feature = "export")]
    pub fn export(&self, out: impl std::io::Write) -> Result<u64> {
        self.export_with(out, None)
    }

    /// [`Store::export`] past damage: every live record that can be read is written, and each
    /// that cannot goes to `damaged`, as [`Store::scan_past_damage`] hands it over. The way
    /// to carry what a damaged store still holds into a new one (then
    /// [`crate::StoreBuilder::import_new`]). Returns how many records it wrote.
    ///
    /// # Errors
    /// As [`Store::export`], except for damage to single records.
    #[cfg(feature = "export")]
    pub fn export_past_damage(
        &self,
        out: impl std::io::Write,
        mut damaged: impl FnMut(Error),
    ) -> Result<u64> {
        self.export_with(out, Some(&mut damaged))
    }

    #[cfg(feature = "export")]
    fn export_with(
        &self,
        mut out: impl std::io::Write,
        past_damage: crate::model::report::PastDamage<'_>,
    ) -> Result<u64> {
        use crate::model::listing::RecordStatus;
        let live = Query::all()
            .status(RecordStatus::InProgress)
            .status(RecordStatus::Stale)
            .status(RecordStatus::Orphan)
            .status(RecordStatus::Completed);
        let (mut exported, mut failed) = (0, None);
        dispatch!(&self.engine, e => e.scan_each(&live, past_damage, |moved, _, _| {
            match writeln!(out, "{}", moved.to_line()) {
                Ok(()) => {
                    exported += 1;
                    ControlFlow::Continue(())
                }
                Err(err) => {
                    failed = Some(crate::Error::Io(err));
                    ControlFlow::Break(())
                }
            }
        }))?;
        if let Some(e) = failed {
            return Err(e);
        }
        out.flush().map_err(crate::Error::Io)?;
        Ok(exported)
    }

    /// PostgreSQL stores only: reads the records [`Store::export`] wrote into this store,
    /// which must hold no record: all of them in one transaction, or none. A file store never
    /// imports once open, and answers [`crate::Error::InvalidImport`]: a file is made from an
    /// export with [`crate::StoreBuilder::import_new`]. Fences are kept, and the store's next
    /// fences are larger than every imported one; claims in progress arrive as orphans (their
    /// holders were another store's), which [`Store::reap`] offers at once. Returns how many
    /// records it imported. The input is read a page (1,000 lines) at a time while the page
    /// before is inserted, so memory holds a few pages whatever the export's size.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let file = idemdb::Store::open("payments.idem")?;
    /// let mut lines = Vec::new();
    /// file.export(&mut lines)?;
    /// let shared = idemdb::Store::connect("host=db1 user=idem dbname=payments")?;
    /// shared.import(lines.as_slice())?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Concurrency
    /// Run it before the service uses the new store.
    ///
    /// # Errors
    /// [`crate::Error::InvalidImport`] for a line that is not an exported record (naming the
    /// line), a key twice, a store that is not empty, or a file store; nothing is imported
    /// then. [`crate::Error::Io`] if `input` fails; [`crate::Error::Database`].
    #[cfg(feature = "postgres")]
    pub fn import(&self, input: impl std::io::BufRead) -> Result<u64> {
        match &self.engine {
            Engine::File(_) => Err(crate::Error::InvalidImport {
                line: 0,
                reason: "an open file store does not import: make a new file with \
                         StoreBuilder::import_new, or import into a PostgreSQL store"
                    .into(),
            }),
            Engine::Postgres(pg) => pg.import_lines(input),
        }
    }
}
