//! PostgreSQL through the sync `postgres` crate (NoTls), one connection per caller,
//! `synchronous_commit = on`: every commit waits for its WAL flush.

use super::{fail, Client, Result, Setup, System};
use crate::workload::{now_ms, Payload, Request, ENDPOINT, TTL_MS};
use postgres::{NoTls, Statement};
use std::io::Write;

/// Rows per preload `COPY` (each its own transaction).
const PRELOAD_BATCH: u64 = 1_000_000;

const CREATE: &str = "CREATE TABLE claims (
    tenant TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    key TEXT NOT NULL,
    meta BYTEA NOT NULL,
    response BYTEA,
    expires_at BIGINT NOT NULL
)";
/// Added after the bulk load: building the index once is the fastest bulk path.
const PRIMARY_KEY: &str = "ALTER TABLE claims ADD PRIMARY KEY (tenant, endpoint, key)";
const CLAIM: &str = "INSERT INTO claims (tenant, endpoint, key, meta, expires_at)
    VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING";
const COMPLETE: &str = "UPDATE claims SET response = $1, expires_at = $2
    WHERE tenant = $3 AND endpoint = $4 AND key = $5";

/// A session set up as every caller's is.
fn connect(url: &str) -> Result<postgres::Client> {
    let mut client = postgres::Client::connect(url, NoTls)?;
    client.batch_execute("SET synchronous_commit = on")?;
    let fsync: String = client.query_one("SHOW fsync", &[])?.get(0);
    if fsync != "on" {
        return fail(format!("postgres: the server runs with fsync = {fsync}"));
    }
    Ok(client)
}

/// The server's version, if it answers.
pub fn probe(url: &str) -> Result<String> {
    let version: String = connect(url)?.query_one("SHOW server_version", &[])?.get(0);
    Ok(format!("postgres {version}"))
}

pub struct PostgresSystem {
    url: String,
    payload: Payload,
}

impl PostgresSystem {
    /// Creates the table and preloads `keys` completed rows with `COPY`, 1M rows per
    /// transaction, then builds the primary key and checkpoints.
    pub fn open(setup: &Setup, keys: u64) -> Result<PostgresSystem> {
        let Some(url) = setup.postgres.clone() else {
            return fail("postgres: no --postgres given");
        };
        let mut client = connect(&url)?;
        client.batch_execute("DROP TABLE IF EXISTS claims")?;
        client.batch_execute(CREATE)?;
        let response = hex(&setup.payload.fixed_response());
        let expires = now_ms() + TTL_MS;
        let mut requests = setup.preload_requests();
        let mut done = 0;
        let mut line = Vec::new();
        let started = std::time::Instant::now();
        while done < keys {
            let mut txn = client.transaction()?;
            let mut copy = txn.copy_in("COPY claims FROM STDIN")?;
            for _ in 0..PRELOAD_BATCH.min(keys - done) {
                let req = requests.next_request();
                let meta = hex(&setup.payload.meta(&req, done));
                line.clear();
                // Text format: tab-separated; keys and names hold no tab, newline or
                // backslash, and a bytea is written `\\x<hex>` (the backslash escaped).
                writeln!(
                    line,
                    "{}\t{ENDPOINT}\t{}\t\\\\x{meta}\t\\\\x{response}\t{expires}",
                    req.tenant_name(),
                    req.key
                )?;
                copy.write_all(&line)?;
                done += 1;
            }
            copy.finish()?;
            txn.commit()?;
            setup.preload_step("postgres", done, keys, started)?;
        }
        client.batch_execute(PRIMARY_KEY)?;
        client.batch_execute("ANALYZE claims")?;
        // Flush the preload's pages now rather than in the middle of a measured cell.
        client.batch_execute("CHECKPOINT")?;
        Ok(PostgresSystem {
            url,
            payload: setup.payload.clone(),
        })
    }
}

impl PostgresSystem {
    /// The `claims` table another process created and preloaded (a multi-process cell's
    /// parent): nothing is created or loaded.
    pub fn attach(setup: &Setup) -> Result<PostgresSystem> {
        let Some(url) = setup.postgres.clone() else {
            return fail("postgres: no --postgres given");
        };
        Ok(PostgresSystem {
            url,
            payload: setup.payload.clone(),
        })
    }
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    out
}

impl System for PostgresSystem {
    fn client(&self) -> Result<Box<dyn Client + '_>> {
        let mut client = connect(&self.url)?;
        let claim = client.prepare(CLAIM)?;
        let complete = client.prepare(COMPLETE)?;
        Ok(Box::new(PostgresClient {
            client,
            claim,
            complete,
            payload: &self.payload,
            fence: 0,
        }))
    }

    fn destroy(self: Box<Self>) -> Result<()> {
        connect(&self.url)?.batch_execute("DROP TABLE claims; CHECKPOINT")?;
        Ok(())
    }
}

struct PostgresClient<'a> {
    client: postgres::Client,
    claim: Statement,
    complete: Statement,
    payload: &'a Payload,
    fence: u64,
}

impl Client for PostgresClient<'_> {
    fn claim(&mut self, req: &Request) -> Result<()> {
        self.fence += 1;
        let meta = self.payload.meta(req, self.fence);
        let expires = (now_ms() + TTL_MS) as i64;
        let changed = self.client.execute(
            &self.claim,
            &[&req.tenant_name(), &ENDPOINT, &req.key, &meta, &expires],
        )?;
        if changed != 1 {
            return fail(format!("postgres: new key {} not claimed", req.key));
        }
        Ok(())
    }

    fn complete(&mut self, req: &Request) -> Result<()> {
        let expires = (now_ms() + TTL_MS) as i64;
        let response = self.payload.response(req);
        let changed = self.client.execute(
            &self.complete,
            &[&response, &expires, &req.tenant_name(), &ENDPOINT, &req.key],
        )?;
        if changed != 1 {
            return fail(format!("postgres: claimed key {} not completed", req.key));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn hex_is_lowercase_pairs() {
        assert_eq!(super::hex(&[0, 0xab, 0x0f]), "00ab0f");
    }
}
