//! The PostgreSQL engine: the same store on a database that many replicas share.
//!
//! Every decision is made by the database, in one statement per batch of operations (see
//! `sql.rs` and `docs/postgres.md`): nothing is decided from memory, because another replica
//! may have changed the key. The engine runs its connections on a thread of its own (see
//! `worker.rs`), so blocking callers need no runtime and async callers any executor.

mod direct;
mod plans;
mod schema;
mod sql;
mod transfer;
mod worker;

use crate::clock::{duration_millis, from_millis};
use crate::config::{Config, StalePolicy};
use crate::engine::Tally;
use crate::error::{Damaged, Error, Result};
use crate::model::claim::{Claim, Entry, EntryState, Resolution, StaleClaim, Takeover};
use crate::model::fingerprint::Fingerprint;
use crate::model::response::Response;
use crate::model::scope::{display_scoped_key, scoped_key, scoped_key_parts, Scope};
use crate::model::ticket::{Issued, Issuer, Ticket};
use crate::replay_cache::{Cached, ReplayCache};
use crate::stats::EngineFigures;
use crate::sync::{Arc, AtomicU64, AtomicUsize, Ordering, Weak};
use futures_channel::oneshot;
use std::future::Future;
use std::sync::atomic::AtomicI64;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::mpsc;
use worker::{ClaimParams, ClaimRow, Conn, Held, Job, Pool};

pub(crate) use schema::check_name as check_schema_name;

/// How many stale claims one reap reads at a time, and expired records one purge statement
/// deletes: bounded, so no statement holds many row locks for long.
const CHUNK: i64 = 1000;

/// A key as the table's columns.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) tenant: Vec<u8>,
    pub(crate) endpoint: Vec<u8>,
    pub(crate) key: String,
}

impl Target {
    fn of(scoped: &[u8]) -> Target {
        let (tenant, endpoint, key) =
            scoped_key_parts(scoped).expect("a scoped key made by scoped_key splits");
        Target {
            tenant: tenant.as_bytes().to_vec(),
            endpoint: endpoint.as_bytes().to_vec(),
            key: key.to_owned(),
        }
    }

    /// The key in the first three columns of `row` (tenant, endpoint, key).
    fn from_row(row: &tokio_postgres::Row) -> Result<Target> {
        Ok(Target {
            tenant: row.try_get(0).map_err(db_error)?,
            endpoint: row.try_get(1).map_err(db_error)?,
            key: row.try_get(2).map_err(db_error)?,
        })
    }

    fn scope(&self) -> Scope {
        Scope::new(
            String::from_utf8_lossy(&self.tenant),
            String::from_utf8_lossy(&self.endpoint),
        )
    }
}

/// The store on PostgreSQL; clones share one engine.
#[derive(Clone)]
pub(crate) struct PgStore {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("schema", &self.shared.schema)
            .field("owner", &self.shared.context.params.owner)
            .field("incarnation", &self.shared.context.params.incarnation)
            .finish_non_exhaustive()
    }
}

/// What tickets point to (weakly): the queue to the engine's thread and the settings.
pub(crate) struct Shared {
    jobs: mpsc::UnboundedSender<Job>,
    context: Arc<worker::Context>,
    config: Config,
    schema: String,
    /// Claims withdrawn by their callers (the engine's thread counts its own).
    withdrawn: AtomicU64,
    /// Completed responses this store has replayed, by scoped key.
    replays: ReplayCache<Box<[u8]>>,
    /// The database's clock as last seen: its time minus `started`'s elapsed milliseconds, at
    /// the moment of a statement's answer; [`UNSEEN`] before the first.
    db_offset: AtomicI64,
    started: Instant,
    thread: parking_lot::Mutex<Option<std::thread::JoinHandle<()>>>,
    /// A lone blocking caller's own connection (`direct.rs`).
    direct: parking_lot::Mutex<Option<direct::Lane>>,
}

/// How a caller waits for its job's answer.
#[derive(Clone, Copy)]
enum Caller {
    /// Blocking its thread (it may use the direct lane).
    Blocking,
    /// Awaiting it (always through the queue).
    Async,
}

/// `Shared::db_offset` before any statement answered.
const UNSEEN: i64 = i64::MIN;

/// How far ahead of the database's time (as estimated here) a cached completion's expiry must
/// be for the cache to replay it. The estimate trails the database's clock by up to a round
/// trip and drifts with this machine's clock rate between statements; a second covers both
/// with room to spare, and a replay that is not served from the cache is read from the
/// database, which decides exactly.
const CACHE_MARGIN_MS: i64 = 1000;

impl Drop for Shared {
    fn drop(&mut self) {
        // Closing the queue ends the engine's thread once running batches finished; waiting
        // for it closes the connections before the last `Store` is gone.
        if let Some(lane) = self.direct.get_mut().take() {
            lane.close();
        }
        let (closed, _) = mpsc::unbounded_channel();
        drop(std::mem::replace(&mut self.jobs, closed));
        if let Some(thread) = self.thread.lock().take() {
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

impl Shared {
    fn submit(&self, job: Job) -> Result<()> {
        self.context.queued.fetch_add(1, Ordering::AcqRel);
        self.jobs.send(job).map_err(|_| {
            self.context.queued.fetch_sub(1, Ordering::AcqRel);
            stopped()
        })
    }

    /// Sends `job` for a caller that blocks until it is answered: run on the caller's thread
    /// when the direct lane may take it (`direct.rs`), else through the queue.
    fn submit_blocking(&self, job: Job) -> Result<()> {
        match direct::try_run(&self.context, &self.direct, job) {
            None => Ok(()),
            Some(job) => self.submit(job),
        }
    }

    /// [`Shared::submit`] or [`Shared::submit_blocking`].
    fn send(&self, job: Job, caller: Caller) -> Result<()> {
        match caller {
            Caller::Blocking => self.submit_blocking(job),
            Caller::Async => self.submit(job),
        }
    }

    /// Runs `f` on a pooled connection, in its turn with the batches.
    fn task<T, F, Fut>(&self, f: F) -> oneshot::Receiver<Result<T>>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Conn>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let job = Job::Task(Box::new(move |conn| {
            Box::pin(async move {
                let result = match conn {
                    Ok(conn) => f(conn).await,
                    Err(e) => Err(e),
                };
                let _ = tx.send(result);
            })
        }));
        self.context.queued.fetch_add(1, Ordering::AcqRel);
        if let Err(mpsc::error::SendError(Job::Task(task))) = self.jobs.send(job) {
            self.context.queued.fetch_sub(1, Ordering::AcqRel);
            // The engine stopped: run the task's failure path so the receiver hears why.
            drop(task);
        }
        rx
    }

    fn adjust(&self) -> Option<i64> {
        (self.context.adjust)()
    }

    fn elapsed_ms(&self) -> i64 {
        i64::try_from(self.started.elapsed().as_millis()).unwrap_or(i64::MAX)
    }

    /// Notes the database's time `now`, as a statement just answered it.
    fn saw_database_time(&self, now: i64) {
        self.db_offset
            .store(now.saturating_sub(self.elapsed_ms()), Ordering::Relaxed);
    }

    /// The database's time now, as this store estimates it (an injected test clock's time,
    /// exactly); `None` before any statement answered.
    fn database_time(&self) -> Option<i64> {
        if let Some(test_clock) = self.adjust() {
            return Some(test_clock);
        }
        match self.db_offset.load(Ordering::Relaxed) {
            UNSEEN => None,
            offset => Some(offset.saturating_add(self.elapsed_ms())),
        }
    }
}

impl Issuer for Shared {
    /// The claim becomes an orphan, in the background; if that fails, the claim stays in
    /// progress until its lease ends.
    fn holder_gone(&self, key: &[u8], fence: u64) {
        let _ = self.submit(Job::Abandon {
            fenced: (Target::of(key), fence_column(fence)),
        });
    }
}

/// The engine's thread stopped (it panicked, or the store is being dropped).
fn stopped() -> Error {
    Error::Database {
        sqlstate: None,
        reason: "the PostgreSQL engine's thread has stopped".into(),
    }
}

/// A client library error as ours.
pub(crate) fn db_error(e: tokio_postgres::Error) -> Error {
    let sqlstate = e.code().map(|c| c.code().to_owned());
    let reason = match e.as_db_error() {
        Some(db) => format!("{}: {}", db.severity(), db.message()),
        None => {
            let mut reason = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                reason.push_str(": ");
                reason.push_str(&s.to_string());
                source = s.source();
            }
            reason
        }
    };
    Error::Database { sqlstate, reason }
}

/// The same database error again, for every caller of a failed batch.
pub(crate) fn again(e: &Error) -> Error {
    match e {
        Error::Database { sqlstate, reason } => Error::Database {
            sqlstate: sqlstate.clone(),
            reason: reason.clone(),
        },
        other => Error::Database {
            sqlstate: None,
            reason: other.to_string(),
        },
    }
}

fn fence_column(fence: u64) -> i64 {
    i64::try_from(fence).unwrap_or(i64::MAX)
}

fn fence_of(column: i64) -> u64 {
    u64::try_from(column).unwrap_or_default()
}

fn time_of(ms: i64) -> SystemTime {
    from_millis(u64::try_from(ms).unwrap_or_default())
}

fn millis_column(d: Duration) -> i64 {
    i64::try_from(duration_millis(d)).unwrap_or(i64::MAX)
}

/// The owner name a store gets unless [`crate::StoreBuilder::owner`] names one: unique per
/// process and connect.
fn random_owner() -> String {
    use std::hash::BuildHasher;
    let noise = std::collections::hash_map::RandomState::new().hash_one(Instant::now());
    format!("pid{}-{noise:016x}", std::process::id())
}

/// Connects a store to the database at `url`, creating or checking its schema.
pub(crate) fn connect(mut config: Config, url: &str) -> Result<PgStore> {
    let unsupported = [
        (
            config.max_live_per_tenant.is_some(),
            "max_live_records_per_tenant",
        ),
        (config.max_store_bytes.is_some(), "max_store_bytes"),
    ];
    if let Some((_, name)) = unsupported.iter().find(|(set, _)| *set) {
        return Err(Error::Unsupported {
            what: format!("{name} on PostgreSQL (store files only, for now)"),
        });
    }
    let mut pg: tokio_postgres::Config = url.parse().map_err(|e| Error::Database {
        sqlstate: None,
        reason: format!("invalid connection string: {e}"),
    })?;
    if pg.get_application_name().is_none() {
        pg.application_name("idemdb");
    }
    if pg.get_connect_timeout().is_none() {
        pg.connect_timeout(Duration::from_secs(10));
    }
    // A primary that vanishes without closing its connections (a power cut, a partition)
    // must not hang every batch for the operating system's default of hours: unacknowledged
    // data fails the connection after 30 s, an idle one is probed after 15 s.
    if pg.get_tcp_user_timeout().is_none() {
        pg.tcp_user_timeout(Duration::from_secs(30));
    }
    if pg.get_keepalives_idle() == Duration::from_secs(2 * 60 * 60) {
        pg.keepalives_idle(Duration::from_secs(15));
    }
    let schema = config.schema.clone();
    let owner = config.owner.take().unwrap_or_else(random_owner);
    let (pool_size, batch_limit) = (config.pool_size, config.batch_limit);
    let adjust = clock_adjustment(&config);
    let (jobs, queue) = mpsc::unbounded_channel();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<Arc<worker::Context>>>();
    let params = ClaimParams {
        lease_ms: millis_column(config.lease),
        take_over: config.stale_policy == StalePolicy::TakeOver,
        owner,
        incarnation: 0,
        ttl_ms: millis_column(config.ttl),
    };
    let thread = std::thread::Builder::new()
        .name("idemdb-pg".into())
        .spawn({
            let schema = schema.clone();
            move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = ready_tx.send(Err(Error::Io(e)));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let context =
                        match start(pg, schema, (pool_size, batch_limit), params, adjust).await {
                            Ok(context) => Arc::new(context),
                            Err(e) => {
                                let _ = ready_tx.send(Err(e));
                                return;
                            }
                        };
                    let _ = ready_tx.send(Ok(Arc::clone(&context)));
                    worker::run(context, queue).await;
                });
            }
        })
        .map_err(Error::Io)?;
    let context = match ready_rx.recv() {
        Ok(result) => result?,
        Err(_) => return Err(stopped()),
    };
    Ok(PgStore {
        shared: Arc::new(Shared {
            jobs,
            context,
            replays: ReplayCache::new(config.replay_cache_bytes),
            config,
            schema,
            withdrawn: AtomicU64::new(0),
            db_offset: AtomicI64::new(UNSEEN),
            started: Instant::now(),
            thread: parking_lot::Mutex::new(Some(thread)),
            direct: parking_lot::Mutex::new(None),
        }),
    })
}

/// On the engine's thread: checks the server, migrates the schema, takes an incarnation and
/// opens the first pooled connection.
async fn start(
    pg: tokio_postgres::Config,
    schema: String,
    (pool_size, batch_limit): (usize, usize),
    mut params: ClaimParams,
    adjust: Box<dyn Fn() -> Option<i64> + Send + Sync>,
) -> Result<worker::Context> {
    let (mut client, connection) = pg.connect(tokio_postgres::NoTls).await.map_err(db_error)?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    schema::check_durability(&client).await?;
    schema::make_commits_durable(&client).await?;
    schema::migrate(&mut client, &schema).await?;
    params.incarnation = client
        .query_one(&schema::qualify(sql::INCARNATION, &schema), &[])
        .await
        .map_err(db_error)?
        .get(0);
    drop(client);
    let pool = Pool::new(pg, schema, pool_size);
    pool.warm().await?;
    Ok(worker::Context {
        pool,
        params,
        adjust,
        batch_limit,
        commits: AtomicU64::new(0),
        withdrawn: AtomicU64::new(0),
        queued: AtomicUsize::new(0),
    })
}

/// The time statements use instead of the database's: `None` (the database's clock) unless a
/// clock was injected with [`crate::StoreBuilder::clock`], which is for tests (a
/// [`crate::ManualClock`]); the machine's own clock never counts on PostgreSQL.
fn clock_adjustment(config: &Config) -> Box<dyn Fn() -> Option<i64> + Send + Sync> {
    if !config.clock_injected {
        return Box::new(|| None);
    }
    let clock = Arc::clone(&config.clock);
    Box::new(move || Some(i64::try_from(crate::clock::to_millis(clock.now())).unwrap_or(i64::MAX)))
}

/// Blocks the calling thread until `rx` answers (see [`blocking`]).
fn block<T>(rx: oneshot::Receiver<Result<T>>) -> Result<T> {
    blocking(answer(rx))
}

/// Runs `future` to its end on the calling thread. Inside a multi-threaded tokio runtime the
/// worker thread is handed over first (`block_in_place`), so its other tasks keep running; on
/// a current-thread runtime the thread simply blocks (use the `_async` operations there).
fn blocking<F: Future>(future: F) -> F::Output {
    let wait = move || block_on(future);
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(wait)
        }
        _ => wait(),
    }
}

/// Polls `future` on this thread, parking between wake-ups.
fn block_on<F: Future>(future: F) -> F::Output {
    let waker = crate::sync::thread_waker();
    let mut cx = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}

async fn answer<T>(rx: oneshot::Receiver<Result<T>>) -> Result<T> {
    rx.await.unwrap_or_else(|oneshot::Canceled| Err(stopped()))
}

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
    fn cached(&self, scoped: &[u8], fingerprint: Fingerprint) -> Option<Claim> {
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

    fn withdraw(&self, scoped: &[u8], fence: i64, takeover: bool) {
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
                self.shared.saw_database_time(now);
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

    /// The identity its tickets carry.
    pub(crate) fn issuer(&self) -> *const () {
        Arc::as_ptr(&self.shared).cast()
    }

    /// Nothing halts a PostgreSQL store: each operation reaches the database or fails alone.
    pub(crate) fn check(&self) -> Result<()> {
        Ok(())
    }

    /// The ticket's fenced columns (the seam checked the ticket is this store's).
    fn fenced(ticket: &Ticket) -> (Target, i64) {
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
    fn read(&self, scoped: &[u8]) -> oneshot::Receiver<Result<(i64, Option<Held>)>> {
        let target = Target::of(scoped);
        let adjust = self.shared.adjust();
        let owner = self.shared.context.params.owner.clone();
        let incarnation = self.shared.context.params.incarnation;
        self.shared.task(move |conn| async move {
            let row = conn
                .client
                .query_one(
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
            worker::record_row(&row)
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

    pub(crate) fn lease_duration(&self) -> Duration {
        self.shared.config.lease
    }

    pub(crate) fn figures(&self) -> EngineFigures {
        let shared = &*self.shared;
        EngineFigures {
            withdrawn: shared.withdrawn.load(Ordering::Relaxed)
                + shared.context.withdrawn.load(Ordering::Relaxed),
            commit_batches: shared.context.commits.load(Ordering::Relaxed),
            ..EngineFigures::default()
        }
    }

    pub(crate) fn record_count(&self) -> Result<u64> {
        let text = schema::qualify(sql::COUNT, &self.shared.schema);
        let count = block(self.shared.task(move |conn| async move {
            let row = conn.client.query_one(&text, &[]).await.map_err(db_error)?;
            row.try_get::<_, i64>(0).map_err(db_error)
        }))?;
        Ok(u64::try_from(count).unwrap_or_default())
    }

    pub(crate) fn reap(
        &self,
        mut resolver: impl FnMut(&StaleClaim) -> Result<Resolution>,
    ) -> Tally {
        let mut after = 0i64;
        let mut resolved = 0;
        loop {
            let page = match block(self.stale_page(after)) {
                Ok(page) => page,
                Err(e) => return Tally::failed(e),
            };
            let full = i64::try_from(page.len()).unwrap_or(i64::MAX) >= CHUNK;
            for stale in page {
                after = stale.fence;
                let decision = match resolver(&stale.claim()) {
                    Ok(decision) => decision,
                    Err(e) => return Tally::of(resolved, Err(e)),
                };
                match block(self.resolve_stale(stale, decision)) {
                    Ok(true) => resolved += 1,
                    Ok(false) => {}
                    Err(e) => return Tally::failed(e),
                }
            }
            if !full {
                break;
            }
        }
        Tally::of(resolved, Ok(()))
    }

    /// Resolves the stale claim of `key` with `fence`, if it is one: see
    /// [`crate::Store::resolve`]. The record is read first (is it that stale claim?), then
    /// resolved only if its lease is still the one read.
    pub(crate) fn resolve(
        &self,
        scope: &Scope,
        key: &str,
        fence: u64,
        resolution: Resolution,
    ) -> Result<bool> {
        let scoped = scoped_key(scope, key)?;
        if resolution == Resolution::Keep {
            return Ok(false);
        }
        let (now, held) = block(self.read(&scoped))?;
        let Some(record) = held else {
            return Ok(false);
        };
        let lease_until = record.lease_until.unwrap_or(now);
        let stale = !record.completed && (record.orphan || lease_until <= now);
        if record.fence != fence_column(fence) || !stale {
            return Ok(false);
        }
        let stale = Stale {
            fingerprint: fingerprint_of(&scoped, &record)?,
            target: Target::of(&scoped),
            fence: record.fence,
            claimed_at: record.claimed_at,
            lease_until,
            orphan: record.orphan,
        };
        block(self.resolve_stale(stale, resolution))
    }

    fn stale_page(&self, after: i64) -> oneshot::Receiver<Result<Vec<Stale>>> {
        let text = schema::qualify(sql::STALE, &self.shared.schema);
        let adjust = self.shared.adjust();
        let owner = self.shared.context.params.owner.clone();
        let incarnation = self.shared.context.params.incarnation;
        self.shared.task(move |conn| async move {
            let rows = conn
                .client
                .query(&text, &[&adjust, &owner, &incarnation, &CHUNK, &after])
                .await
                .map_err(db_error)?;
            rows.iter()
                .map(|r| {
                    let target = Target::from_row(r)?;
                    let fingerprint: Vec<u8> = r.try_get(4).map_err(db_error)?;
                    let fingerprint = <[u8; 32]>::try_from(fingerprint.as_slice())
                        .map(Fingerprint::from_bytes)
                        .map_err(|_| Error::Corrupted {
                            damaged: Damaged::Record {
                                fence: None,
                                key: Some(target.key.clone()),
                            },
                            reason: "a stored fingerprint is not 32 bytes".into(),
                        })?;
                    Ok(Stale {
                        target,
                        fence: r.try_get(3).map_err(db_error)?,
                        fingerprint,
                        claimed_at: r.try_get(5).map_err(db_error)?,
                        lease_until: r.try_get(6).map_err(db_error)?,
                        orphan: r
                            .try_get::<_, Option<bool>>(7)
                            .map_err(db_error)?
                            .unwrap_or_default(),
                    })
                })
                .collect()
        })
    }

    /// Applies a reap's decision to the claim as the resolver saw it; `false` if it changed
    /// meanwhile (left as it is).
    fn resolve_stale(&self, stale: Stale, decision: Resolution) -> oneshot::Receiver<Result<bool>> {
        let schema = self.shared.schema.clone();
        let adjust = self.shared.adjust();
        let ttl = self.shared.context.params.ttl_ms;
        self.shared.task(move |conn| async move {
            let t = &stale.target;
            let changed = match decision {
                Resolution::Keep => 0,
                Resolution::Release => conn
                    .client
                    .execute(
                        &schema::qualify(sql::REAP_RELEASE, &schema),
                        &[
                            &t.tenant,
                            &t.endpoint,
                            &t.key,
                            &stale.fence,
                            &stale.lease_until,
                        ],
                    )
                    .await
                    .map_err(db_error)?,
                Resolution::Complete(response) => conn
                    .client
                    .execute(
                        &schema::qualify(sql::REAP_COMPLETE, &schema),
                        &[
                            &adjust,
                            &t.tenant,
                            &t.endpoint,
                            &t.key,
                            &stale.fence,
                            &stale.lease_until,
                            &i32::from(response.status),
                            &encode_headers(&response.headers),
                            &response.body,
                            &ttl,
                        ],
                    )
                    .await
                    .map_err(db_error)?,
            };
            Ok(changed == 1)
        })
    }

    pub(crate) fn purge_expired(&self) -> Tally {
        let mut purged = 0;
        loop {
            let text = schema::qualify(sql::PURGE, &self.shared.schema);
            let adjust = self.shared.adjust();
            let deleted = block(self.shared.task(move |conn| async move {
                conn.client
                    .execute(&text, &[&adjust, &CHUNK])
                    .await
                    .map_err(db_error)
            }));
            let n = match deleted {
                Ok(n) => n,
                Err(e) => return Tally::failed(e),
            };
            purged += usize::try_from(n).unwrap_or(usize::MAX);
            if i64::try_from(n).unwrap_or(i64::MAX) < CHUNK {
                return Tally::of(purged, Ok(()));
            }
        }
    }

    /// Whether a claim of `scoped` would not answer `InProgress` now, and if not, how long
    /// until its lease ends.
    fn look(&self, now: i64, held: Option<&Held>) -> Option<Duration> {
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

    /// The pause before looking again: short at first, growing, never past the lease's end or
    /// the deadline.
    fn poll_pause(round: u32, until_lease_end: Duration, deadline: Instant) -> Instant {
        let pause = Duration::from_millis(5u64 << round.min(5)).min(until_lease_end);
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
            for round in 0.. {
                let (now, held) = answer(self.read(&scoped)).await?;
                let Some(left) = self.look(now, held.as_ref()) else {
                    return Ok(true);
                };
                if Instant::now() >= deadline {
                    return Ok(false);
                }
                crate::timer::sleep_until(Self::poll_pause(round, left, deadline)).await;
            }
            unreachable!("the loop above only returns")
        }
    }
}

/// A stale claim as a reap reads it.
struct Stale {
    target: Target,
    fence: i64,
    fingerprint: Fingerprint,
    claimed_at: i64,
    lease_until: i64,
    orphan: bool,
}

impl Stale {
    /// The claim as a resolver sees it.
    fn claim(&self) -> StaleClaim {
        StaleClaim {
            scope: self.target.scope(),
            key: self.target.key.clone(),
            fence: fence_of(self.fence),
            fingerprint: self.fingerprint,
            claimed_at: time_of(self.claimed_at),
            lease_deadline: time_of(self.lease_until),
            orphan: self.orphan,
        }
    }
}

type HeaderList = Vec<(String, Vec<u8>)>;

fn header_config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<{ crate::model::response::MAX_RESPONSE_LIMIT }>()
}

fn encode_headers(headers: &HeaderList) -> Vec<u8> {
    bincode::encode_to_vec(headers, header_config()).expect("encoding into a Vec cannot fail")
}

fn damaged(scoped: &[u8], record: &Held, reason: impl Into<String>) -> Error {
    Error::Corrupted {
        damaged: Damaged::Record {
            fence: Some(fence_of(record.fence)),
            key: Some(display_scoped_key(scoped)),
        },
        reason: reason.into(),
    }
}

fn response_of(scoped: &[u8], record: &Held) -> Result<Response> {
    let status = record
        .status
        .and_then(|s| u16::try_from(s).ok())
        .ok_or_else(|| damaged(scoped, record, "a completed record has no valid status"))?;
    let headers: HeaderList = match &record.headers {
        Some(bytes) => {
            let (headers, used) = bincode::decode_from_slice(bytes, header_config())
                .map_err(|e| damaged(scoped, record, format!("its headers do not decode: {e}")))?;
            if used != bytes.len() {
                return Err(damaged(scoped, record, "its headers have trailing bytes"));
            }
            headers
        }
        None => return Err(damaged(scoped, record, "a completed record has no headers")),
    };
    Ok(Response {
        status,
        headers,
        body: record.body.clone().unwrap_or_default(),
    })
}

fn fingerprint_of(scoped: &[u8], record: &Held) -> Result<Fingerprint> {
    <[u8; 32]>::try_from(record.fingerprint.as_slice())
        .map(Fingerprint::from_bytes)
        .map_err(|_| damaged(scoped, record, "its fingerprint is not 32 bytes"))
}
