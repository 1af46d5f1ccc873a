//! naive-redb: what one would write with redb alone. One write transaction per operation,
//! committed with redb's default (`Immediate`) durability: one fsync each.

use super::{fail, Client, Result, Setup, System};
use crate::workload::{Payload, Request};
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use std::path::PathBuf;

/// The only table: `tenant:endpoint:key` -> value (claim metadata, then the response).
const CLAIMS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("claims");
/// Inserts per preload transaction.
const PRELOAD_BATCH: u64 = 100_000;

pub struct RedbSystem {
    db: Database,
    payload: Payload,
    dir: PathBuf,
}

impl RedbSystem {
    /// Creates the database and preloads `keys` completed records, 100k per transaction.
    pub fn open(setup: &Setup, keys: u64) -> Result<RedbSystem> {
        std::fs::create_dir_all(&setup.dir)?;
        let db = Database::create(setup.dir.join("naive.redb"))?;
        let mut requests = setup.preload_requests();
        let mut done = 0;
        let started = std::time::Instant::now();
        loop {
            let txn = db.begin_write()?;
            {
                let mut table = txn.open_table(CLAIMS)?;
                let batch = PRELOAD_BATCH.min(keys - done);
                for _ in 0..batch {
                    let req = requests.next_request();
                    let value = setup.payload.completed_value(&req, done);
                    if table
                        .insert(req.flat_key().as_bytes(), value.as_slice())?
                        .is_some()
                    {
                        return fail("naive-redb preload: duplicate key");
                    }
                    done += 1;
                }
            }
            txn.commit()?;
            setup.preload_step("naive-redb", done, keys, started)?;
            if done == keys {
                break;
            }
        }
        // Every preloaded key must be there, once.
        let count = db.begin_read()?.open_table(CLAIMS)?.len()?;
        if count != keys {
            return fail(format!("naive-redb preload: {count} records, not {keys}"));
        }
        Ok(RedbSystem {
            db,
            payload: setup.payload.clone(),
            dir: setup.dir.clone(),
        })
    }
}

impl System for RedbSystem {
    fn client(&self) -> Result<Box<dyn Client + '_>> {
        Ok(Box::new(RedbClient {
            system: self,
            fence: 0,
        }))
    }

    fn destroy(self: Box<Self>) -> Result<()> {
        let dir = self.dir.clone();
        drop(self);
        std::fs::remove_dir_all(dir)?;
        Ok(())
    }
}

struct RedbClient<'a> {
    system: &'a RedbSystem,
    fence: u64,
}

impl Client for RedbClient<'_> {
    /// One write transaction: `get` the key, insert the ~100-byte value if absent, commit.
    fn claim(&mut self, req: &Request) -> Result<()> {
        self.fence += 1;
        let key = req.flat_key();
        let value = self.system.payload.meta(req, self.fence);
        let txn = self.system.db.begin_write()?;
        {
            let mut table = txn.open_table(CLAIMS)?;
            if table.get(key.as_bytes())?.is_some() {
                return fail(format!("naive-redb: new key {key} already present"));
            }
            table.insert(key.as_bytes(), value.as_slice())?;
        }
        txn.commit()?;
        Ok(())
    }

    /// Another write transaction overwriting the value with metadata and response.
    fn complete(&mut self, req: &Request) -> Result<()> {
        let key = req.flat_key();
        let value = self.system.payload.completed_value(req, self.fence);
        let txn = self.system.db.begin_write()?;
        {
            let mut table = txn.open_table(CLAIMS)?;
            if table.insert(key.as_bytes(), value.as_slice())?.is_none() {
                return fail(format!("naive-redb: completed key {key} was not claimed"));
            }
        }
        txn.commit()?;
        Ok(())
    }
}
