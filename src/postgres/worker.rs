//! The engine's own thread: a single-threaded tokio runtime that owns the connections, takes
//! jobs from a queue any thread (with or without a runtime of its own) can feed, and turns the
//! jobs that queued up meanwhile into one statement per kind (group commit).
//!
//! One batch runs on one connection; up to `pool_size` batches run at once. A batch is taken
//! from the queue only once a connection is free, and a second one while another runs only
//! when enough jobs wait for it ([`MIN_CONCURRENT_BATCH`]), so while the connections are busy
//! the queue grows into the next batch: the busier the database, the larger the batches.
//!
//! The statements of one batch (claims, completions, releases, ...) are sent together and run
//! as one pipeline on the connection; each is its own transaction, committed before its callers
//! are answered.

use super::sql;
use super::{again, db_error, Target};
use crate::error::{Error, Result};
use crate::sync::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use futures_channel::oneshot;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::{mpsc, Mutex as AsyncMutex, OwnedSemaphorePermit, Semaphore};
use tokio_postgres::error::{Severity, SqlState};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls, Row, Statement};

/// How many times a batch looks again for a claim whose key another session wrote after the
/// statement's snapshot (see [`sql::CLAIM`]) before giving up with an error.
const MAX_CLAIM_ROUNDS: usize = 64;

/// The fewest jobs that start a batch while another batch runs. Fewer wait for the running
/// batches to end (more join them meanwhile): every statement costs the server a fixed share of
/// CPU, so small batches side by side spend it several times where one batch would spend it
/// once. A lone job with nothing running starts at once. Measured with `compare/` (100,000
/// keys, 4 processes of 16 callers, claim + complete): from 1 (any free connection starts a
/// batch) to 16, the CPU per request fell from about 350 to about 210 µs and requests/s rose
/// from about 5,000 to 7,900; with 64 callers in one process claims stayed at about 21,000/s.
const MIN_CONCURRENT_BATCH: usize = 16;

/// How long jobs wait for a running batch to end before they start one of their own anyway:
/// a statement stuck behind a row lock (another session's open transaction) delays the rest
/// of the store by this much, not until the lock goes. Under load a batch takes a few
/// milliseconds.
const MAX_WAIT_FOR_RUNNING: std::time::Duration = std::time::Duration::from_millis(10);

/// A reply channel for one job.
pub(crate) type Reply<T> = oneshot::Sender<Result<T>>;

/// A key's columns.
pub(crate) type Fenced = (Target, i64);

/// A task that runs on a pooled connection (reads, reaps, purges).
pub(crate) type Task =
    Box<dyn FnOnce(Result<Arc<Conn>>) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// Work for the engine's thread.
pub(crate) enum Job {
    Claim {
        target: Target,
        fingerprint: [u8; 32],
        reply: Reply<ClaimRow>,
    },
    Complete {
        fenced: Fenced,
        status: i32,
        headers: Vec<u8>,
        body: Vec<u8>,
        reply: Reply<Option<i64>>,
    },
    /// A release (with a reply) or a withdrawn fresh claim (without).
    Release {
        fenced: Fenced,
        reply: Option<Reply<bool>>,
    },
    /// An extension (with a reply), or a withdrawn takeover whose lease ends now (`by` zero,
    /// `orphan`, no reply).
    Extend {
        fenced: Fenced,
        by: i64,
        orphan: bool,
        reply: Option<Reply<Option<i64>>>,
    },
    /// A ticket dropped unspent: its claim is an orphan now.
    Abandon {
        fenced: Fenced,
    },
    /// Every job queued before it, and what its batch does about it (a withdrawal), lands
    /// before any job queued after it runs: sent when a claim's caller went away before its
    /// reply came, so that the caller's next operation sees the claim withdrawn.
    Barrier,
    Task(Task),
}

/// What one claim statement returned for one key.
#[derive(Debug)]
pub(crate) enum ClaimRow {
    /// This claim took the key.
    Won {
        fence: i64,
        claimed_at: i64,
        lease_until: i64,
        /// The in-progress claim it took over: (fence, claimed_at, orphan).
        replaced: Option<(i64, i64, bool)>,
    },
    /// Another claim or a completion holds the key: the record as the statement saw it.
    Held { now: i64, record: Held },
}

/// A record another claim holds, as a claim statement or a read saw it.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub(crate) fence: i64,
    pub(crate) fingerprint: Vec<u8>,
    pub(crate) claimed_at: i64,
    pub(crate) completed: bool,
    pub(crate) lease_until: Option<i64>,
    pub(crate) expires_at: Option<i64>,
    pub(crate) orphan: bool,
    pub(crate) status: Option<i32>,
    pub(crate) headers: Option<Vec<u8>>,
    pub(crate) body: Option<Vec<u8>>,
}

/// Settings every claim statement carries.
#[derive(Debug, Clone)]
pub(crate) struct ClaimParams {
    pub(crate) lease_ms: i64,
    pub(crate) take_over: bool,
    pub(crate) owner: String,
    pub(crate) incarnation: i64,
    pub(crate) ttl_ms: i64,
}

/// One connection with its prepared statements.
pub(crate) struct Conn {
    pub(crate) client: Client,
    /// Set when a statement failed in a way that ends the session (see [`Conn::usable`]).
    retired: AtomicBool,
    pub(crate) claim: Statement,
    pub(crate) claim_one: Statement,
    pub(crate) claim_new: Statement,
    pub(crate) complete: Statement,
    pub(crate) complete_one: Statement,
    pub(crate) release: Statement,
    pub(crate) extend: Statement,
    pub(crate) abandon: Statement,
    pub(crate) get: Statement,
    pub(crate) held: Statement,
}

impl Conn {
    /// Whether the connection may take another statement. A server that ends a session sends a
    /// `FATAL` error, then closes the socket; the client sees it closed only once its
    /// connection task has read that close, which may be after the next statement was sent on
    /// it, failing that statement too. So a `FATAL` (or `PANIC`) answer retires the connection
    /// at once (`tests/postgres_promises.rs`: after a terminated session, one failed claim, then
    /// a new connection).
    pub(crate) fn usable(&self) -> bool {
        !self.retired.load(Ordering::Relaxed) && !self.client.is_closed()
    }

    /// Notes a statement's failure: one that ends the session retires the connection.
    fn failed(&self, e: &tokio_postgres::Error) {
        let fatal = e.as_db_error().is_some_and(|db| {
            matches!(
                db.parsed_severity(),
                Some(Severity::Fatal | Severity::Panic)
            )
        });
        if fatal || e.is_closed() {
            self.retired.store(true, Ordering::Relaxed);
        }
    }

    /// Connects and prepares every hot statement (in one pipeline).
    pub(crate) async fn open(config: &tokio_postgres::Config, schema: &str) -> Result<Conn> {
        let (client, connection) = config.connect(NoTls).await.map_err(db_error)?;
        tokio::spawn(async move {
            // Ends when the client is dropped or the server goes away; the next use of the
            // client reports the error.
            let _ = connection.await;
        });
        // Checked again on every connection: a reconnect may reach another server (a
        // failover through a multi-host URL).
        super::schema::check_durability(&client).await?;
        super::schema::make_commits_durable(&client).await?;
        super::plans::fix_plans(&client).await?;
        let texts = [
            sql::CLAIM,
            sql::CLAIM_ONE,
            sql::CLAIM_NEW,
            sql::COMPLETE,
            sql::COMPLETE_ONE,
            sql::RELEASE,
            sql::EXTEND,
            sql::ABANDON,
            sql::GET,
            sql::HELD,
        ]
        .map(|text| super::schema::qualify(text, schema));
        let prepared = futures_util::future::try_join_all(texts.iter().map(|t| client.prepare(t)))
            .await
            .map_err(db_error)?;
        let [claim, claim_one, claim_new, complete, complete_one, release, extend, abandon, get, held] =
            <[Statement; 10]>::try_from(prepared).expect("one statement per text");
        Ok(Conn {
            client,
            retired: AtomicBool::new(false),
            claim,
            claim_one,
            claim_new,
            complete,
            complete_one,
            release,
            extend,
            abandon,
            get,
            held,
        })
    }
}

/// The connections: at most `size` in use, reconnected when one is found closed.
pub(crate) struct Pool {
    config: tokio_postgres::Config,
    schema: String,
    permits: Arc<Semaphore>,
    idle: AsyncMutex<Vec<Arc<Conn>>>,
}

impl Pool {
    pub(crate) fn new(config: tokio_postgres::Config, schema: String, size: usize) -> Pool {
        Pool {
            config,
            schema,
            permits: Arc::new(Semaphore::new(size)),
            idle: AsyncMutex::new(Vec::new()),
        }
    }

    async fn permit(&self) -> OwnedSemaphorePermit {
        Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .expect("the pool's semaphore is never closed")
    }

    /// An open connection for the holder of a permit.
    async fn take(&self) -> Result<Arc<Conn>> {
        while let Some(conn) = self.idle.lock().await.pop() {
            if conn.usable() {
                return Ok(conn);
            }
        }
        Ok(Arc::new(Conn::open(&self.config, &self.schema).await?))
    }

    /// A new connection, outside the pool's count (the direct lane's).
    pub(crate) async fn connect(&self) -> Result<Conn> {
        Conn::open(&self.config, &self.schema).await
    }

    /// Opens one connection now, so that a store that connected can reach its database.
    pub(crate) async fn warm(&self) -> Result<()> {
        let conn = Arc::new(Conn::open(&self.config, &self.schema).await?);
        self.give_back(conn).await;
        Ok(())
    }

    async fn give_back(&self, conn: Arc<Conn>) {
        if conn.usable() {
            self.idle.lock().await.push(conn);
        }
    }
}

/// What the engine's thread shares with the store.
pub(crate) struct Context {
    pub(crate) pool: Pool,
    pub(crate) params: ClaimParams,
    /// The time of a clock injected for tests, in milliseconds; `None`: the database's.
    pub(crate) adjust: Box<dyn Fn() -> Option<i64> + Send + Sync>,
    /// Write statements committed.
    pub(crate) commits: AtomicU64,
    /// The most jobs taken into one batch (so at most that many of one kind share a
    /// statement).
    pub(crate) batch_limit: usize,
    /// Claims withdrawn here because their reply found nobody to receive it.
    pub(crate) withdrawn: AtomicU64,
    /// Jobs sent to the engine's thread whose batch has not ended: while any are, every
    /// operation goes through the queue (see [`super::direct`]).
    pub(crate) queued: AtomicUsize,
}

/// Runs until every sender of `jobs` is gone, then lets running batches finish.
pub(crate) async fn run(context: Arc<Context>, mut jobs: mpsc::UnboundedReceiver<Job>) {
    let mut running = tokio::task::JoinSet::new();
    loop {
        let permit = context.pool.permit().await;
        let Some(first) = jobs.recv().await else {
            break;
        };
        let mut batch = vec![first];
        while batch.len() < context.batch_limit {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        // A second batch at once only when enough work waits for one (see
        // `MIN_CONCURRENT_BATCH`); otherwise the jobs wait for the running batches to end, and
        // more join them meanwhile.
        let enough = MIN_CONCURRENT_BATCH.min(context.batch_limit);
        if !running.is_empty() && batch.len() < enough {
            // One timer for the whole wait, not one per job that joins meanwhile.
            let patience = tokio::time::sleep(MAX_WAIT_FOR_RUNNING);
            tokio::pin!(patience);
            while !running.is_empty() && batch.len() < enough {
                tokio::select! {
                    biased;
                    _ = running.join_next() => {}
                    job = jobs.recv() => match job {
                        Some(job) => batch.push(job),
                        None => break,
                    },
                    () = &mut patience => break,
                }
            }
        }
        // A job nobody waits for (a dropped ticket's orphan mark, a withdrawal) must land
        // before any job queued after it runs, as its caller's next operation expects: such a
        // batch (rare) is run to its end before the next one starts.
        if batch.iter().any(|job| matches!(job, Job::Barrier)) {
            while running.join_next().await.is_some() {}
        }
        let unawaited = batch.iter().any(|job| {
            matches!(
                job,
                Job::Abandon { .. }
                    | Job::Release { reply: None, .. }
                    | Job::Extend { reply: None, .. }
                    | Job::Barrier
            )
        });
        if unawaited {
            run_batch(&context, batch).await;
            drop(permit);
            continue;
        }
        let context = Arc::clone(&context);
        running.spawn(async move {
            run_batch(&context, batch).await;
            drop(permit);
        });
        while running.try_join_next().is_some() {}
    }
    while running.join_next().await.is_some() {}
}

/// A completion: key and fence, status, encoded headers, body.
type CompleteItem = (Fenced, i32, Vec<u8>, Vec<u8>, Reply<Option<i64>>);
/// An extension: key and fence, by (ms), orphan.
type ExtendItem = (Fenced, i64, bool, Option<Reply<Option<i64>>>);

/// The jobs of one batch, by kind.
#[derive(Default)]
pub(crate) struct Sorted {
    claims: Vec<(Target, [u8; 32], Reply<ClaimRow>)>,
    completes: Vec<CompleteItem>,
    releases: Vec<(Fenced, Option<Reply<bool>>)>,
    extends: Vec<ExtendItem>,
    abandons: Vec<Fenced>,
    tasks: Vec<Task>,
}

async fn run_batch(context: &Context, batch: Vec<Job>) {
    let jobs = batch.len();
    let sorted = Sorted::of(batch);
    let conn = context.pool.take().await;
    let given = conn.as_ref().ok().map(Arc::clone);
    run_sorted(context, conn, sorted).await;
    if let Some(conn) = given {
        context.pool.give_back(conn).await;
    }
    context.queued.fetch_sub(jobs, Ordering::Release);
}

impl Sorted {
    pub(crate) fn of(batch: Vec<Job>) -> Sorted {
        let mut sorted = Sorted::default();
        for job in batch {
            match job {
                Job::Claim {
                    target,
                    fingerprint,
                    reply,
                } => sorted.claims.push((target, fingerprint, reply)),
                Job::Complete {
                    fenced,
                    status,
                    headers,
                    body,
                    reply,
                } => sorted
                    .completes
                    .push((fenced, status, headers, body, reply)),
                Job::Release { fenced, reply } => sorted.releases.push((fenced, reply)),
                Job::Extend {
                    fenced,
                    by,
                    orphan,
                    reply,
                } => sorted.extends.push((fenced, by, orphan, reply)),
                Job::Abandon { fenced } => sorted.abandons.push(fenced),
                Job::Barrier => {}
                Job::Task(task) => sorted.tasks.push(task),
            }
        }
        sorted
    }
}

/// Runs the jobs of a batch on `conn` (or answers them all with the error that kept it from
/// opening).
pub(crate) async fn run_sorted(context: &Context, conn: Result<Arc<Conn>>, mut sorted: Sorted) {
    let tasks = std::mem::take(&mut sorted.tasks);
    let conn = match conn {
        Ok(conn) => conn,
        Err(e) => {
            for task in tasks {
                task(Err(again(&e))).await;
            }
            return fail_all(sorted, &e);
        }
    };
    // Sent in this order on the connection's pipeline: what ends or marks claims first, so
    // that the batch's claims see it.
    tokio::join!(
        biased;
        abandons(&conn, sorted.abandons),
        releases(context, &conn, sorted.releases),
        completes(context, &conn, sorted.completes),
        extends(context, &conn, sorted.extends),
        claims(context, &conn, sorted.claims),
        async {
            for task in tasks {
                task(Ok(Arc::clone(&conn))).await;
            }
        },
    );
}

/// Answers every job of a batch that could not get a connection.
fn fail_all(sorted: Sorted, e: &Error) {
    for (_, _, reply) in sorted.claims {
        let _ = reply.send(Err(again(e)));
    }
    for (.., reply) in sorted.completes {
        let _ = reply.send(Err(again(e)));
    }
    for (_, reply) in sorted.releases {
        if let Some(reply) = reply {
            let _ = reply.send(Err(again(e)));
        }
    }
    for (.., reply) in sorted.extends {
        if let Some(reply) = reply {
            let _ = reply.send(Err(again(e)));
        }
    }
}

/// Takes from `pending` the jobs of the next statement: the first of each key, in key order;
/// the rest stay for a later statement (one statement may not change a row twice). The sort
/// is stable, so a key's jobs keep their queue order, and it puts duplicates side by side:
/// no set of keys is built.
fn next_round<T>(pending: &mut Vec<T>, target: impl Fn(&T) -> &Target) -> Vec<T> {
    pending.sort_by(|a, b| by_key(target(a), target(b)));
    let mut round: Vec<T> = Vec::with_capacity(pending.len());
    let mut later = Vec::new();
    for item in pending.drain(..) {
        if round
            .last()
            .is_some_and(|first| by_key(target(first), target(&item)).is_eq())
        {
            later.push(item);
        } else {
            round.push(item);
        }
    }
    *pending = later;
    round
}

/// One order for the keys of every batch: batches that lock rows in a common order deadlock
/// less (and a deadlock, which undoes the statement, is retried).
fn by_key(a: &Target, b: &Target) -> std::cmp::Ordering {
    key_of(a).cmp(&key_of(b))
}

/// A key's columns as [`by_key`] orders them, borrowed.
type KeyRef<'a> = (&'a [u8], &'a [u8], &'a [u8]);

fn key_of(t: &Target) -> KeyRef<'_> {
    (&t.tenant, &t.endpoint, t.key.as_bytes())
}

/// The key columns of a batch, as arrays.
fn columns<'a>(
    targets: impl Iterator<Item = &'a Target>,
) -> (Vec<&'a [u8]>, Vec<&'a [u8]>, Vec<&'a str>) {
    let mut out = (Vec::new(), Vec::new(), Vec::new());
    for t in targets {
        out.0.push(t.tenant.as_slice());
        out.1.push(t.endpoint.as_slice());
        out.2.push(t.key.as_str());
    }
    out
}

async fn claims(
    context: &Context,
    conn: &Conn,
    mut pending: Vec<(Target, [u8; 32], Reply<ClaimRow>)>,
) {
    let p = &context.params;
    for round_number in 0..MAX_CLAIM_ROUNDS {
        if pending.is_empty() {
            return;
        }
        let round = next_round(&mut pending, |c| &c.0);
        let answers = match decide_round(context, conn, &round, round_number == 0).await {
            Ok(answers) => answers,
            Err(e) => {
                for (.., reply) in round.into_iter().chain(pending) {
                    let _ = reply.send(Err(again(&e)));
                }
                return;
            }
        };
        // What each decided key now holds, for the claims of the same key this statement
        // could not take (one statement changes a row once); only kept when there are some.
        let duplicates = !pending.is_empty();
        let mut decided: HashMap<KeyColumns, (i64, Held)> = HashMap::new();
        for ((target, fingerprint, reply), answer) in round.into_iter().zip(answers) {
            match answer {
                Ok(Some(answer)) if settled(&answer, &fingerprint, p.take_over) => {
                    let holds = duplicates.then(|| holding(&answer, &fingerprint));
                    match reply.send(Ok(answer)) {
                        Ok(()) => {
                            if let Some(holds) = holds {
                                decided.insert(key_columns(&target), holds);
                            }
                        }
                        Err(Ok(ClaimRow::Won {
                            fence, replaced, ..
                        })) => {
                            // Nobody is left to receive this claim (its future was dropped):
                            // it cannot have started a side effect, so it must not hold the
                            // key.
                            withdraw(context, conn, &target, fence, replaced.is_some()).await;
                        }
                        Err(_) => {}
                    }
                }
                Ok(_) => pending.push((target, fingerprint, reply)),
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            }
        }
        // A duplicate of a decided key is answered by what the key holds after this
        // statement, as if it came right after it: a retry storm on one key costs one
        // statement, not one per duplicate.
        pending.retain_mut(|(target, fingerprint, reply)| {
            let Some((now, record)) = decided.get(&key_columns(target)) else {
                return true;
            };
            let answer = ClaimRow::Held {
                now: *now,
                record: record.clone(),
            };
            // A record this claim would take (stale, with its fingerprint): a statement must.
            if !settled(&answer, fingerprint, p.take_over) {
                return true;
            }
            let (closed, _) = oneshot::channel();
            let _ = std::mem::replace(reply, closed).send(Ok(answer));
            false
        });
    }
    for (.., reply) in pending {
        let _ = reply.send(Err(Error::Database {
            sqlstate: None,
            reason: format!("a claim did not settle after {MAX_CLAIM_ROUNDS} statements"),
        }));
    }
}

/// Claims the distinct keys of `round` (sorted by key) with one statement, then reads the
/// records of the keys it did not take with a second, read-only one. One answer per key, in
/// `round`'s order: `Ok(None)` when the key must be claimed again (its record is gone or
/// claimable by the time it was read). `Err` only if the claim statement failed: a failed
/// read fails the keys it was for, never the claims that were won.
///
/// A lone key's `first` round only inserts ([`sql::CLAIM_NEW`]): a record it finds is read,
/// and if that record is claimable the key is claimed by the next round's full statement.
async fn decide_round(
    context: &Context,
    conn: &Conn,
    round: &[(Target, [u8; 32], Reply<ClaimRow>)],
    first: bool,
) -> Result<Vec<Result<Option<ClaimRow>>>> {
    let p = &context.params;
    let adjust = (context.adjust)();
    let new = first && round.len() == 1;
    let won = if let [(target, fingerprint, _)] = round {
        let fingerprint = fingerprint.as_slice();
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![
            &adjust,
            &target.tenant,
            &target.endpoint,
            &target.key,
            &fingerprint,
            &p.lease_ms,
        ];
        // `CLAIM_NEW` never takes over: it has no `$7` flag.
        let statement = if new {
            &conn.claim_new
        } else {
            params.push(&p.take_over);
            &conn.claim_one
        };
        params.extend([&p.owner as &(dyn ToSql + Sync), &p.incarnation]);
        query(conn, statement, &params).await
    } else {
        let (tenants, endpoints, keys) = columns(round.iter().map(|c| &c.0));
        let fingerprints: Vec<&[u8]> = round.iter().map(|c| c.1.as_slice()).collect();
        query(
            conn,
            &conn.claim,
            &[
                &adjust,
                &tenants,
                &endpoints,
                &keys,
                &fingerprints,
                &p.lease_ms,
                &p.take_over,
                &p.owner,
                &p.incarnation,
            ],
        )
        .await
    }
    .map_err(db_error)?;
    if !won.is_empty() {
        context.commits.fetch_add(1, Ordering::Relaxed);
    }
    let mut answers: Vec<Result<Option<ClaimRow>>> = round.iter().map(|_| Ok(None)).collect();
    for row in &won {
        let found = if new {
            new_row(row, p.lease_ms).map(|won| (0, won))
        } else {
            won_row(row).and_then(|(key, won)| {
                let at = round
                    .binary_search_by(|c| key_of(&c.0).cmp(&key))
                    .map_err(|_| Error::Database {
                        sqlstate: None,
                        reason: "a claim statement returned a key it was not given".into(),
                    })?;
                Ok((at, won))
            })
        };
        match found {
            Ok((at, won)) => answers[at] = Ok(Some(won)),
            // A row that cannot be read: its claim stays in progress until its lease ends,
            // as after a crash; the key is not claimed again by this batch.
            Err(e) => {
                for answer in answers.iter_mut().filter(|a| matches!(a, Ok(None))) {
                    *answer = Err(again(&e));
                }
                return Ok(answers);
            }
        }
    }
    let unanswered: Vec<usize> = (0..round.len())
        .filter(|&i| matches!(answers[i], Ok(None)))
        .collect();
    if unanswered.is_empty() {
        return Ok(answers);
    }
    let read = if let [only] = unanswered.as_slice() {
        let target = &round[*only].0;
        query(
            conn,
            &conn.get,
            &[
                &adjust,
                &target.tenant,
                &target.endpoint,
                &target.key,
                &p.owner,
                &p.incarnation,
            ],
        )
        .await
    } else {
        let (tenants, endpoints, keys) = columns(unanswered.iter().map(|&i| &round[i].0));
        query(
            conn,
            &conn.held,
            &[
                &adjust,
                &tenants,
                &endpoints,
                &keys,
                &p.owner,
                &p.incarnation,
            ],
        )
        .await
    };
    let rows = match read {
        Ok(rows) if rows.len() == unanswered.len() => Ok(rows),
        Ok(rows) => Err(Error::Database {
            sqlstate: None,
            reason: format!(
                "a read of {} keys returned {} rows",
                unanswered.len(),
                rows.len()
            ),
        }),
        Err(e) => Err(db_error(e)),
    };
    match rows {
        Ok(rows) => {
            for (i, row) in unanswered.into_iter().zip(&rows) {
                answers[i] = record_row(row)
                    .map(|(now, held)| held.map(|record| ClaimRow::Held { now, record }));
            }
        }
        Err(e) => {
            for i in unanswered {
                answers[i] = Err(again(&e));
            }
        }
    }
    Ok(answers)
}

/// A key's identity in a batch.
type KeyColumns = (Vec<u8>, Vec<u8>, String);

fn key_columns(t: &Target) -> KeyColumns {
    (t.tenant.clone(), t.endpoint.clone(), t.key.clone())
}

/// What a key holds after a claim statement answered `answer` for it, with the time it was
/// decided at: the won claim (in progress, by `fingerprint`) or the record that answered.
fn holding(answer: &ClaimRow, fingerprint: &[u8; 32]) -> (i64, Held) {
    match answer {
        ClaimRow::Won {
            fence,
            claimed_at,
            lease_until,
            ..
        } => (
            *claimed_at,
            Held {
                fence: *fence,
                fingerprint: fingerprint.to_vec(),
                claimed_at: *claimed_at,
                completed: false,
                lease_until: Some(*lease_until),
                expires_at: None,
                orphan: false,
                status: None,
                headers: None,
                body: None,
            },
        ),
        ClaimRow::Held { now, record } => (*now, record.clone()),
    }
}

/// Whether a claim's answer stands. A record read after the claim statement that the claim
/// would take (gone, expired, or stale with the same fingerprint under the take-over policy)
/// changed after the statement's snapshot: the key is claimed again by a next statement.
fn settled(answer: &ClaimRow, fingerprint: &[u8; 32], take_over: bool) -> bool {
    let ClaimRow::Held { now, record } = answer else {
        return true;
    };
    if record.completed {
        return record.expires_at.is_some_and(|at| at > *now);
    }
    let stale = record.lease_until.is_none_or(|until| until <= *now);
    !(take_over && stale && record.fingerprint.as_slice() == fingerprint.as_slice())
}

/// Reads one row of [`sql::CLAIM`]: the key it took (borrowed from the row: no copy per
/// claim) and the claim.
fn won_row(row: &Row) -> Result<(KeyRef<'_>, ClaimRow)> {
    let get = |e: tokio_postgres::Error| db_error(e);
    let key = (
        row.try_get::<_, &[u8]>(0).map_err(get)?,
        row.try_get::<_, &[u8]>(1).map_err(get)?,
        row.try_get::<_, &str>(2).map_err(get)?.as_bytes(),
    );
    let replaced = match row.try_get::<_, Option<bool>>(9).map_err(get)? {
        Some(true) => Some((
            row.try_get::<_, Option<i64>>(6)
                .map_err(get)?
                .unwrap_or_default(),
            row.try_get::<_, Option<i64>>(7)
                .map_err(get)?
                .unwrap_or_default(),
            row.try_get::<_, Option<bool>>(8)
                .map_err(get)?
                .unwrap_or_default(),
        )),
        _ => None,
    };
    Ok((
        key,
        ClaimRow::Won {
            fence: row.try_get(3).map_err(get)?,
            claimed_at: row.try_get(4).map_err(get)?,
            lease_until: row.try_get(5).map_err(get)?,
            replaced,
        },
    ))
}

/// Reads the row of [`sql::CLAIM_NEW`]: a fresh claim, its lease `lease_ms` long.
fn new_row(row: &Row, lease_ms: i64) -> Result<ClaimRow> {
    let fence = row.try_get(0).map_err(db_error)?;
    let claimed_at: i64 = row.try_get(1).map_err(db_error)?;
    Ok(ClaimRow::Won {
        fence,
        claimed_at,
        lease_until: claimed_at.saturating_add(lease_ms),
        replaced: None,
    })
}

/// Reads one row of [`sql::GET`] or [`sql::HELD`]: the database's time and the key's record,
/// if it has one.
pub(crate) fn record_row(row: &Row) -> Result<(i64, Option<Held>)> {
    let get = |e: tokio_postgres::Error| db_error(e);
    let now: i64 = row.try_get(0).map_err(get)?;
    let Some(fence) = row.try_get::<_, Option<i64>>(1).map_err(get)? else {
        return Ok((now, None));
    };
    let held = Held {
        fence,
        fingerprint: row.try_get(2).map_err(get)?,
        claimed_at: row.try_get(3).map_err(get)?,
        completed: row.try_get(4).map_err(get)?,
        lease_until: row.try_get(5).map_err(get)?,
        expires_at: row.try_get(6).map_err(get)?,
        orphan: row
            .try_get::<_, Option<bool>>(7)
            .map_err(get)?
            .unwrap_or_default(),
        status: row.try_get(8).map_err(get)?,
        headers: row.try_get(9).map_err(get)?,
        body: row.try_get(10).map_err(get)?,
    };
    Ok((now, Some(held)))
}

/// Undoes a claim nobody received: a fresh claim is deleted; a takeover's lease ends now and
/// it is marked an orphan (the attempt it replaced may have acted, so the next claim takes it
/// over again, told to reconcile).
async fn withdraw(context: &Context, conn: &Conn, target: &Target, fence: i64, takeover: bool) {
    context.withdrawn.fetch_add(1, Ordering::Relaxed);
    let tenant = vec![target.tenant.as_slice()];
    let endpoint = vec![target.endpoint.as_slice()];
    let key = vec![target.key.as_str()];
    let fences = vec![fence];
    let result = if takeover {
        execute(
            conn,
            &conn.extend,
            &[
                &(context.adjust)(),
                &tenant,
                &endpoint,
                &key,
                &fences,
                &true,
                &vec![0i64],
            ],
        )
        .await
    } else {
        execute(conn, &conn.release, &[&tenant, &endpoint, &key, &fences]).await
    };
    // A failure leaves the claim to its lease, as a crash would.
    let _ = result;
    context.commits.fetch_add(1, Ordering::Relaxed);
}

async fn completes(context: &Context, conn: &Conn, mut pending: Vec<CompleteItem>) {
    while !pending.is_empty() {
        let batch = next_round(&mut pending, |c| &c.0 .0);
        let adjust = (context.adjust)();
        let result = if let [((target, fence), status, headers, body, _)] = batch.as_slice() {
            query(
                conn,
                &conn.complete_one,
                &[
                    &adjust,
                    &target.tenant,
                    &target.endpoint,
                    &target.key,
                    fence,
                    status,
                    &headers.as_slice(),
                    &body.as_slice(),
                    &context.params.ttl_ms,
                ],
            )
            .await
        } else {
            let (tenants, endpoints, keys) = columns(batch.iter().map(|c| &c.0 .0));
            let fences: Vec<i64> = batch.iter().map(|c| c.0 .1).collect();
            let statuses: Vec<i32> = batch.iter().map(|c| c.1).collect();
            let headers: Vec<&[u8]> = batch.iter().map(|c| c.2.as_slice()).collect();
            let bodies: Vec<&[u8]> = batch.iter().map(|c| c.3.as_slice()).collect();
            query(
                conn,
                &conn.complete,
                &[
                    &adjust,
                    &tenants,
                    &endpoints,
                    &keys,
                    &fences,
                    &statuses,
                    &headers,
                    &bodies,
                    &context.params.ttl_ms,
                ],
            )
            .await
        };
        context.commits.fetch_add(1, Ordering::Relaxed);
        let done = fenced_rows(result);
        for (fenced, .., reply) in batch {
            let _ = reply.send(match &done {
                Ok(done) => Ok(done.get(&fenced.1).copied()),
                Err(e) => Err(again(e)),
            });
        }
    }
}

async fn releases(context: &Context, conn: &Conn, mut pending: Vec<(Fenced, Option<Reply<bool>>)>) {
    while !pending.is_empty() {
        let batch = next_round(&mut pending, |c| &c.0 .0);
        let (tenants, endpoints, keys) = columns(batch.iter().map(|c| &c.0 .0));
        let fences: Vec<i64> = batch.iter().map(|c| c.0 .1).collect();
        let result = query(conn, &conn.release, &[&tenants, &endpoints, &keys, &fences])
            .await
            .map(|rows| {
                rows.iter()
                    .map(|r| r.get::<_, i64>(0))
                    .collect::<std::collections::HashSet<_>>()
            })
            .map_err(db_error);
        context.commits.fetch_add(1, Ordering::Relaxed);
        for (fenced, reply) in batch {
            if let Some(reply) = reply {
                let _ = reply.send(match &result {
                    Ok(done) => Ok(done.contains(&fenced.1)),
                    Err(e) => Err(again(e)),
                });
            }
        }
    }
}

async fn extends(context: &Context, conn: &Conn, pending: Vec<ExtendItem>) {
    // Withdrawn takeovers (orphan) and renewals differ in one flag: two statements.
    let (orphaned, renewed): (Vec<_>, Vec<_>) = pending.into_iter().partition(|e| e.2);
    for (mut pending, orphan) in [(orphaned, true), (renewed, false)] {
        while !pending.is_empty() {
            let batch = next_round(&mut pending, |c| &c.0 .0);
            let (tenants, endpoints, keys) = columns(batch.iter().map(|c| &c.0 .0));
            let fences: Vec<i64> = batch.iter().map(|c| c.0 .1).collect();
            let by: Vec<i64> = batch.iter().map(|c| c.1).collect();
            let result = query(
                conn,
                &conn.extend,
                &[
                    &(context.adjust)(),
                    &tenants,
                    &endpoints,
                    &keys,
                    &fences,
                    &orphan,
                    &by,
                ],
            )
            .await;
            context.commits.fetch_add(1, Ordering::Relaxed);
            let done = fenced_rows(result);
            for (fenced, .., reply) in batch {
                if let Some(reply) = reply {
                    let _ = reply.send(match &done {
                        Ok(done) => Ok(done.get(&fenced.1).copied()),
                        Err(e) => Err(again(e)),
                    });
                }
            }
        }
    }
}

async fn abandons(conn: &Conn, mut pending: Vec<Fenced>) {
    while !pending.is_empty() {
        let batch = next_round(&mut pending, |c| &c.0);
        let (tenants, endpoints, keys) = columns(batch.iter().map(|c| &c.0));
        let fences: Vec<i64> = batch.iter().map(|c| c.1).collect();
        // A failure leaves the claim in progress until its lease ends, as a crash would.
        let _ = execute(conn, &conn.abandon, &[&tenants, &endpoints, &keys, &fences]).await;
    }
}

/// Whether a statement failed without effect and may simply run again: a deadlock (two
/// batches on two connections locking the same rows in different orders) or a serialization
/// failure (engines that run SERIALIZABLE).
fn retryable(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|c| {
        *c == SqlState::T_R_DEADLOCK_DETECTED || *c == SqlState::T_R_SERIALIZATION_FAILURE
    })
}

/// How many times a statement that failed without effect is run again.
const RETRIES: u32 = 8;

/// Runs what `run` sends again, after a short and growing pause, while it fails without
/// effect.
async fn retrying<T, F, Fut>(mut run: F) -> std::result::Result<T, tokio_postgres::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, tokio_postgres::Error>>,
{
    let mut attempt = 0;
    loop {
        match run().await {
            Err(e) if retryable(&e) && attempt < RETRIES => {
                attempt += 1;
                tokio::time::sleep(std::time::Duration::from_millis(1 << attempt.min(6))).await;
            }
            other => return other,
        }
    }
}

/// Runs a statement for its rows, again while it fails without effect.
pub(crate) async fn query<T>(
    conn: &Conn,
    statement: &T,
    params: &[&(dyn ToSql + Sync)],
) -> std::result::Result<Vec<Row>, tokio_postgres::Error>
where
    T: ?Sized + tokio_postgres::ToStatement,
{
    let result = retrying(|| conn.client.query(statement, params)).await;
    if let Err(e) = &result {
        conn.failed(e);
    }
    result
}

/// Runs a statement for the number of rows it changed, again while it fails without effect.
pub(crate) async fn execute<T>(
    conn: &Conn,
    statement: &T,
    params: &[&(dyn ToSql + Sync)],
) -> std::result::Result<u64, tokio_postgres::Error>
where
    T: ?Sized + tokio_postgres::ToStatement,
{
    let result = retrying(|| conn.client.execute(statement, params)).await;
    if let Err(e) = &result {
        conn.failed(e);
    }
    result
}

/// The time each row a statement returned carries, by its fence.
fn fenced_rows(
    result: std::result::Result<Vec<Row>, tokio_postgres::Error>,
) -> Result<HashMap<i64, i64>> {
    let rows = result.map_err(db_error)?;
    rows.iter()
        .map(|r| {
            Ok((
                r.try_get(0).map_err(db_error)?,
                r.try_get(1).map_err(db_error)?,
            ))
        })
        .collect()
}
