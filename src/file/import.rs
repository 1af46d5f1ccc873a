//! Importing an export into a new store file: every record in one durable redb commit, made
//! under a temporary name and linked into place, so the path holds all of them or nothing.

use crate::config::Config;
use crate::error::{Error, Result};
use crate::file::disk::{self, expiry_key, EXPIRY, FENCE_KEY, MAX_FENCE, META, RECORDS};
use crate::file::open;
use crate::file::store::FileStore;
use crate::listing::{Moved, MovedState};
use crate::record::{Record, RecordState, StoredResponse};
use crate::scope::scoped_key;
use std::collections::HashSet;
use std::path::Path;

fn refused(reason: impl Into<String>) -> Error {
    Error::InvalidImport {
        line: 0,
        reason: reason.into(),
    }
}

/// Creates the store file at `path`, which must not exist, holding `records`, and opens it.
/// Claims in progress arrive as orphans, as after a restart; the store's next fences are above
/// every imported one. Returns the store and how many records it imported.
pub(crate) fn new_file(config: Config, path: &Path, records: &[Moved]) -> Result<FileStore> {
    if path.try_exists()? {
        return Err(refused(format!(
            "{} exists: a file store imports only into a new file (move the old one away, or \
             import into a PostgreSQL store)",
            path.display()
        )));
    }
    let encoded = encode(records)?;
    let created = open::create_atomically(path, |db| write(db, &encoded))?;
    if !created {
        return Err(refused(format!(
            "{} was created by another process during the import",
            path.display()
        )));
    }
    open::file(config, path)
}

struct Encoded {
    fence: u64,
    key: Box<[u8]>,
    value: Vec<u8>,
    expires_at: Option<u64>,
}

/// Checks and encodes every record before anything is written: a key or fence twice, or a
/// fence out of range, refuses the whole import.
fn encode(records: &[Moved]) -> Result<Vec<Encoded>> {
    let mut keys = HashSet::with_capacity(records.len());
    let mut fences = HashSet::with_capacity(records.len());
    records
        .iter()
        .map(|m| {
            let key = scoped_key(&m.scope, &m.key).map_err(|e| refused(e.to_string()))?;
            if m.fence == 0 || m.fence > MAX_FENCE {
                return Err(refused(format!("fence {} is out of range", m.fence)));
            }
            if !fences.insert(m.fence) {
                return Err(refused(format!("the input holds fence {} twice", m.fence)));
            }
            if !keys.insert(key.clone()) {
                return Err(refused(format!(
                    "the input holds the key {:?} twice",
                    m.key
                )));
            }
            let (state, expires_at) = match &m.state {
                MovedState::InProgress { lease_until } => (
                    RecordState::InProgress {
                        lease_until: *lease_until,
                    },
                    None,
                ),
                MovedState::Completed {
                    completed_at,
                    expires_at,
                    response,
                } => (
                    RecordState::Completed {
                        completed_at: *completed_at,
                        expires_at: *expires_at,
                        response: StoredResponse::from(response.clone()),
                    },
                    Some(*expires_at),
                ),
            };
            let record = Record {
                fence: m.fence,
                fingerprint: *m.fingerprint.as_bytes(),
                claimed_at: m.claimed_at,
                state,
            };
            Ok(Encoded {
                fence: m.fence,
                value: record.encode(&key),
                key,
                expires_at,
            })
        })
        .collect()
}

fn write(db: &redb::Database, records: &[Encoded]) -> Result<()> {
    let txn = db.begin_write()?;
    {
        let mut table = txn.open_table(RECORDS)?;
        let mut expiry = txn.open_table(EXPIRY)?;
        for r in records {
            table.insert(r.fence, r.value.as_slice())?;
            if let Some(t) = r.expires_at {
                expiry.insert(expiry_key(t, r.fence), &*r.key)?;
            }
        }
        let highest = records.iter().map(|r| r.fence).max().unwrap_or(0);
        txn.open_table(META)?.insert(FENCE_KEY, highest)?;
    }
    txn.commit()?;
    let _ = disk::meta(db)?;
    Ok(())
}
