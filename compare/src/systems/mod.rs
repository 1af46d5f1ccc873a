//! The systems under comparison, behind one trait: open a fresh, preloaded database, then hand
//! out one client per caller thread.

mod floor;
mod idemdb;
mod postgres;
mod redb;
mod redis;
mod resp;
mod sqlite;

use crate::workload::{Payload, Request, Requests, Rng};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Every error the harness reports: a message, aborting the cell it happened in.
pub type Error = Box<dyn std::error::Error + Send + Sync>;
/// A result carrying [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// One database under test, opened fresh and preloaded, shared by all callers of its cells.
pub trait System: Sync {
    /// A new client with its own connection, used by one caller thread.
    fn client(&self) -> Result<Box<dyn Client + '_>>;

    /// The system's own count of fsyncs (commits) so far, where it keeps one.
    fn fsyncs(&self) -> Option<u64> {
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

/// Which system; parsed from `--systems`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// idemdb's `Store`, default builder.
    Idemdb,
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
    pub const ALL: [Kind; 7] = [
        Kind::Idemdb,
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
        Kind::Idemdb => Box::new(idemdb::IdemdbSystem::open(setup, keys)?),
        Kind::NaiveRedb => Box::new(redb::RedbSystem::open(setup, keys)?),
        Kind::Sqlite => Box::new(sqlite::SqliteSystem::open(setup, keys)?),
        Kind::Postgres => Box::new(postgres::PostgresSystem::open(setup, keys)?),
        Kind::IdemdbPostgres => Box::new(idemdb::IdemdbSystem::connect(setup, keys)?),
        Kind::Redis => Box::new(redis::RedisSystem::open(setup, keys)?),
        Kind::FsyncFloor => Box::new(floor::FloorSystem::open(setup)?),
    })
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

/// An error from a message.
pub fn fail<T>(message: impl Into<String>) -> Result<T> {
    Err(message.into().into())
}
