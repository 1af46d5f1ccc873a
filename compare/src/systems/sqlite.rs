//! SQLite (bundled): WAL journal, `synchronous=FULL` (every commit fsyncs the WAL), one
//! connection per caller, a generous busy timeout so that concurrent writers queue.

use super::{fail, Client, Result, Setup, System};
use crate::workload::{now_ms, Payload, Request, ENDPOINT, TTL_MS};
use rusqlite::{params, Connection};
use std::path::PathBuf;
use std::time::Duration;

/// Rows per preload transaction.
const PRELOAD_BATCH: u64 = 100_000;
/// How long a writer waits for the write lock before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(60);

/// The table, as every SQL peer has it.
pub const CREATE: &str = "CREATE TABLE claims (
    tenant TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    key TEXT NOT NULL,
    meta BLOB NOT NULL,
    response BLOB,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (tenant, endpoint, key)
) WITHOUT ROWID";
/// The claim: an insert that does nothing if the key exists; one row changed means claimed.
pub const CLAIM: &str = "INSERT INTO claims (tenant, endpoint, key, meta, expires_at)
    VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT DO NOTHING";
/// The completion: store the response and push the expiry to 24 h after completion.
pub const COMPLETE: &str = "UPDATE claims SET response = ?1, expires_at = ?2
    WHERE tenant = ?3 AND endpoint = ?4 AND key = ?5";
const PRELOAD: &str = "INSERT INTO claims (tenant, endpoint, key, meta, response, expires_at)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6)";

pub struct SqliteSystem {
    path: PathBuf,
    payload: Payload,
    dir: PathBuf,
}

/// A connection set up as every caller's is.
fn connect(path: &PathBuf) -> Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return fail(format!("sqlite: journal_mode is {mode}, not wal"));
    }
    conn.execute_batch("PRAGMA synchronous=FULL;")?;
    Ok(conn)
}

impl SqliteSystem {
    /// Creates the database and preloads `keys` completed rows, 100k per transaction.
    pub fn open(setup: &Setup, keys: u64) -> Result<SqliteSystem> {
        std::fs::create_dir_all(&setup.dir)?;
        let path = setup.dir.join("claims.sqlite");
        let mut conn = connect(&path)?;
        conn.execute_batch(CREATE)?;
        // A large page cache for the bulk load only; callers keep the default.
        conn.execute_batch("PRAGMA cache_size=-1048576;")?;
        let response = setup.payload.fixed_response();
        let expires = (now_ms() + TTL_MS) as i64;
        let mut requests = setup.preload_requests();
        let mut done = 0;
        let started = std::time::Instant::now();
        while done < keys {
            let txn = conn.transaction()?;
            {
                let mut insert = txn.prepare_cached(PRELOAD)?;
                for _ in 0..PRELOAD_BATCH.min(keys - done) {
                    let req = requests.next_request();
                    let meta = setup.payload.meta(&req, done);
                    insert.execute(params![
                        req.tenant_name(),
                        ENDPOINT,
                        req.key,
                        meta,
                        response,
                        expires
                    ])?;
                    done += 1;
                }
            }
            txn.commit()?;
            setup.preload_step("sqlite", done, keys, started)?;
        }
        // Leave a short WAL, so the first cell does not pay the preload's checkpoint.
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        Ok(SqliteSystem {
            path,
            payload: setup.payload.clone(),
            dir: setup.dir.clone(),
        })
    }
}

impl System for SqliteSystem {
    fn client(&self) -> Result<Box<dyn Client + '_>> {
        Ok(Box::new(SqliteClient {
            conn: connect(&self.path)?,
            payload: &self.payload,
            fence: 0,
        }))
    }

    fn destroy(self: Box<Self>) -> Result<()> {
        std::fs::remove_dir_all(&self.dir)?;
        Ok(())
    }
}

struct SqliteClient<'a> {
    conn: Connection,
    payload: &'a Payload,
    fence: u64,
}

impl Client for SqliteClient<'_> {
    fn claim(&mut self, req: &Request) -> Result<()> {
        self.fence += 1;
        let meta = self.payload.meta(req, self.fence);
        let expires = (now_ms() + TTL_MS) as i64;
        let changed = self.conn.prepare_cached(CLAIM)?.execute(params![
            req.tenant_name(),
            ENDPOINT,
            req.key,
            meta,
            expires
        ])?;
        if changed != 1 {
            return fail(format!("sqlite: new key {} not claimed", req.key));
        }
        Ok(())
    }

    fn complete(&mut self, req: &Request) -> Result<()> {
        let expires = (now_ms() + TTL_MS) as i64;
        let changed = self.conn.prepare_cached(COMPLETE)?.execute(params![
            self.payload.response(req),
            expires,
            req.tenant_name(),
            ENDPOINT,
            req.key
        ])?;
        if changed != 1 {
            return fail(format!("sqlite: claimed key {} not completed", req.key));
        }
        Ok(())
    }
}
