//! Connecting a store: the connection string's defaults, the engine's thread and its
//! runtime, the schema's check or migration, the replica's incarnation, the first connection.

use super::bridge::block;
use super::clock::{clock_adjustment, DatabaseClock};
use super::pool::Pool;
use super::pooler::PoolMode;
use super::rows::{db_error, millis_column};
use super::scheduler::{self, ClaimParams};
use super::tls::Connector;
use super::url;
use super::{schema, sql, wakes, PgStore, Shared};
use crate::config::{Config, StalePolicy};
use crate::error::{Error, Result};
use crate::replay_cache::ReplayCache;
use crate::sync::{Arc, AtomicU64, AtomicUsize, Mutex};
use futures_channel::oneshot;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// The owner name a store gets unless [`crate::StoreBuilder::owner`] names one: unique per
/// process and connect.
fn random_owner() -> String {
    use std::hash::BuildHasher;
    let noise = std::collections::hash_map::RandomState::new().hash_one(Instant::now());
    format!("pid{}-{noise:016x}", std::process::id())
}

/// Where the store's connections go, and how: the driver's settings and the TLS connector.
#[derive(Debug, Clone)]
pub(crate) struct Database {
    pub(crate) config: tokio_postgres::Config,
    pub(crate) connector: Connector,
    pub(crate) pool_mode: PoolMode,
}

impl Database {
    /// A new connection, run on the current runtime until the client is dropped.
    pub(crate) async fn connect(&self) -> Result<tokio_postgres::Client> {
        self.connector.connect(&self.config, None).await
    }

    /// A new connection whose notifications' payloads go to `notices`; its
    /// `application_name` is the pool's with ` listener` after it (as `pg_stat_activity`
    /// shows it).
    pub(crate) async fn connect_listening(
        &self,
        notices: tokio::sync::mpsc::UnboundedSender<String>,
    ) -> Result<tokio_postgres::Client> {
        let mut config = self.config.clone();
        let name = format!(
            "{} listener",
            config.get_application_name().unwrap_or("idemdb")
        );
        config.application_name(&name);
        self.connector.connect(&config, Some(notices)).await
    }
}

/// Connects a store to the database at `url`, creating or checking its schema.
pub(crate) fn connect(mut config: Config, url: &str) -> Result<PgStore> {
    let (url, parameters) = url::split(url)?;
    let mut pg: tokio_postgres::Config = url.parse().map_err(|e| Error::Database {
        sqlstate: None,
        reason: format!("invalid connection string: {e}"),
        driver: None,
    })?;
    let connector = Connector::new(&parameters.tls.overridden_by(&config.tls), &mut pg)?;
    let pool_mode = config
        .pool_mode
        .or(parameters.pool_mode)
        .unwrap_or_default();
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
    let (ready_tx, ready_rx) = oneshot::channel::<Result<Arc<scheduler::Context>>>();
    let params = ClaimParams {
        lease_ms: millis_column(config.lease),
        take_over: config.stale_policy == StalePolicy::TakeOver,
        owner,
        incarnation: 0,
        ttl_ms: millis_column(config.ttl),
        tenant_limit: config
            .max_live_per_tenant
            .map(|l| i64::try_from(l).unwrap_or(i64::MAX)),
        byte_limit: config
            .max_store_bytes
            .map(|l| i64::try_from(l).unwrap_or(i64::MAX)),
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
                    let database = Database {
                        config: pg,
                        connector,
                        pool_mode,
                    };
                    let context =
                        match start(database, schema, (pool_size, batch_limit), params, adjust)
                            .await
                        {
                            Ok(context) => Arc::new(context),
                            Err(e) => {
                                let _ = ready_tx.send(Err(e));
                                return;
                            }
                        };
                    let _ = ready_tx.send(Ok(Arc::clone(&context)));
                    scheduler::run(context, queue).await;
                });
            }
        })
        .map_err(Error::Io)?;
    let context = block(ready_rx)?;
    Ok(PgStore {
        shared: Arc::new(Shared {
            jobs,
            context,
            replays: ReplayCache::new(config.replay_cache_bytes),
            config,
            schema,
            withdrawn: AtomicU64::new(0),
            clock: DatabaseClock::new(),
            thread: Mutex::new(Some(thread)),
            direct: Mutex::new(None),
        }),
    })
}

/// On the engine's thread: checks the server, migrates the schema, takes an incarnation and
/// opens the first pooled connection.
pub(super) async fn start(
    database: Database,
    schema: String,
    (pool_size, batch_limit): (usize, usize),
    mut params: ClaimParams,
    adjust: Box<dyn Fn() -> Option<i64> + Send + Sync>,
) -> Result<scheduler::Context> {
    let mut client = database.connect().await?;
    schema::check_durability(&client).await?;
    schema::make_commits_durable(&client, database.pool_mode).await?;
    schema::migrate(&mut client, &schema).await?;
    if params.bounded() {
        schema::count_records(&mut client, &schema).await?;
    }
    params.incarnation = client
        .query_typed_one(&schema::qualify(sql::INCARNATION, &schema), &[])
        .await
        .map_err(db_error)?
        .get(0);
    drop(client);
    // Behind a transaction pooler a LISTEN would stay on a shared session: waiters poll.
    let wakes = match database.pool_mode {
        PoolMode::Session => {
            let (wakes, outgoing) = wakes::listening();
            tokio::spawn(wakes::listen(
                database.clone(),
                schema.clone(),
                Arc::clone(&wakes),
                outgoing,
            ));
            wakes
        }
        PoolMode::Transaction => Arc::new(wakes::Wakes::local()),
    };
    let pool = Pool::new(database, schema, pool_size);
    pool.warm().await?;
    Ok(scheduler::Context {
        pool,
        params,
        adjust,
        batch_limit,
        commits: AtomicU64::new(0),
        withdrawn: AtomicU64::new(0),
        queued: AtomicUsize::new(0),
        wakes,
    })
}
