//! Reaping stale claims, resolving one, purging expired records, counting the table.

use super::bridge::block;
use super::pool::{execute, query, query_one};
use super::rows::{
    db_error, encode_headers, fence_column, fence_of, fingerprint_of, time_of, Target,
};
use super::{schema, sql, PgStore};
use crate::error::{Damaged, Error, Result};
use crate::model::census::{Census, OldestClaim};
use crate::model::claim::{Resolution, StaleClaim};
use crate::model::fingerprint::Fingerprint;
use crate::model::listing::RecordStatus;
use crate::model::report::Tally;
use crate::model::scope::{scoped_key, Scope};
use futures_channel::oneshot;

/// How many stale claims one reap reads at a time, and expired records one purge statement
/// deletes: bounded, so no statement holds many row locks for long.
const CHUNK: i64 = 1000;

impl PgStore {
    pub(crate) fn record_count(&self) -> Result<u64> {
        let text = schema::qualify(sql::COUNT, &self.shared.schema);
        let count = block(self.shared.task(move |conn| async move {
            let row = query_one(&conn, &text, &[]).await.map_err(db_error)?;
            row.try_get::<_, i64>(0).map_err(db_error)
        }))?;
        Ok(u64::try_from(count).unwrap_or_default())
    }

    /// [`crate::Store::census`]: two statements, each one pass in the database.
    pub(crate) fn census(&self) -> Result<Census> {
        let (census, oldest) = (
            schema::qualify(sql::CENSUS, &self.shared.schema),
            schema::qualify(sql::OLDEST_CLAIM, &self.shared.schema),
        );
        let adjust = self.shared.adjust();
        block(self.shared.task(move |conn| async move {
            let mut out = Census::default();
            for row in query(&conn, &census, &[&adjust]).await.map_err(db_error)? {
                let tenant: Vec<u8> = row.try_get(0).map_err(db_error)?;
                let status: i32 = row.try_get(1).map_err(db_error)?;
                let count: i64 = row.try_get(2).map_err(db_error)?;
                let bytes: i64 = row.try_get(3).map_err(db_error)?;
                let fence: i64 = row.try_get(4).map_err(db_error)?;
                let fence = fence_of(fence);
                // The CASE yields 0 to 4.
                let status = RecordStatus::ALL[usize::try_from(status).unwrap_or(0).min(4)];
                let count = u64::try_from(count).unwrap_or_default();
                out.count(&String::from_utf8_lossy(&tenant), status, count);
                out.response_bytes += u64::try_from(bytes).unwrap_or_default();
                out.highest_fence = out.highest_fence.max(fence);
            }
            if let Some(row) = query(&conn, &oldest, &[]).await.map_err(db_error)?.first() {
                let target = Target::from_row(row)?;
                out.oldest_claim = Some(OldestClaim {
                    scope: target.scope(),
                    fence: fence_of(row.try_get(3).map_err(db_error)?),
                    claimed_at: time_of(row.try_get(4).map_err(db_error)?),
                    key: target.key,
                });
            }
            Ok(out)
        }))
    }

    pub(crate) fn reap(
        &self,
        mut resolver: impl FnMut(&StaleClaim) -> Result<Resolution>,
    ) -> Tally {
        let mut after = 0i64;
        let mut resolved = 0;
        loop {
            let page = match block(self.stale_page(after)) {
                Ok(page) => page,
                Err(e) => return Tally::failed(e),
            };
            let full = i64::try_from(page.len()).unwrap_or(i64::MAX) >= CHUNK;
            for stale in page {
                after = stale.fence;
                let decision = match resolver(&stale.claim()) {
                    Ok(decision) => decision,
                    Err(e) => return Tally::of(resolved, Err(e)),
                };
                match block(self.resolve_stale(stale, decision)) {
                    Ok(true) => resolved += 1,
                    Ok(false) => {}
                    Err(e) => return Tally::failed(e),
                }
            }
            if !full {
                break;
            }
        }
        Tally::of(resolved, Ok(()))
    }

    /// Resolves the stale claim of `key` with `fence`, if it is one, as `resolution` (a
    /// release or a completion; the seam answers `Keep` itself): see [`crate::Store::resolve`].
    /// The record is read first (is it that stale claim?), then resolved only if its lease is
    /// still the one read.
    pub(crate) fn resolve(
        &self,
        scope: &Scope,
        key: &str,
        fence: u64,
        resolution: Resolution,
    ) -> Result<bool> {
        let scoped = scoped_key(scope, key)?;
        let (now, held) = block(self.read(&scoped))?;
        let Some(record) = held else {
            return Ok(false);
        };
        let lease_until = record.lease_until.unwrap_or(now);
        let stale = !record.completed && (record.orphan || lease_until <= now);
        if record.fence != fence_column(fence) || !stale {
            return Ok(false);
        }
        let stale = Stale {
            fingerprint: fingerprint_of(&scoped, &record)?,
            target: Target::of(&scoped),
            fence: record.fence,
            claimed_at: record.claimed_at,
            lease_until,
            orphan: record.orphan,
        };
        block(self.resolve_stale(stale, resolution))
    }

    fn stale_page(&self, after: i64) -> oneshot::Receiver<Result<Vec<Stale>>> {
        let text = schema::qualify(sql::STALE, &self.shared.schema);
        let adjust = self.shared.adjust();
        let owner = self.shared.context.params.owner.clone();
        let incarnation = self.shared.context.params.incarnation;
        self.shared.task(move |conn| async move {
            let rows = query(
                &conn,
                &text,
                &[&adjust, &owner, &incarnation, &CHUNK, &after],
            )
            .await
            .map_err(db_error)?;
            rows.iter()
                .map(|r| {
                    let target = Target::from_row(r)?;
                    let fingerprint: Vec<u8> = r.try_get(4).map_err(db_error)?;
                    let fingerprint = <[u8; 32]>::try_from(fingerprint.as_slice())
                        .map(Fingerprint::from_bytes)
                        .map_err(|_| Error::Corrupted {
                            damaged: Damaged::Record {
                                fence: None,
                                key: Some(target.key.clone()),
                            },
                            reason: "a stored fingerprint is not 32 bytes".into(),
                        })?;
                    Ok(Stale {
                        target,
                        fence: r.try_get(3).map_err(db_error)?,
                        fingerprint,
                        claimed_at: r.try_get(5).map_err(db_error)?,
                        lease_until: r.try_get(6).map_err(db_error)?,
                        orphan: r
                            .try_get::<_, Option<bool>>(7)
                            .map_err(db_error)?
                            .unwrap_or_default(),
                    })
                })
                .collect()
        })
    }

    /// Applies a reap's decision to the claim as the resolver saw it; `false` if it changed
    /// meanwhile (left as it is).
    fn resolve_stale(&self, stale: Stale, decision: Resolution) -> oneshot::Receiver<Result<bool>> {
        let schema = self.shared.schema.clone();
        let adjust = self.shared.adjust();
        let ttl = self.shared.context.params.ttl_ms;
        self.shared.task(move |conn| async move {
            let t = &stale.target;
            let changed = match decision {
                Resolution::Keep => 0,
                Resolution::Release => execute(
                    &conn,
                    &schema::qualify(sql::REAP_RELEASE, &schema),
                    &[
                        &t.tenant,
                        &t.endpoint,
                        &t.key,
                        &stale.fence,
                        &stale.lease_until,
                    ],
                )
                .await
                .map_err(db_error)?,
                Resolution::Complete(response) => execute(
                    &conn,
                    &schema::qualify(sql::REAP_COMPLETE, &schema),
                    &[
                        &adjust,
                        &t.tenant,
                        &t.endpoint,
                        &t.key,
                        &stale.fence,
                        &stale.lease_until,
                        &i32::from(response.status),
                        &encode_headers(&response.headers),
                        &response.body,
                        &ttl,
                    ],
                )
                .await
                .map_err(db_error)?,
            };
            Ok(changed == 1)
        })
    }

    pub(crate) fn purge_expired(&self) -> Tally {
        let mut purged = 0;
        loop {
            let text = schema::qualify(sql::PURGE, &self.shared.schema);
            let adjust = self.shared.adjust();
            let deleted = block(self.shared.task(move |conn| async move {
                execute(&conn, &text, &[&adjust, &CHUNK])
                    .await
                    .map_err(db_error)
            }));
            let n = match deleted {
                Ok(n) => n,
                Err(e) => return Tally::failed(e),
            };
            purged += usize::try_from(n).unwrap_or(usize::MAX);
            if i64::try_from(n).unwrap_or(i64::MAX) < CHUNK {
                return Tally::of(purged, Ok(()));
            }
        }
    }
}

/// A stale claim as a reap reads it.
struct Stale {
    target: Target,
    fence: i64,
    fingerprint: Fingerprint,
    claimed_at: i64,
    lease_until: i64,
    orphan: bool,
}

impl Stale {
    /// The claim as a resolver sees it.
    pub(super) fn claim(&self) -> StaleClaim {
        StaleClaim {
            scope: self.target.scope(),
            key: self.target.key.clone(),
            fence: fence_of(self.fence),
            fingerprint: self.fingerprint,
            claimed_at: time_of(self.claimed_at),
            lease_deadline: time_of(self.lease_until),
            orphan: self.orphan,
        }
    }
}
