//! Keys as columns and rows as records: what the statements take and return, decoded and
//! checked, and the driver's errors as the crate's.

use crate::clock::{duration_millis, from_millis};
use crate::error::{Damaged, Error, Result};
use crate::model::fingerprint::Fingerprint;
use crate::model::response::Response;
use crate::model::scope::{display_scoped_key, scoped_key_parts, Scope};
use std::collections::HashMap;
use std::time::{Duration, SystemTime};
use tokio_postgres::Row;

/// A key as the table's columns.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) tenant: Vec<u8>,
    pub(crate) endpoint: Vec<u8>,
    pub(crate) key: String,
}

impl Target {
    pub(super) fn of(scoped: &[u8]) -> Target {
        let (tenant, endpoint, key) =
            scoped_key_parts(scoped).expect("a scoped key made by scoped_key splits");
        Target {
            tenant: tenant.as_bytes().to_vec(),
            endpoint: endpoint.as_bytes().to_vec(),
            key: key.to_owned(),
        }
    }

    /// The key in the first three columns of `row` (tenant, endpoint, key).
    pub(super) fn from_row(row: &tokio_postgres::Row) -> Result<Target> {
        Ok(Target {
            tenant: row.try_get(0).map_err(db_error)?,
            endpoint: row.try_get(1).map_err(db_error)?,
            key: row.try_get(2).map_err(db_error)?,
        })
    }

    pub(super) fn scope(&self) -> Scope {
        Scope::new(
            String::from_utf8_lossy(&self.tenant),
            String::from_utf8_lossy(&self.endpoint),
        )
    }
}

/// A client library error as ours: the server's message with its detail and hint, or the
/// client's error with its causes, as text; the driver's error itself kept beside it.
pub(crate) fn db_error(e: tokio_postgres::Error) -> Error {
    let sqlstate = e.code().map(|c| c.code().to_owned());
    let reason = match e.as_db_error() {
        Some(db) => {
            let mut reason = format!("{}: {}", db.severity(), db.message());
            if let Some(detail) = db.detail() {
                reason.push_str(&format!(" (detail: {detail})"));
            }
            if let Some(hint) = db.hint() {
                reason.push_str(&format!(" (hint: {hint})"));
            }
            reason
        }
        None => {
            let mut reason = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                reason.push_str(": ");
                reason.push_str(&s.to_string());
                source = s.source();
            }
            reason
        }
    };
    Error::Database {
        sqlstate,
        reason,
        driver: Some(std::sync::Arc::new(e)),
    }
}

/// The same database error again, for every caller of a failed batch.
pub(crate) fn again(e: &Error) -> Error {
    match e {
        Error::Database {
            sqlstate,
            reason,
            driver,
        } => Error::Database {
            sqlstate: sqlstate.clone(),
            reason: reason.clone(),
            driver: driver.clone(),
        },
        other => Error::Database {
            sqlstate: None,
            reason: other.to_string(),
            driver: None,
        },
    }
}

pub(super) fn fence_column(fence: u64) -> i64 {
    i64::try_from(fence).unwrap_or(i64::MAX)
}

pub(super) fn fence_of(column: i64) -> u64 {
    u64::try_from(column).unwrap_or_default()
}

pub(super) fn time_of(ms: i64) -> SystemTime {
    from_millis(u64::try_from(ms).unwrap_or_default())
}

pub(super) fn millis_column(d: Duration) -> i64 {
    i64::try_from(duration_millis(d)).unwrap_or(i64::MAX)
}

type HeaderList = Vec<(String, Vec<u8>)>;

fn header_config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<{ crate::model::response::MAX_RESPONSE_LIMIT }>()
}

pub(super) fn encode_headers(headers: &HeaderList) -> Vec<u8> {
    bincode::encode_to_vec(headers, header_config()).expect("encoding into a Vec cannot fail")
}

pub(super) fn damaged(scoped: &[u8], record: &Held, reason: impl Into<String>) -> Error {
    Error::Corrupted {
        damaged: Damaged::Record {
            fence: Some(fence_of(record.fence)),
            key: Some(display_scoped_key(scoped)),
        },
        reason: reason.into(),
    }
}

pub(super) fn response_of(scoped: &[u8], record: &Held) -> Result<Response> {
    let status = record
        .status
        .and_then(|s| u16::try_from(s).ok())
        .ok_or_else(|| damaged(scoped, record, "a completed record has no valid status"))?;
    let headers: HeaderList = match &record.headers {
        Some(bytes) => {
            let (headers, used) = bincode::decode_from_slice(bytes, header_config())
                .map_err(|e| damaged(scoped, record, format!("its headers do not decode: {e}")))?;
            if used != bytes.len() {
                return Err(damaged(scoped, record, "its headers have trailing bytes"));
            }
            headers
        }
        None => return Err(damaged(scoped, record, "a completed record has no headers")),
    };
    Ok(Response {
        status,
        headers,
        body: record.body.clone().unwrap_or_default(),
    })
}

pub(super) fn fingerprint_of(scoped: &[u8], record: &Held) -> Result<Fingerprint> {
    <[u8; 32]>::try_from(record.fingerprint.as_slice())
        .map(Fingerprint::from_bytes)
        .map_err(|_| damaged(scoped, record, "its fingerprint is not 32 bytes"))
}

/// What one claim statement returned for one key.
#[derive(Debug)]
pub(crate) enum ClaimRow {
    /// This claim took the key.
    Won {
        fence: i64,
        claimed_at: i64,
        lease_until: i64,
        /// The in-progress claim it took over: (fence, claimed_at, orphan).
        replaced: Option<(i64, i64, bool)>,
    },
    /// Another claim or a completion holds the key: the record as the statement saw it.
    Held { now: i64, record: Held },
}

/// A record another claim holds, as a claim statement or a read saw it.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub(crate) fence: i64,
    pub(crate) fingerprint: Vec<u8>,
    pub(crate) claimed_at: i64,
    pub(crate) completed: bool,
    pub(crate) lease_until: Option<i64>,
    pub(crate) expires_at: Option<i64>,
    pub(crate) orphan: bool,
    pub(crate) status: Option<i32>,
    pub(crate) headers: Option<Vec<u8>>,
    pub(crate) body: Option<Vec<u8>>,
}

/// Reads one row of [`sql::CLAIM`]: the key it took (borrowed from the row: no copy per
/// claim) and the claim.
pub(super) fn won_row(row: &Row) -> Result<(KeyRef<'_>, ClaimRow)> {
    let get = |e: tokio_postgres::Error| db_error(e);
    let key = (
        row.try_get::<_, &[u8]>(0).map_err(get)?,
        row.try_get::<_, &[u8]>(1).map_err(get)?,
        row.try_get::<_, &str>(2).map_err(get)?.as_bytes(),
    );
    let replaced = match row.try_get::<_, Option<bool>>(9).map_err(get)? {
        Some(true) => Some((
            row.try_get::<_, Option<i64>>(6)
                .map_err(get)?
                .unwrap_or_default(),
            row.try_get::<_, Option<i64>>(7)
                .map_err(get)?
                .unwrap_or_default(),
            row.try_get::<_, Option<bool>>(8)
                .map_err(get)?
                .unwrap_or_default(),
        )),
        _ => None,
    };
    Ok((
        key,
        ClaimRow::Won {
            fence: row.try_get(3).map_err(get)?,
            claimed_at: row.try_get(4).map_err(get)?,
            lease_until: row.try_get(5).map_err(get)?,
            replaced,
        },
    ))
}

/// Reads the row of [`sql::CLAIM_NEW`]: a fresh claim, its lease `lease_ms` long.
pub(super) fn new_row(row: &Row, lease_ms: i64) -> Result<ClaimRow> {
    let fence = row.try_get(0).map_err(db_error)?;
    let claimed_at: i64 = row.try_get(1).map_err(db_error)?;
    Ok(ClaimRow::Won {
        fence,
        claimed_at,
        lease_until: claimed_at.saturating_add(lease_ms),
        replaced: None,
    })
}

/// Reads one row of [`sql::GET`] or [`sql::HELD`]: the database's time and the key's record,
/// if it has one.
pub(crate) fn record_row(row: &Row) -> Result<(i64, Option<Held>)> {
    let get = |e: tokio_postgres::Error| db_error(e);
    let now: i64 = row.try_get(0).map_err(get)?;
    let Some(fence) = row.try_get::<_, Option<i64>>(1).map_err(get)? else {
        return Ok((now, None));
    };
    let held = Held {
        fence,
        fingerprint: row.try_get(2).map_err(get)?,
        claimed_at: row.try_get(3).map_err(get)?,
        completed: row.try_get(4).map_err(get)?,
        lease_until: row.try_get(5).map_err(get)?,
        expires_at: row.try_get(6).map_err(get)?,
        orphan: row
            .try_get::<_, Option<bool>>(7)
            .map_err(get)?
            .unwrap_or_default(),
        status: row.try_get(8).map_err(get)?,
        headers: row.try_get(9).map_err(get)?,
        body: row.try_get(10).map_err(get)?,
    };
    Ok((now, Some(held)))
}

/// A key's columns as [`by_key`] orders them, borrowed.
pub(super) type KeyRef<'a> = (&'a [u8], &'a [u8], &'a [u8]);

/// The time each row a statement returned carries, by its fence.
pub(super) fn fenced_rows(
    result: std::result::Result<Vec<Row>, tokio_postgres::Error>,
) -> Result<HashMap<i64, i64>> {
    let rows = result.map_err(db_error)?;
    rows.iter()
        .map(|r| {
            Ok((
                r.try_get(0).map_err(db_error)?,
                r.try_get(1).map_err(db_error)?,
            ))
        })
        .collect()
}
