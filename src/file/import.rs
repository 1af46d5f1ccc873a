//! Importing an export into a new store file: every record in one durable redb commit, made
//! under a temporary name and linked into place, so the path holds all of them or nothing.

use crate::config::Config;
use crate::error::{Error, Result};
use crate::file::batch;
use crate::file::hashing::Hashing;
use crate::file::heads::HEADS;
use crate::file::layout;
use crate::file::layout::{FENCE_KEY, MAX_FENCE, META, RECORDS};
use crate::file::open;
use crate::file::record::{Packing, Record, RecordState, StoredResponse};
use crate::file::store::FileStore;
use crate::model::moved::{Moved, MovedState};
use crate::model::scope::scoped_key;
use std::collections::hash_map::RandomState;
use std::collections::HashSet;
use std::hash::BuildHasher;
use std::path::Path;

fn refused(line: u64, reason: impl Into<String>) -> Error {
    Error::InvalidImport {
        line,
        reason: reason.into(),
    }
}

/// Creates the store file at `path`, which must not exist, holding the records exported to
/// `input`, and opens it; returns it and how many records it holds. Claims in progress arrive
/// as orphans, as after a restart; the store's next fences are above every imported one.
///
/// The input is read a line at a time into one write transaction, so memory holds one line,
/// redb's dirty pages and a 16-byte digest per key (to refuse a key twice), not the export.
pub(crate) fn new_file(
    config: Config,
    path: &Path,
    input: impl std::io::BufRead,
) -> Result<(FileStore, u64)> {
    if path.try_exists()? {
        return Err(refused(
            0,
            format!(
                "{} exists: a file store imports only into a new file (move the old one away, \
                 or import into a PostgreSQL store)",
                path.display()
            ),
        ));
    }
    let mut imported = 0;
    let created = open::create_atomically(path, |db| {
        imported = write(db, input, config.packing())?;
        Ok(())
    })?;
    if !created {
        return Err(refused(
            0,
            format!(
                "{} was created by another process during the import",
                path.display()
            ),
        ));
    }
    Ok((open::file(config, path)?, imported))
}

/// Writes every record of `input` in one durable commit; nothing is committed if any line is
/// refused.
fn write(db: &redb::Database, input: impl std::io::BufRead, packing: Packing) -> Result<u64> {
    let secret = layout::meta(db)?
        .secret
        .expect("a new store file has its secret");
    let hashing = Hashing::new(secret);
    let mut txn = db.begin_write()?;
    batch::quick_repair(&mut txn);
    let digest = KeyDigest::new();
    let mut keys = HashSet::new();
    let (mut highest, mut imported) = (0, 0);
    {
        let mut table = txn.open_table(RECORDS)?;
        let mut heads = txn.open_table(HEADS)?;
        for (n, line) in input.lines().enumerate() {
            let line_no = u64::try_from(n + 1).unwrap_or(u64::MAX);
            let line = line.map_err(Error::Io)?;
            if line.trim().is_empty() {
                continue;
            }
            let m = Moved::from_line(&line, line_no)?;
            let Encoded { key, value } =
                encode(&m, packing).map_err(|why| refused(line_no, why))?;
            if !keys.insert(digest.of(&key)) {
                return Err(refused(
                    line_no,
                    format!("the key {:?} is in the input twice", m.key),
                ));
            }
            if table.insert(m.fence, value.as_slice())?.is_some() {
                return Err(refused(
                    line_no,
                    format!("fence {} is in the input twice", m.fence),
                ));
            }
            heads.insert(m.fence, batch::head_of(&hashing, m.fence, &value)?)?;
            highest = highest.max(m.fence);
            imported += 1;
        }
        txn.open_table(META)?.insert(FENCE_KEY, highest)?;
    }
    layout::write_record_count(&txn)?;
    txn.commit()?;
    layout::meta(db)?;
    Ok(imported)
}

/// A record as the store file holds it.
struct Encoded {
    key: Box<[u8]>,
    value: Vec<u8>,
}

/// A record's scoped key and encoded value.
fn encode(m: &Moved, packing: Packing) -> std::result::Result<Encoded, String> {
    let key = scoped_key(&m.scope, &m.key).map_err(|e| e.to_string())?;
    if m.fence == 0 || m.fence > MAX_FENCE {
        return Err(format!("fence {} is out of range", m.fence));
    }
    let state = match &m.state {
        MovedState::InProgress { lease_until } => RecordState::InProgress {
            lease_until: *lease_until,
        },
        MovedState::Completed {
            completed_at,
            expires_at,
            response,
        } => RecordState::Completed {
            completed_at: *completed_at,
            expires_at: *expires_at,
            response: StoredResponse::from(response.clone()),
        },
    };
    let record = Record {
        fence: m.fence,
        fingerprint: *m.fingerprint.as_bytes(),
        claimed_at: m.claimed_at,
        state,
    };
    Ok(Encoded {
        value: record.encode(&key, packing),
        key,
    })
}

/// A 128-bit digest of a scoped key under two random keys: two keys of one import share one
/// by chance with probability about n²/2¹²⁹ (10⁻²⁶ at ten million), and an input cannot be
/// made to collide, since the keys are drawn per import.
struct KeyDigest(RandomState, RandomState);

impl KeyDigest {
    fn new() -> KeyDigest {
        KeyDigest(RandomState::new(), RandomState::new())
    }

    fn of(&self, key: &[u8]) -> u128 {
        u128::from(self.0.hash_one(key)) << 64 | u128::from(self.1.hash_one(key))
    }
}
