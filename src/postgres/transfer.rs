//! Reading the PostgreSQL engine's records one by one ([`crate::Store::scan`], the export), and
//! importing an export (the line format is `crate::model::moved`).

use super::bridge::block;
use super::pool;
use super::rows::Held;
use super::rows::{db_error, encode_headers, fence_column, response_of, Target};
use super::{schema, PgStore};
use crate::error::{Error, Result};
use crate::model::fingerprint::Fingerprint;
use crate::model::listing::Query;
use crate::model::moved::{Moved, MovedState};
use crate::model::report::PastDamage;
use crate::model::scope::scoped_key;
use std::ops::ControlFlow;

/// Rows read per statement on export, and written per statement on import.
const PAGE: i64 = 1000;

/// The records after the key `$2..$4` (all from the start when `$5`), in key order (the
/// primary key's, so each page is a range of its index), at most `$6`, filtered as the query
/// asks, in the database: the tenant `$7` and the endpoint `$8` (when not null), claimed before
/// `$9` ms (when not null), and of the statuses whose bits `$10` holds (all when 0; the bits
/// are `RecordStatus`'s, and the CASE is `Entry::status_at`). `$1` test clock.
///
/// The pool's sessions plan generically (`plans.rs`), so the key position and the tenant are
/// written into the text ([`scan_text`]) rather than switched on by a parameter: `$5 OR
/// (row) > (...)` left the index unused, and every page read the table from its start (a
/// 1.3M-record export ran 2.6 records a millisecond, slowing as it went; `idemdb stats` took
/// 1.9 s a page).
const SCAN: &str = r#"
WITH t AS (SELECT coalesce($1::bigint, (extract(epoch FROM statement_timestamp()) * 1000)::bigint) AS now)
SELECT r.tenant, r.endpoint, r.key, r.fence, r.fingerprint, r.claimed_at, r.completed,
    r.lease_until, r.completed_at, r.expires_at, r.status, r.headers, r.body, r.orphan, t.now
FROM {s}.records r, t
WHERE {position}
  AND {tenant}
  AND ($8::bytea IS NULL OR r.endpoint = $8::bytea)
  AND ($9::bigint IS NULL OR r.claimed_at < $9::bigint)
  AND ($10::int = 0 OR $10::int & (CASE
        WHEN r.completed AND r.expires_at > t.now THEN 8
        WHEN r.completed THEN 16
        WHEN r.orphan THEN 4
        WHEN r.lease_until <= t.now THEN 2
        ELSE 1 END) <> 0)
ORDER BY r.tenant, r.endpoint, r.key
LIMIT $6"#;

/// [`SCAN`] for the first page (`start`) or a page after a key, with or without a tenant.
pub(super) fn scan_text(start: bool, tenant: bool) -> String {
    // Every parameter stays in the text, so that each has a type.
    let position = if start {
        "$5::boolean AND $2::bytea IS NOT NULL AND $3::bytea IS NOT NULL AND $4::text IS NOT NULL"
    } else {
        "(r.tenant, r.endpoint, r.key) > ($2::bytea, $3::bytea, $4::text) AND NOT $5::boolean"
    };
    let tenant = if tenant {
        "r.tenant = $7::bytea"
    } else {
        "$7::bytea IS NULL"
    };
    SCAN.replace("{position}", position)
        .replace("{tenant}", tenant)
}

/// One page of imported records. In-progress claims arrive without a holder (their tickets
/// were another store's): orphans, as after a restart.
const IMPORT: &str = r#"
INSERT INTO {s}.records (tenant, endpoint, key, fence, fingerprint, claimed_at, completed,
    lease_until, orphan, completed_at, expires_at, status, headers, body)
SELECT tenant, endpoint, key, fence, fingerprint, claimed_at, completed, lease_until,
    NOT completed, completed_at, expires_at, status, headers, body
FROM unnest($1::bytea[], $2::bytea[], $3::text[], $4::bigint[], $5::bytea[], $6::bigint[],
    $7::boolean[], $8::bigint[], $9::bigint[], $10::bigint[], $11::int[], $12::bytea[],
    $13::bytea[])
    AS u(tenant, endpoint, key, fence, fingerprint, claimed_at, completed, lease_until,
        completed_at, expires_at, status, headers, body)"#;

fn column(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn value(v: i64) -> u64 {
    u64::try_from(v).unwrap_or_default()
}

impl PgStore {
    /// Hands the records `query` may want to `each`, in key order, with whether each is an
    /// orphan and the database's time they were judged at, a page (one statement, one
    /// snapshot) at a time, until `each` breaks.
    pub(crate) fn scan_each(
        &self,
        query: &Query,
        mut past_damage: PastDamage<'_>,
        mut each: impl FnMut(Moved, bool, u64) -> ControlFlow<()>,
    ) -> Result<()> {
        let text = |start| {
            let tenant = query.tenant_filter().is_some();
            schema::qualify(&scan_text(start, tenant), &self.shared.schema)
        };
        let tenant = query.tenant_filter().map(|t| t.as_bytes().to_vec());
        let endpoint = query.endpoint_filter().map(|e| e.as_bytes().to_vec());
        // Rounded up: the query's own comparison (at the seam) is exact.
        let before: Option<i64> = query.claimed_before_filter().map(|t| {
            let since = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            let ms = since.as_millis() + u128::from(since.subsec_nanos() % 1_000_000 != 0);
            i64::try_from(ms).unwrap_or(i64::MAX)
        });
        let statuses = i32::from(query.status_bits());
        let mut after: Option<Target> = None;
        loop {
            let adjust = self.shared.adjust();
            let (text, from) = (text(after.is_none()), after.clone());
            let (tenant, endpoint) = (tenant.clone(), endpoint.clone());
            let rows = block(self.shared.task(move |conn| async move {
                let from = from.unwrap_or(Target {
                    tenant: Vec::new(),
                    endpoint: Vec::new(),
                    key: String::new(),
                });
                let start = from.key.is_empty();
                let rows = pool::query(
                    &conn,
                    &text,
                    &[
                        &adjust,
                        &from.tenant,
                        &from.endpoint,
                        &from.key,
                        &start,
                        &PAGE,
                        &tenant,
                        &endpoint,
                        &before,
                        &statuses,
                    ],
                )
                .await
                .map_err(db_error)?;
                rows.iter()
                    .map(|r| {
                        let target = Target::from_row(r)?;
                        let held = Held {
                            fence: r.try_get(3).map_err(db_error)?,
                            fingerprint: r.try_get(4).map_err(db_error)?,
                            claimed_at: r.try_get(5).map_err(db_error)?,
                            completed: r.try_get(6).map_err(db_error)?,
                            lease_until: r.try_get(7).map_err(db_error)?,
                            expires_at: r.try_get(9).map_err(db_error)?,
                            orphan: false,
                            status: r.try_get(10).map_err(db_error)?,
                            headers: r.try_get(11).map_err(db_error)?,
                            body: r.try_get(12).map_err(db_error)?,
                        };
                        let completed_at: Option<i64> = r.try_get(8).map_err(db_error)?;
                        let orphan: bool = r.try_get(13).map_err(db_error)?;
                        let now: i64 = r.try_get(14).map_err(db_error)?;
                        Ok((target, held, completed_at, orphan, value(now)))
                    })
                    .collect::<Result<Vec<_>>>()
            }))?;
            let full = i64::try_from(rows.len()).unwrap_or(i64::MAX) >= PAGE;
            for (target, held, completed_at, orphan, now) in rows {
                let moved = match (moved(&target, &held, completed_at), &mut past_damage) {
                    (Ok(moved), _) => moved,
                    (Err(e @ Error::Corrupted { .. }), Some(damaged)) => {
                        damaged(e);
                        after = Some(target);
                        continue;
                    }
                    (Err(e), _) => return Err(e),
                };
                if each(moved, orphan, now).is_break() {
                    return Ok(());
                }
                after = Some(target);
            }
            if !full {
                return Ok(());
            }
        }
    }

    /// Writes the records of `input` (an export's JSON lines) into this store, which must hold
    /// no record, in one transaction: all of them or none. The lines are read and parsed on the
    /// caller's thread a page at a time, while the engine's thread inserts the page before, so
    /// memory holds a few pages whatever the export's size. The fence sequence then continues
    /// above the largest imported fence. The transaction runs on a connection of its own.
    pub(crate) fn import_lines(&self, input: impl std::io::BufRead) -> Result<u64> {
        let (pages, incoming) = tokio::sync::mpsc::channel::<Page>(2);
        let schema_name = self.shared.schema.clone();
        let context = crate::sync::Arc::clone(&self.shared.context);
        let inserted = self
            .shared
            .task(move |_| async move { insert_pages(&context, &schema_name, incoming).await });
        // A refused line (or a failed read) drops `pages` unfinished: the transaction rolls
        // back, and the caller gets the line's error. A failed insert closes the channel: the
        // caller stops reading and gets the insert's error.
        let send = |page| futures_executor::block_on(pages.send(page)).is_ok();
        let page_len = usize::try_from(PAGE).unwrap_or(1000);
        let (mut columns, mut highest) = (Columns::default(), 0);
        for (n, line) in input.lines().enumerate() {
            let parsed = line.map_err(Error::Io).and_then(|line| {
                let line_no = u64::try_from(n + 1).unwrap_or(u64::MAX);
                if line.trim().is_empty() {
                    return Ok(None);
                }
                Moved::from_line(&line, line_no).map(Some)
            });
            let moved = match parsed {
                Ok(Some(moved)) => moved,
                Ok(None) => continue,
                Err(e) => {
                    drop(pages);
                    let _ = block(inserted);
                    return Err(e);
                }
            };
            highest = highest.max(fence_column(moved.fence));
            columns.push(&moved);
            if columns.key.len() == page_len
                && !send(Page::Rows(Box::new(std::mem::take(&mut columns))))
            {
                return block(inserted);
            }
        }
        if !columns.key.is_empty() && !send(Page::Rows(Box::new(columns))) {
            return block(inserted);
        }
        let _ = send(Page::Done { highest });
        drop(pages);
        block(inserted)
    }
}

/// The record a scanned row holds, decoded and checked.
/// What the caller of an import hands the engine's thread.
enum Page {
    Rows(Box<Columns>),
    /// The input ended well; the fence sequence goes on above `highest`.
    Done {
        highest: i64,
    },
}

/// On the engine's thread: one transaction that refuses a store holding records, inserts each
/// page as it comes, and commits once the input ended well (rolled back otherwise, when it is
/// dropped uncommitted).
async fn insert_pages(
    context: &super::scheduler::Context,
    schema_name: &str,
    mut incoming: tokio::sync::mpsc::Receiver<Page>,
) -> Result<u64> {
    let q = |text: &str| schema::qualify(text, schema_name);
    let mut own = context.pool.connect().await?;
    let tx = own.transaction().await.map_err(db_error)?;
    let occupied = tx
        .query_opt(&q("SELECT 1 FROM {s}.records LIMIT 1"), &[])
        .await
        .map_err(db_error)?;
    if occupied.is_some() {
        return Err(Error::InvalidImport {
            line: 0,
            reason: "the store to import into already holds records".into(),
        });
    }
    let insert = q(IMPORT);
    let mut count = 0u64;
    loop {
        match incoming.recv().await {
            Some(Page::Rows(c)) => {
                tx.execute(
                    &insert,
                    &[
                        &c.tenant,
                        &c.endpoint,
                        &c.key,
                        &c.fence,
                        &c.fingerprint,
                        &c.claimed_at,
                        &c.completed,
                        &c.lease_until,
                        &c.completed_at,
                        &c.expires_at,
                        &c.status,
                        &c.headers,
                        &c.body,
                    ],
                )
                .await
                .map_err(|e| match e.code() {
                    Some(code) if *code == tokio_postgres::error::SqlState::UNIQUE_VIOLATION => {
                        Error::InvalidImport {
                            line: 0,
                            reason: "the input holds one key twice".into(),
                        }
                    }
                    _ => db_error(e),
                })?;
                count += u64::try_from(c.key.len()).unwrap_or(u64::MAX);
            }
            Some(Page::Done { highest }) => {
                tx.query_one(
                    &q("SELECT setval('{s}.fences', greatest($1::bigint, (SELECT last_value FROM {s}.fences)))"),
                    &[&highest],
                )
                .await
                .map_err(db_error)?;
                tx.commit().await.map_err(db_error)?;
                return Ok(count);
            }
            None => {
                return Err(Error::InvalidImport {
                    line: 0,
                    reason: "the input could not be read to its end".into(),
                })
            }
        }
    }
}

fn moved(target: &Target, held: &Held, completed_at: Option<i64>) -> Result<Moved> {
    let scope = target.scope();
    let scoped = scoped_key(&scope, &target.key)?;
    let state = if held.completed {
        MovedState::Completed {
            completed_at: value(completed_at.unwrap_or_default()),
            expires_at: value(held.expires_at.unwrap_or_default()),
            response: response_of(&scoped, held)?,
        }
    } else {
        MovedState::InProgress {
            lease_until: value(held.lease_until.unwrap_or_default()),
        }
    };
    let fingerprint = <[u8; 32]>::try_from(held.fingerprint.as_slice())
        .map(Fingerprint::from_bytes)
        .map_err(|_| Error::Corrupted {
            damaged: crate::error::Damaged::Record {
                fence: Some(value(held.fence)),
                key: Some(target.key.clone()),
            },
            reason: "its fingerprint is not 32 bytes".into(),
        })?;
    Ok(Moved {
        key: target.key.clone(),
        scope,
        fence: value(held.fence),
        fingerprint,
        claimed_at: value(held.claimed_at),
        state,
    })
}

/// A page of records as the import statement's arrays.
#[derive(Default)]
struct Columns {
    tenant: Vec<Vec<u8>>,
    endpoint: Vec<Vec<u8>>,
    key: Vec<String>,
    fence: Vec<i64>,
    fingerprint: Vec<Vec<u8>>,
    claimed_at: Vec<i64>,
    completed: Vec<bool>,
    lease_until: Vec<Option<i64>>,
    completed_at: Vec<Option<i64>>,
    expires_at: Vec<Option<i64>>,
    status: Vec<Option<i32>>,
    headers: Vec<Option<Vec<u8>>>,
    body: Vec<Option<Vec<u8>>>,
}

impl Columns {
    fn push(&mut self, m: &Moved) {
        self.tenant.push(m.scope.tenant().as_bytes().to_vec());
        self.endpoint.push(m.scope.endpoint().as_bytes().to_vec());
        self.key.push(m.key.clone());
        self.fence.push(fence_column(m.fence));
        self.fingerprint.push(m.fingerprint.as_bytes().to_vec());
        self.claimed_at.push(column(m.claimed_at));
        match &m.state {
            MovedState::InProgress { lease_until } => {
                self.completed.push(false);
                self.lease_until.push(Some(column(*lease_until)));
                self.completed_at.push(None);
                self.expires_at.push(None);
                self.status.push(None);
                self.headers.push(None);
                self.body.push(None);
            }
            MovedState::Completed {
                completed_at,
                expires_at,
                response,
            } => {
                self.completed.push(true);
                self.lease_until.push(None);
                self.completed_at.push(Some(column(*completed_at)));
                self.expires_at.push(Some(column(*expires_at)));
                self.status.push(Some(i32::from(response.status)));
                self.headers.push(Some(encode_headers(&response.headers)));
                self.body.push(Some(response.body.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::model::listing::{Query, RecordStatus};

    /// [`super::SCAN`]'s CASE spells the status bits as numbers: they are `RecordStatus`'s.
    #[test]
    fn the_scan_statement_spells_the_status_bits_as_the_query_does() {
        for (status, bit, spelled) in [
            (RecordStatus::InProgress, 1, "ELSE 1 END"),
            (RecordStatus::Stale, 2, "THEN 2"),
            (RecordStatus::Orphan, 4, "THEN 4"),
            (RecordStatus::Completed, 8, "THEN 8"),
            (RecordStatus::Expired, 16, "THEN 16"),
        ] {
            assert_eq!(Query::all().status(status).status_bits(), bit, "{status}");
            assert!(super::SCAN.contains(spelled), "{spelled}");
        }
    }
}
