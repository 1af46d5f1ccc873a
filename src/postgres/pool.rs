//! The connections: each with its prepared statements, at most `pool_size` in use,
//! reconnected when one is found closed; and the statements run on them, again while they
//! fail without effect.

use super::connect::Database;
use super::rows::db_error;
use super::sql;
use crate::error::Result;
use crate::sync::{Arc, AtomicBool, Ordering};
use tokio::sync::{Mutex as AsyncMutex, OwnedSemaphorePermit, Semaphore};
use tokio_postgres::error::{Severity, SqlState};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row, Statement};

/// One connection with its prepared statements.
pub(crate) struct Conn {
    /// Reached only through [`query`], [`query_one`], [`execute`] and [`Conn::transaction`],
    /// so that every statement's failure can retire the connection.
    client: Client,
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
    pub(super) fn failed(&self, e: &tokio_postgres::Error) {
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

    /// Starts a transaction on this connection (one the caller owns alone: it is not pooled).
    pub(crate) async fn transaction(
        &mut self,
    ) -> std::result::Result<tokio_postgres::Transaction<'_>, tokio_postgres::Error> {
        self.client.transaction().await
    }

    /// Connects and prepares every hot statement (in one pipeline).
    pub(crate) async fn open(database: &Database, schema: &str) -> Result<Conn> {
        // Its connection runs until the client is dropped or the server goes away; the next
        // use of the client reports the error.
        let client = database.connect().await?;
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
    config: Database,
    schema: String,
    permits: Arc<Semaphore>,
    idle: AsyncMutex<Vec<Arc<Conn>>>,
}

impl Pool {
    pub(crate) fn new(config: Database, schema: String, size: usize) -> Pool {
        Pool {
            config,
            schema,
            permits: Arc::new(Semaphore::new(size)),
            idle: AsyncMutex::new(Vec::new()),
        }
    }

    pub(super) async fn permit(&self) -> OwnedSemaphorePermit {
        Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .expect("the pool's semaphore is never closed")
    }

    /// An open connection for the holder of a permit.
    pub(super) async fn take(&self) -> Result<Arc<Conn>> {
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

    pub(super) async fn give_back(&self, conn: Arc<Conn>) {
        if conn.usable() {
            self.idle.lock().await.push(conn);
        }
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

/// Runs a statement for its one row, again while it fails without effect.
pub(crate) async fn query_one<T>(
    conn: &Conn,
    statement: &T,
    params: &[&(dyn ToSql + Sync)],
) -> std::result::Result<Row, tokio_postgres::Error>
where
    T: ?Sized + tokio_postgres::ToStatement,
{
    let result = retrying(|| conn.client.query_one(statement, params)).await;
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
