//! The connections: each with its hot statements, at most `pool_size` in use, reconnected
//! when one is found closed; and the statements run on them, again while they fail without
//! effect.
//!
//! A hot statement is prepared once per connection ([`PoolMode::Session`]). Every other
//! statement, and every statement behind a transaction pooler ([`PoolMode::Transaction`]),
//! is sent unnamed with its text and its parameters' types: one round trip, nothing left on
//! the server's session.

use super::connect::Database;
use super::pooler::PoolMode;
use super::rows::db_error;
use super::sql;
use crate::error::Result;
use crate::sync::{Arc, AtomicBool, Ordering};
use std::sync::OnceLock;
use tokio::sync::{Mutex as AsyncMutex, OwnedSemaphorePermit, Semaphore};
use tokio_postgres::error::{Severity, SqlState};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row, Statement};

/// A statement the pool runs.
pub(crate) trait Sql: Sync {
    /// Its text, as sent unnamed.
    fn text(&self) -> &str;
    /// The statement prepared on the connection, if it is.
    fn prepared(&self) -> Option<&Statement> {
        None
    }
    /// Its parameters' types, once known (a hot statement keeps them).
    fn known_types(&self) -> Option<&OnceLock<Vec<Type>>> {
        None
    }
}

impl Sql for str {
    fn text(&self) -> &str {
        self
    }
}

impl Sql for String {
    fn text(&self) -> &str {
        self
    }
}

/// One of the statements every batch uses: prepared on its connection, or (behind a
/// transaction pooler) its text, with its parameters' types as the first run found them.
pub(crate) struct Hot {
    text: String,
    prepared: Option<Statement>,
    types: OnceLock<Vec<Type>>,
}

impl Sql for Hot {
    fn text(&self) -> &str {
        &self.text
    }
    fn prepared(&self) -> Option<&Statement> {
        self.prepared.as_ref()
    }
    fn known_types(&self) -> Option<&OnceLock<Vec<Type>>> {
        Some(&self.types)
    }
}

/// The types an unnamed statement's parameters are sent as: for each value, the first of
/// these its `ToSql` accepts. Every value the engine sends is one of them; the statements'
/// texts cast where a column has another type.
const CANDIDATES: [Type; 14] = [
    Type::BOOL,
    Type::INT8,
    Type::INT4,
    Type::INT2,
    Type::FLOAT8,
    Type::TEXT,
    Type::BYTEA,
    Type::TIMESTAMPTZ,
    Type::BOOL_ARRAY,
    Type::INT8_ARRAY,
    Type::INT4_ARRAY,
    Type::INT2_ARRAY,
    Type::TEXT_ARRAY,
    Type::BYTEA_ARRAY,
];

/// The type `value` is sent as (see [`CANDIDATES`]); `TEXT` if none fits, which the driver
/// then refuses with its own error, naming the value's type.
fn type_of(value: &(dyn ToSql + Sync)) -> Type {
    let mut scratch = bytes::BytesMut::new();
    CANDIDATES
        .iter()
        .find(|ty| {
            scratch.clear();
            value.to_sql_checked(ty, &mut scratch).is_ok()
        })
        .cloned()
        .unwrap_or(Type::TEXT)
}

/// `params` with the types they are sent as.
fn typed<'a, S: Sql + ?Sized>(
    statement: &S,
    params: &'a [&'a (dyn ToSql + Sync)],
) -> Vec<(&'a (dyn ToSql + Sync), Type)> {
    let probe = || params.iter().map(|p| type_of(*p)).collect::<Vec<_>>();
    match statement.known_types() {
        // A hot statement's types, probed once: no vector of them per execution.
        Some(known) => params
            .iter()
            .copied()
            .zip(known.get_or_init(probe).iter().cloned())
            .collect(),
        None => params.iter().copied().zip(probe()).collect(),
    }
}

/// Runs `statement` for its rows: prepared if it is, else unnamed.
async fn rows<S: Sql + ?Sized>(
    client: &Client,
    statement: &S,
    params: &[&(dyn ToSql + Sync)],
) -> std::result::Result<Vec<Row>, tokio_postgres::Error> {
    match statement.prepared() {
        Some(prepared) => client.query(prepared, params).await,
        None => {
            client
                .query_typed(statement.text(), &typed(statement, params))
                .await
        }
    }
}

/// Runs `statement` for its one row: prepared if it is, else unnamed.
async fn one<S: Sql + ?Sized>(
    client: &Client,
    statement: &S,
    params: &[&(dyn ToSql + Sync)],
) -> std::result::Result<Row, tokio_postgres::Error> {
    match statement.prepared() {
        Some(prepared) => client.query_one(prepared, params).await,
        None => {
            client
                .query_typed_one(statement.text(), &typed(statement, params))
                .await
        }
    }
}

/// Runs `statement` for the number of rows it changed: prepared if it is, else unnamed.
async fn changed<S: Sql + ?Sized>(
    client: &Client,
    statement: &S,
    params: &[&(dyn ToSql + Sync)],
) -> std::result::Result<u64, tokio_postgres::Error> {
    match statement.prepared() {
        Some(prepared) => client.execute(prepared, params).await,
        None => {
            use futures_util::TryStreamExt as _;
            let typed = typed(statement, params);
            let stream = client
                .query_typed_raw(statement.text(), typed.iter().map(|(v, t)| (*v, t.clone())))
                .await?;
            futures_util::pin_mut!(stream);
            while stream.try_next().await?.is_some() {}
            Ok(stream.rows_affected().unwrap_or(0))
        }
    }
}

/// One connection with its hot statements.
pub(crate) struct Conn {
    /// Reached only through [`query`], [`query_one`], [`execute`] and [`Conn::transaction`],
    /// so that every statement's failure can retire the connection.
    client: Client,
    /// Set when a statement failed in a way that ends the session (see [`Conn::usable`]).
    retired: AtomicBool,
    pub(crate) claim: Hot,
    pub(crate) claim_bounded: Hot,
    pub(crate) claim_one: Hot,
    pub(crate) claim_new: Hot,
    pub(crate) complete: Hot,
    pub(crate) complete_one: Hot,
    pub(crate) release: Hot,
    pub(crate) extend: Hot,
    pub(crate) abandon: Hot,
    pub(crate) get: Hot,
    pub(crate) held: Hot,
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

    /// Connects and readies every hot statement: prepared (in one pipeline), or behind a
    /// transaction pooler only their texts.
    pub(crate) async fn open(database: &Database, schema: &str) -> Result<Conn> {
        // Its connection runs until the client is dropped or the server goes away; the next
        // use of the client reports the error.
        let client = database.connect().await?;
        // Checked again on every connection: a reconnect may reach another server (a
        // failover through a multi-host URL).
        super::schema::check_durability(&client).await?;
        super::schema::make_commits_durable(&client, database.pool_mode).await?;
        let texts = [
            sql::CLAIM,
            sql::CLAIM_BOUNDED,
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
        let prepared = match database.pool_mode {
            PoolMode::Session => {
                super::plans::fix_plans(&client).await?;
                let prepared =
                    futures_util::future::try_join_all(texts.iter().map(|t| client.prepare(t)))
                        .await
                        .map_err(db_error)?;
                prepared.into_iter().map(Some).collect()
            }
            PoolMode::Transaction => vec![None; texts.len()],
        };
        let mut hot = texts.into_iter().zip(prepared).map(|(text, prepared)| Hot {
            text,
            prepared,
            types: OnceLock::new(),
        });
        let mut next = || hot.next().expect("one statement per text");
        Ok(Conn {
            claim: next(),
            claim_bounded: next(),
            claim_one: next(),
            claim_new: next(),
            complete: next(),
            complete_one: next(),
            release: next(),
            extend: next(),
            abandon: next(),
            get: next(),
            held: next(),
            client,
            retired: AtomicBool::new(false),
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
pub(crate) async fn query<S: Sql + ?Sized>(
    conn: &Conn,
    statement: &S,
    params: &[&(dyn ToSql + Sync)],
) -> std::result::Result<Vec<Row>, tokio_postgres::Error> {
    let result = retrying(|| rows(&conn.client, statement, params)).await;
    if let Err(e) = &result {
        conn.failed(e);
    }
    result
}

/// Runs a statement for its one row, again while it fails without effect.
pub(crate) async fn query_one<S: Sql + ?Sized>(
    conn: &Conn,
    statement: &S,
    params: &[&(dyn ToSql + Sync)],
) -> std::result::Result<Row, tokio_postgres::Error> {
    let result = retrying(|| one(&conn.client, statement, params)).await;
    if let Err(e) = &result {
        conn.failed(e);
    }
    result
}

/// Runs a statement for the number of rows it changed, again while it fails without effect.
pub(crate) async fn execute<S: Sql + ?Sized>(
    conn: &Conn,
    statement: &S,
    params: &[&(dyn ToSql + Sync)],
) -> std::result::Result<u64, tokio_postgres::Error> {
    let result = retrying(|| changed(&conn.client, statement, params)).await;
    if let Err(e) = &result {
        conn.failed(e);
    }
    result
}
