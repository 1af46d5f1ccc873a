//! The systems under comparison, behind one trait: open a fresh, preloaded database, then hand
//! out one client per caller thread.

mod floor;
mod idemdb;
mod postgres;
mod redb;
mod redis;
mod resp;
mod sqlite;

use crate::runner::Callers;
use crate::workload::{Payload, Request, Requests, Rng};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::{Duration, Instant};

/// Every error the harness reports: a message, aborting the cell it happened in.
pub type Error = Box<dyn std::error::Error + Send + Sync>;
/// A result carrying [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// One database under test, opened fresh and preloaded, shared by all callers of its cells.
pub trait System: Sync {
    /// A new client with its own connection, used by one caller thread.
    fn client(&self) -> Result<Box<dyn Client + '_>>;

    /// A new client on the system's async API, used by one tokio task (`--callers Nt`);
    /// `None` where the system has no async API ([`Kind::async_api`]).
    fn task_client(&self) -> Option<Box<dyn TaskClient>> {
        None
    }

    /// The system's own count of fsyncs (commits) so far, where it keeps one.
    fn fsyncs(&self) -> Option<u64> {
        None
    }

    /// The PostgreSQL schema the system's data is in, for the child processes of a
    /// multi-process cell to [`attach`] to (idemdb-postgres); `None` where the place is fixed.
    fn shared_schema(&self) -> Option<&str> {
        None
    }

    /// Deletes the system's data (files, table or keys).
    fn destroy(self: Box<Self>) -> Result<()>;
}

/// One caller's connection. A method returns only once its write is durable, and fails if the
/// operation did not do what the workload expects (a new key not claimed, say).
pub trait Client: Send {
    /// Claims a key that has never been claimed.
    fn claim(&mut self, req: &Request) -> Result<()>;
    /// Completes the key this client claimed last, storing the response.
    fn complete(&mut self, req: &Request) -> Result<()>;
}

/// What a [`TaskClient`] method returns: its operation, to be awaited on a tokio runtime.
pub type Pending<'a> = Pin<Box<dyn Future<Output = Result<()>> + Send + 'a>>;

/// One caller task's client on the async API: as [`Client`], each method's future finishing
/// only once its write is durable, and failing if the operation did not do what the workload
/// expects. Owned (`'static`), so that a task of a multi-thread runtime can hold it.
pub trait TaskClient: Send {
    /// Claims a key that has never been claimed.
    fn claim<'a>(&'a mut self, req: &'a Request) -> Pending<'a>;
    /// Completes the key this client claimed last, storing the response.
    fn complete<'a>(&'a mut self, req: &'a Request) -> Pending<'a>;
}

/// Which system; parsed from `--systems`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// idemdb's `Store`, default builder.
    Idemdb,
    /// The same with `compress_responses(true)`.
    IdemdbLz4,
    /// Plain redb, one write transaction (one fsync) per operation.
    NaiveRedb,
    /// SQLite in WAL mode with `synchronous=FULL`.
    Sqlite,
    /// PostgreSQL with `synchronous_commit=on`.
    Postgres,
    /// idemdb's `Store` on that same PostgreSQL server (`Store::connect`, default builder).
    IdemdbPostgres,
    /// Redis with `appendfsync always`.
    Redis,
    /// One 4 KiB `pwrite` and `fdatasync` per write: the disk's floor.
    FsyncFloor,
}

impl Kind {
    /// Every system, in the order the table lists them.
    pub const ALL: [Kind; 8] = [
        Kind::Idemdb,
        Kind::IdemdbLz4,
        Kind::NaiveRedb,
        Kind::Sqlite,
        Kind::Postgres,
        Kind::IdemdbPostgres,
        Kind::Redis,
        Kind::FsyncFloor,
    ];

    /// The name used on the command line and in the outputs.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Idemdb => "idemdb",
            Kind::IdemdbLz4 => "idemdb-lz4",
            Kind::NaiveRedb => "naive-redb",
            Kind::Sqlite => "sqlite",
            Kind::Postgres => "postgres",
            Kind::IdemdbPostgres => "idemdb-postgres",
            Kind::Redis => "redis",
            Kind::FsyncFloor => "fsync-floor",
        }
    }

    /// The kind named `name`.
    pub fn parse(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Whether the system is only run with one caller.
    pub fn single_caller(self) -> bool {
        self == Kind::FsyncFloor
    }

    /// Whether the data lives in a server every process can reach, so that several harness
    /// processes can measure one preloaded database at once (`--callers PxC`). A file store
    /// can only be opened by one process.
    pub fn shared(self) -> bool {
        matches!(self, Kind::Postgres | Kind::IdemdbPostgres | Kind::Redis)
    }

    /// Whether the system has an async API for tokio tasks to call (`--callers Nt`), as
    /// idemdb's HTTP layer and MCP gateway call it.
    pub fn async_api(self) -> bool {
        matches!(self, Kind::Idemdb | Kind::IdemdbLz4 | Kind::IdemdbPostgres)
    }

    /// Whether the system runs cells of this caller layout; if not, why not.
    pub fn runs(self, callers: Callers) -> std::result::Result<(), &'static str> {
        match callers {
            Callers::Threads(_) => Ok(()),
            Callers::Processes { .. } if !self.shared() => {
                Err("a file store can only be opened by one process")
            }
            Callers::Tasks(_) if !self.async_api() => Err("no async API for tokio tasks"),
            Callers::Processes { .. } | Callers::Tasks(_) => Ok(()),
        }
    }
}

/// What opening a system needs.
#[derive(Debug, Clone)]
pub struct Setup {
    /// A fresh directory of its own, for the embedded systems' files.
    pub dir: PathBuf,
    /// The seed the preloaded keys are drawn from.
    pub seed: u64,
    /// The response every completion stores.
    pub payload: Payload,
    /// libpq-style connection string for PostgreSQL.
    pub postgres: Option<String>,
    /// `host:port` of the Redis server.
    pub redis: Option<String>,
    /// How long a preload may run before it is stopped (and the system skipped).
    pub preload_limit: Duration,
}

impl Setup {
    /// The stream of keys the preload inserts (never drawn by a measured cell).
    pub fn preload_requests(&self) -> Requests {
        Requests::new(Rng::derive(self.seed, 0x009e_10ad, 0))
    }

    /// Called as a preload goes: prints its progress at every millionth key, and fails once it
    /// has run longer than [`Setup::preload_limit`], with the rate it reached.
    pub fn preload_step(&self, system: &str, done: u64, keys: u64, started: Instant) -> Result<()> {
        let took = started.elapsed().as_secs_f64();
        if keys >= 2_000_000 && done > 0 && done.is_multiple_of(1_000_000) {
            eprintln!("{system}: {done} of {keys} keys loaded ({took:.0} s)");
        }
        if done < keys && started.elapsed() > self.preload_limit {
            return fail(format!(
                "preload stopped after {took:.0} s (--max-preload) at {done} of {keys} keys, \
                 {:.0} keys/s",
                done as f64 / took
            ));
        }
        Ok(())
    }
}

/// Opens `kind` fresh and preloads `keys` completed records through its fastest bulk path.
pub fn open(kind: Kind, setup: &Setup, keys: u64) -> Result<Box<dyn System>> {
    Ok(match kind {
        Kind::Idemdb => Box::new(idemdb::IdemdbSystem::open(setup, keys, false)?),
        Kind::IdemdbLz4 => Box::new(idemdb::IdemdbSystem::open(setup, keys, true)?),
        Kind::NaiveRedb => Box::new(redb::RedbSystem::open(setup, keys)?),
        Kind::Sqlite => Box::new(sqlite::SqliteSystem::open(setup, keys)?),
        Kind::Postgres => Box::new(postgres::PostgresSystem::open(setup, keys)?),
        Kind::IdemdbPostgres => Box::new(idemdb::IdemdbSystem::connect(setup, keys)?),
        Kind::Redis => Box::new(redis::RedisSystem::open(setup, keys)?),
        Kind::FsyncFloor => Box::new(floor::FloorSystem::open(setup)?),
    })
}

/// The system another process opened and preloaded (the parent of a multi-process cell), for
/// a child process's callers: nothing is created, loaded or dropped. `schema` is where
/// idemdb-postgres's parent put its store ([`System::shared_schema`]); `postgres` uses the
/// existing `claims` table, `redis` the same server. The embedded systems cannot be attached
/// to.
pub fn attach(kind: Kind, setup: &Setup, schema: Option<&str>) -> Result<Box<dyn System>> {
    let system: Box<dyn System> = match kind {
        Kind::Postgres => Box::new(postgres::PostgresSystem::attach(setup)?),
        Kind::IdemdbPostgres => {
            let Some(schema) = schema else {
                return fail("idemdb-postgres: attached without the parent's schema");
            };
            Box::new(idemdb::IdemdbSystem::attach(setup, schema)?)
        }
        Kind::Redis => Box::new(redis::RedisSystem::attach(setup)?),
        _ => {
            return fail(format!(
                "{}: a file store can only be opened by one process",
                kind.name()
            ))
        }
    };
    Ok(Box::new(Attached(system)))
}

/// A system attached to: the data is its opener's, so `destroy` leaves it alone.
struct Attached(Box<dyn System>);

impl System for Attached {
    fn client(&self) -> Result<Box<dyn Client + '_>> {
        self.0.client()
    }

    fn task_client(&self) -> Option<Box<dyn TaskClient>> {
        self.0.task_client()
    }

    fn fsyncs(&self) -> Option<u64> {
        self.0.fsyncs()
    }

    fn shared_schema(&self) -> Option<&str> {
        self.0.shared_schema()
    }

    fn destroy(self: Box<Self>) -> Result<()> {
        // Closes the connections only: the opener drops the data.
        drop(self);
        Ok(())
    }
}

/// Checks that a server-backed system is reachable, so it can be skipped with a note if not;
/// returns the server's version where there is a server.
pub fn probe(kind: Kind, setup: &Setup) -> std::result::Result<Option<String>, String> {
    match kind {
        Kind::Postgres | Kind::IdemdbPostgres => match &setup.postgres {
            None => Err("no --postgres given".into()),
            Some(url) => postgres::probe(url)
                .map(Some)
                .map_err(|e| format!("unreachable: {e}")),
        },
        Kind::Redis => match &setup.redis {
            None => Err("no --redis given".into()),
            Some(addr) => redis::probe(addr)
                .map(Some)
                .map_err(|e| format!("unreachable: {e}")),
        },
        _ => Ok(None),
    }
}

/// An error's message followed by those of its sources that it does not already contain (the
/// `postgres` crate's says only "db error"; the server's message is its source).
pub fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

/// An error from a message.
pub fn fail<T>(message: impl Into<String>) -> Result<T> {
    Err(message.into().into())
}

#[cfg(test)]
mod tests {
    use super::Kind;
    use crate::runner::Callers;

    #[test]
    fn tasks_run_on_idemdb_only_and_processes_on_servers_only() {
        let tasks = Callers::Tasks(64);
        let processes = Callers::Processes {
            processes: 4,
            each: 16,
        };
        for kind in Kind::ALL {
            assert_eq!(kind.runs(Callers::Threads(64)), Ok(()), "{kind:?}");
            assert_eq!(kind.runs(tasks).is_ok(), kind.async_api(), "{kind:?}");
            assert_eq!(kind.runs(processes).is_ok(), kind.shared(), "{kind:?}");
        }
        assert!(Kind::Idemdb.runs(tasks).is_ok() && Kind::IdemdbPostgres.runs(tasks).is_ok());
        assert_eq!(Kind::Redis.runs(tasks), Err("no async API for tokio tasks"));
        assert_eq!(
            Kind::Idemdb.runs(processes),
            Err("a file store can only be opened by one process")
        );
    }
    #[derive(Debug)]
    struct Outer(std::io::Error);

    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("db error")
        }
    }

    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn errors_are_described_with_their_sources() {
        let e = Outer(std::io::Error::other(
            "FATAL: sorry, too many clients already",
        ));
        assert_eq!(
            super::describe(&e),
            "db error: FATAL: sorry, too many clients already"
        );
        let plain: super::Error = "new key not acquired".into();
        assert_eq!(super::describe(&*plain), "new key not acquired");
    }
}
