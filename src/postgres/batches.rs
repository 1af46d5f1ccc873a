//! One batch's statements: the jobs of a batch, sorted by kind, become one statement per kind
//! (claims, completions, releases, extensions, orphan marks), sent together and run as one
//! pipeline on the batch's connection; each statement is its own transaction, committed before
//! its callers are answered.

use super::pool::{execute, query, Conn};
use super::rows::{
    again, db_error, fenced_rows, new_row, record_row, won_row, ClaimRow, Held, KeyRef, Target,
};
use super::scheduler::{CompleteItem, Context, ExtendItem, Fenced, Reply, Sorted};
use crate::error::{Error, Result};
use crate::sync::{Arc, Ordering};
use futures_channel::oneshot;
use std::collections::HashMap;
use tokio_postgres::types::ToSql;

/// How many times a batch looks again for a claim whose key another session wrote after the
/// statement's snapshot (see [`sql::CLAIM`]) before giving up with an error.
const MAX_CLAIM_ROUNDS: usize = 64;

/// Runs the jobs of a batch on `conn` (or answers them all with the error that kept it from
/// opening).
pub(crate) async fn run_sorted(context: &Context, conn: Result<Arc<Conn>>, mut sorted: Sorted) {
    let tasks = std::mem::take(&mut sorted.tasks);
    let conn = match conn {
        Ok(conn) => conn,
        Err(e) => {
            for task in tasks {
                task(Err(again(&e))).await;
            }
            return fail_all(sorted, &e);
        }
    };
    // Sent in this order on the connection's pipeline: what ends or marks claims first, so
    // that the batch's claims see it.
    tokio::join!(
        biased;
        abandons(&conn, sorted.abandons),
        releases(context, &conn, sorted.releases),
        completes(context, &conn, sorted.completes),
        extends(context, &conn, sorted.extends),
        claims(context, &conn, sorted.claims),
        async {
            for task in tasks {
                task(Ok(Arc::clone(&conn))).await;
            }
        },
    );
}

/// Answers every job of a batch that could not get a connection.
fn fail_all(sorted: Sorted, e: &Error) {
    for (_, _, reply) in sorted.claims {
        let _ = reply.send(Err(again(e)));
    }
    for (.., reply) in sorted.completes {
        let _ = reply.send(Err(again(e)));
    }
    for (_, reply) in sorted.releases {
        if let Some(reply) = reply {
            let _ = reply.send(Err(again(e)));
        }
    }
    for (.., reply) in sorted.extends {
        if let Some(reply) = reply {
            let _ = reply.send(Err(again(e)));
        }
    }
}

/// Takes from `pending` the jobs of the next statement: the first of each key, in key order;
/// the rest stay for a later statement (one statement may not change a row twice). The sort
/// is stable, so a key's jobs keep their queue order, and it puts duplicates side by side:
/// no set of keys is built.
fn next_round<T>(pending: &mut Vec<T>, target: impl Fn(&T) -> &Target) -> Vec<T> {
    pending.sort_by(|a, b| by_key(target(a), target(b)));
    let mut round: Vec<T> = Vec::with_capacity(pending.len());
    let mut later = Vec::new();
    for item in pending.drain(..) {
        if round
            .last()
            .is_some_and(|first| by_key(target(first), target(&item)).is_eq())
        {
            later.push(item);
        } else {
            round.push(item);
        }
    }
    *pending = later;
    round
}

/// One order for the keys of every batch: batches that lock rows in a common order deadlock
/// less (and a deadlock, which undoes the statement, is retried).
pub(super) fn by_key(a: &Target, b: &Target) -> std::cmp::Ordering {
    key_of(a).cmp(&key_of(b))
}

fn key_of(t: &Target) -> KeyRef<'_> {
    (&t.tenant, &t.endpoint, t.key.as_bytes())
}

/// The key columns of a batch, as arrays.
pub(super) fn columns<'a>(
    targets: impl Iterator<Item = &'a Target>,
) -> (Vec<&'a [u8]>, Vec<&'a [u8]>, Vec<&'a str>) {
    let mut out = (Vec::new(), Vec::new(), Vec::new());
    for t in targets {
        out.0.push(t.tenant.as_slice());
        out.1.push(t.endpoint.as_slice());
        out.2.push(t.key.as_str());
    }
    out
}

pub(super) async fn claims(
    context: &Context,
    conn: &Conn,
    mut pending: Vec<(Target, [u8; 32], Reply<ClaimRow>)>,
) {
    let p = &context.params;
    for round_number in 0..MAX_CLAIM_ROUNDS {
        if pending.is_empty() {
            return;
        }
        let round = next_round(&mut pending, |c| &c.0);
        let answers = match decide_round(context, conn, &round, round_number == 0).await {
            Ok(answers) => answers,
            Err(e) => {
                for (.., reply) in round.into_iter().chain(pending) {
                    let _ = reply.send(Err(again(&e)));
                }
                return;
            }
        };
        // What each decided key now holds, for the claims of the same key this statement
        // could not take (one statement changes a row once); only kept when there are some.
        let duplicates = !pending.is_empty();
        let mut decided: HashMap<KeyColumns, (i64, Held)> = HashMap::new();
        for ((target, fingerprint, reply), answer) in round.into_iter().zip(answers) {
            match answer {
                Ok(Some(answer)) if settled(&answer, &fingerprint, p.take_over) => {
                    let holds = duplicates.then(|| holding(&answer, &fingerprint));
                    match reply.send(Ok(answer)) {
                        Ok(()) => {
                            if let Some(holds) = holds {
                                decided.insert(key_columns(&target), holds);
                            }
                        }
                        Err(Ok(ClaimRow::Won {
                            fence, replaced, ..
                        })) => {
                            // Nobody is left to receive this claim (its future was dropped):
                            // it cannot have started a side effect, so it must not hold the
                            // key.
                            withdraw(context, conn, &target, fence, replaced.is_some()).await;
                        }
                        Err(_) => {}
                    }
                }
                Ok(_) => pending.push((target, fingerprint, reply)),
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            }
        }
        // A duplicate of a decided key is answered by what the key holds after this
        // statement, as if it came right after it: a retry storm on one key costs one
        // statement, not one per duplicate.
        pending.retain_mut(|(target, fingerprint, reply)| {
            let Some((now, record)) = decided.get(&key_columns(target)) else {
                return true;
            };
            let answer = ClaimRow::Held {
                now: *now,
                record: record.clone(),
            };
            // A record this claim would take (stale, with its fingerprint): a statement must.
            if !settled(&answer, fingerprint, p.take_over) {
                return true;
            }
            let (closed, _) = oneshot::channel();
            let _ = std::mem::replace(reply, closed).send(Ok(answer));
            false
        });
    }
    for (.., reply) in pending {
        let _ = reply.send(Err(Error::Database {
            sqlstate: None,
            reason: format!("a claim did not settle after {MAX_CLAIM_ROUNDS} statements"),
            driver: None,
        }));
    }
}

/// A row of [`sql::CLAIM_BOUNDED`] that refuses its key: the key's place in `round` and the
/// error. `None` for a row that took its key.
fn refused(
    row: &tokio_postgres::Row,
    round: &[(Target, [u8; 32], Reply<ClaimRow>)],
    p: &super::scheduler::ClaimParams,
) -> Result<Option<(usize, Error)>> {
    let Some(reason) = row.try_get::<_, Option<&str>>(10).map_err(db_error)? else {
        return Ok(None);
    };
    let target = Target::from_row(row)?;
    let at = round
        .binary_search_by(|c| key_of(&c.0).cmp(&key_of(&target)))
        .map_err(|_| Error::Database {
            sqlstate: None,
            reason: "a claim statement refused a key it was not given".into(),
            driver: None,
        })?;
    let limit = |l: Option<i64>| u64::try_from(l.unwrap_or_default()).unwrap_or_default();
    let error = match reason {
        "tenant" => Error::TenantFull {
            tenant: String::from_utf8_lossy(&target.tenant).into_owned(),
            limit: limit(p.tenant_limit),
        },
        _ => Error::StoreFull {
            bytes: u64::try_from(row.try_get::<_, i64>(11).map_err(db_error)?).unwrap_or_default(),
            limit: limit(p.byte_limit),
        },
    };
    Ok(Some((at, error)))
}

/// Claims the distinct keys of `round` (sorted by key) with one statement, then reads the
/// records of the keys it did not take with a second, read-only one. One answer per key, in
/// `round`'s order: `Ok(None)` when the key must be claimed again (its record is gone or
/// claimable by the time it was read). `Err` only if the claim statement failed: a failed
/// read fails the keys it was for, never the claims that were won.
///
/// A lone key's `first` round only inserts ([`sql::CLAIM_NEW`]): a record it finds is read,
/// and if that record is claimable the key is claimed by the next round's full statement.
async fn decide_round(
    context: &Context,
    conn: &Conn,
    round: &[(Target, [u8; 32], Reply<ClaimRow>)],
    first: bool,
) -> Result<Vec<Result<Option<ClaimRow>>>> {
    let p = &context.params;
    let adjust = (context.adjust)();
    let bounded = p.bounded();
    let new = first && round.len() == 1 && !bounded;
    let won = if let ([(target, fingerprint, _)], false) = (round, bounded) {
        let fingerprint = fingerprint.as_slice();
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![
            &adjust,
            &target.tenant,
            &target.endpoint,
            &target.key,
            &fingerprint,
            &p.lease_ms,
        ];
        // `CLAIM_NEW` never takes over: it has no `$7` flag.
        let statement = if new {
            &conn.claim_new
        } else {
            params.push(&p.take_over);
            &conn.claim_one
        };
        params.extend([&p.owner as &(dyn ToSql + Sync), &p.incarnation]);
        query(conn, statement, &params).await
    } else {
        let (tenants, endpoints, keys) = columns(round.iter().map(|c| &c.0));
        let fingerprints: Vec<&[u8]> = round.iter().map(|c| c.1.as_slice()).collect();
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![
            &adjust,
            &tenants,
            &endpoints,
            &keys,
            &fingerprints,
            &p.lease_ms,
            &p.take_over,
            &p.owner,
            &p.incarnation,
        ];
        // A store with bounds claims every key, even a lone one, through the statement that
        // checks them.
        let statement = if bounded {
            params.extend([&p.tenant_limit as &(dyn ToSql + Sync), &p.byte_limit]);
            &conn.claim_bounded
        } else {
            &conn.claim
        };
        query(conn, statement, &params).await
    }
    .map_err(db_error)?;
    if !won.is_empty() {
        context.commits.fetch_add(1, Ordering::Relaxed);
    }
    let mut answers: Vec<Result<Option<ClaimRow>>> = round.iter().map(|_| Ok(None)).collect();
    for row in &won {
        if bounded {
            if let Some((at, refusal)) = refused(row, round, p)? {
                answers[at] = Err(refusal);
                continue;
            }
        }
        let found = if new {
            new_row(row, p.lease_ms).map(|won| (0, won))
        } else {
            won_row(row).and_then(|(key, won)| {
                let at = round
                    .binary_search_by(|c| key_of(&c.0).cmp(&key))
                    .map_err(|_| Error::Database {
                        sqlstate: None,
                        reason: "a claim statement returned a key it was not given".into(),
                        driver: None,
                    })?;
                Ok((at, won))
            })
        };
        match found {
            Ok((at, won)) => answers[at] = Ok(Some(won)),
            // A row that cannot be read: its claim stays in progress until its lease ends,
            // as after a crash; the key is not claimed again by this batch.
            Err(e) => {
                for answer in answers.iter_mut().filter(|a| matches!(a, Ok(None))) {
                    *answer = Err(again(&e));
                }
                return Ok(answers);
            }
        }
    }
    let unanswered: Vec<usize> = (0..round.len())
        .filter(|&i| matches!(answers[i], Ok(None)))
        .collect();
    if unanswered.is_empty() {
        return Ok(answers);
    }
    let read = if let [only] = unanswered.as_slice() {
        let target = &round[*only].0;
        query(
            conn,
            &conn.get,
            &[
                &adjust,
                &target.tenant,
                &target.endpoint,
                &target.key,
                &p.owner,
                &p.incarnation,
            ],
        )
        .await
    } else {
        let (tenants, endpoints, keys) = columns(unanswered.iter().map(|&i| &round[i].0));
        query(
            conn,
            &conn.held,
            &[
                &adjust,
                &tenants,
                &endpoints,
                &keys,
                &p.owner,
                &p.incarnation,
            ],
        )
        .await
    };
    let rows = match read {
        Ok(rows) if rows.len() == unanswered.len() => Ok(rows),
        Ok(rows) => Err(Error::Database {
            sqlstate: None,
            reason: format!(
                "a read of {} keys returned {} rows",
                unanswered.len(),
                rows.len()
            ),
            driver: None,
        }),
        Err(e) => Err(db_error(e)),
    };
    match rows {
        Ok(rows) => {
            for (i, row) in unanswered.into_iter().zip(&rows) {
                answers[i] = record_row(row)
                    .map(|(now, held)| held.map(|record| ClaimRow::Held { now, record }));
            }
        }
        Err(e) => {
            for i in unanswered {
                answers[i] = Err(again(&e));
            }
        }
    }
    Ok(answers)
}

/// A key's identity in a batch.
type KeyColumns = (Vec<u8>, Vec<u8>, String);

fn key_columns(t: &Target) -> KeyColumns {
    (t.tenant.clone(), t.endpoint.clone(), t.key.clone())
}

/// What a key holds after a claim statement answered `answer` for it, with the time it was
/// decided at: the won claim (in progress, by `fingerprint`) or the record that answered.
pub(super) fn holding(answer: &ClaimRow, fingerprint: &[u8; 32]) -> (i64, Held) {
    match answer {
        ClaimRow::Won {
            fence,
            claimed_at,
            lease_until,
            ..
        } => (
            *claimed_at,
            Held {
                fence: *fence,
                fingerprint: fingerprint.to_vec(),
                claimed_at: *claimed_at,
                completed: false,
                lease_until: Some(*lease_until),
                expires_at: None,
                orphan: false,
                status: None,
                headers: None,
                body: None,
            },
        ),
        ClaimRow::Held { now, record } => (*now, record.clone()),
    }
}

/// Whether a claim's answer stands. A record read after the claim statement that the claim
/// would take (gone, expired, or stale with the same fingerprint under the take-over policy)
/// changed after the statement's snapshot: the key is claimed again by a next statement.
fn settled(answer: &ClaimRow, fingerprint: &[u8; 32], take_over: bool) -> bool {
    let ClaimRow::Held { now, record } = answer else {
        return true;
    };
    if record.completed {
        return record.expires_at.is_some_and(|at| at > *now);
    }
    let stale = record.lease_until.is_none_or(|until| until <= *now);
    !(take_over && stale && record.fingerprint.as_slice() == fingerprint.as_slice())
}

/// Undoes a claim nobody received: a fresh claim is deleted; a takeover's lease ends now and
/// it is marked an orphan (the attempt it replaced may have acted, so the next claim takes it
/// over again, told to reconcile).
pub(super) async fn withdraw(
    context: &Context,
    conn: &Conn,
    target: &Target,
    fence: i64,
    takeover: bool,
) {
    context.withdrawn.fetch_add(1, Ordering::Relaxed);
    let tenant = vec![target.tenant.as_slice()];
    let endpoint = vec![target.endpoint.as_slice()];
    let key = vec![target.key.as_str()];
    let fences = vec![fence];
    let result = if takeover {
        execute(
            conn,
            &conn.extend,
            &[
                &(context.adjust)(),
                &tenant,
                &endpoint,
                &key,
                &fences,
                &true,
                &vec![0i64],
            ],
        )
        .await
    } else {
        execute(conn, &conn.release, &[&tenant, &endpoint, &key, &fences]).await
    };
    // A failure leaves the claim to its lease, as a crash would.
    let _ = result;
    context.commits.fetch_add(1, Ordering::Relaxed);
}

pub(super) async fn completes(context: &Context, conn: &Conn, mut pending: Vec<CompleteItem>) {
    while !pending.is_empty() {
        let batch = next_round(&mut pending, |c| &c.0 .0);
        let adjust = (context.adjust)();
        let result = if let [((target, fence), status, headers, body, _)] = batch.as_slice() {
            query(
                conn,
                &conn.complete_one,
                &[
                    &adjust,
                    &target.tenant,
                    &target.endpoint,
                    &target.key,
                    fence,
                    status,
                    &headers.as_slice(),
                    &body.as_slice(),
                    &context.params.ttl_ms,
                ],
            )
            .await
        } else {
            let (tenants, endpoints, keys) = columns(batch.iter().map(|c| &c.0 .0));
            let fences: Vec<i64> = batch.iter().map(|c| c.0 .1).collect();
            let statuses: Vec<i32> = batch.iter().map(|c| c.1).collect();
            let headers: Vec<&[u8]> = batch.iter().map(|c| c.2.as_slice()).collect();
            let bodies: Vec<&[u8]> = batch.iter().map(|c| c.3.as_slice()).collect();
            query(
                conn,
                &conn.complete,
                &[
                    &adjust,
                    &tenants,
                    &endpoints,
                    &keys,
                    &fences,
                    &statuses,
                    &headers,
                    &bodies,
                    &context.params.ttl_ms,
                ],
            )
            .await
        };
        context.commits.fetch_add(1, Ordering::Relaxed);
        let done = fenced_rows(result);
        if let Ok(done) = &done {
            context.wakes.changed(
                batch
                    .iter()
                    .filter(|c| done.contains_key(&c.0 .1))
                    .map(|c| &c.0 .0),
            );
        }
        for (fenced, .., reply) in batch {
            let _ = reply.send(match &done {
                Ok(done) => Ok(done.get(&fenced.1).copied()),
                Err(e) => Err(again(e)),
            });
        }
    }
}

pub(super) async fn releases(
    context: &Context,
    conn: &Conn,
    mut pending: Vec<(Fenced, Option<Reply<bool>>)>,
) {
    while !pending.is_empty() {
        let batch = next_round(&mut pending, |c| &c.0 .0);
        let (tenants, endpoints, keys) = columns(batch.iter().map(|c| &c.0 .0));
        let fences: Vec<i64> = batch.iter().map(|c| c.0 .1).collect();
        let result = query(conn, &conn.release, &[&tenants, &endpoints, &keys, &fences])
            .await
            .map(|rows| {
                rows.iter()
                    .map(|r| r.get::<_, i64>(0))
                    .collect::<std::collections::HashSet<_>>()
            })
            .map_err(db_error);
        context.commits.fetch_add(1, Ordering::Relaxed);
        if let Ok(done) = &result {
            context.wakes.changed(
                batch
                    .iter()
                    .filter(|c| done.contains(&c.0 .1))
                    .map(|c| &c.0 .0),
            );
        }
        for (fenced, reply) in batch {
            if let Some(reply) = reply {
                let _ = reply.send(match &result {
                    Ok(done) => Ok(done.contains(&fenced.1)),
                    Err(e) => Err(again(e)),
                });
            }
        }
    }
}

pub(super) async fn extends(context: &Context, conn: &Conn, pending: Vec<ExtendItem>) {
    // Withdrawn takeovers (orphan) and renewals differ in one flag: two statements.
    let (orphaned, renewed): (Vec<_>, Vec<_>) = pending.into_iter().partition(|e| e.2);
    for (mut pending, orphan) in [(orphaned, true), (renewed, false)] {
        while !pending.is_empty() {
            let batch = next_round(&mut pending, |c| &c.0 .0);
            let (tenants, endpoints, keys) = columns(batch.iter().map(|c| &c.0 .0));
            let fences: Vec<i64> = batch.iter().map(|c| c.0 .1).collect();
            let by: Vec<i64> = batch.iter().map(|c| c.1).collect();
            let result = query(
                conn,
                &conn.extend,
                &[
                    &(context.adjust)(),
                    &tenants,
                    &endpoints,
                    &keys,
                    &fences,
                    &orphan,
                    &by,
                ],
            )
            .await;
            context.commits.fetch_add(1, Ordering::Relaxed);
            let done = fenced_rows(result);
            for (fenced, .., reply) in batch {
                if let Some(reply) = reply {
                    let _ = reply.send(match &done {
                        Ok(done) => Ok(done.get(&fenced.1).copied()),
                        Err(e) => Err(again(e)),
                    });
                }
            }
        }
    }
}

pub(super) async fn abandons(conn: &Conn, mut pending: Vec<Fenced>) {
    while !pending.is_empty() {
        let batch = next_round(&mut pending, |c| &c.0);
        let (tenants, endpoints, keys) = columns(batch.iter().map(|c| &c.0));
        let fences: Vec<i64> = batch.iter().map(|c| c.1).collect();
        // A failure leaves the claim in progress until its lease ends, as a crash would.
        let _ = execute(conn, &conn.abandon, &[&tenants, &endpoints, &keys, &fences]).await;
    }
}
