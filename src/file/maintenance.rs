//! Reaping stale claims and purging expired records. Both run on demand: call them from a
//! timer of your own (for example every few seconds for `reap`, every minute for `purge`).

use crate::claim::{Resolution, StaleClaim};
use crate::clock::{duration_millis, from_millis};
use crate::error::{Error, Result};
use crate::file::commit::Seq;
use crate::file::disk::{self, Gone, Op};
use crate::file::index::{IndexKey, KeyHash, Slot, SlotState};
use crate::file::store::FileStore;
use crate::record::{response_size, Record, RecordState};
use crate::scope::split_scoped_key;
use crate::stats::Counters;

/// How many expiry entries one purge round reads at a time.
const PURGE_CHUNK: usize = 4096;

impl FileStore {
    pub(crate) fn reap(
        &self,
        mut resolver: impl FnMut(&StaleClaim) -> Resolution,
    ) -> Result<usize> {
        let inner = &*self.inner;
        inner.pipeline.check()?;
        let now = self.now();
        let mut stale: Vec<(KeyHash, Slot)> = Vec::new();
        for stripe in inner.index.stripes() {
            stale.extend(
                stripe
                    .iter()
                    .filter(|(_, slot)| match slot.state() {
                        SlotState::InProgress {
                            lease_until,
                            orphan,
                        } => orphan || now >= lease_until,
                        SlotState::Completed { .. } => false,
                    })
                    .map(|(k, slot)| (*k, slot.clone())),
            );
        }
        let observer = &inner.config.observer;
        if stale.is_empty() {
            observer.stale(0);
            return Ok(0);
        }
        let found = stale.len();
        let mut resolved = 0;
        let mut last: Option<Seq> = None;
        let mut failure = None;
        let mut completed = Vec::new();
        // The index holds no keys: each claim's record names it. All are read in one snapshot
        // before any resolver runs (a resolver may change them).
        let records = inner
            .pipeline
            .read(|db| disk::read_many(db, stale.iter().map(|(_, s)| s.fence())))?;
        for ((hash, slot), read) in stale.into_iter().zip(records) {
            // Not on disk yet (its commit is still queued): the next reap offers it.
            let Some((bytes, record)) = read else {
                continue;
            };
            let key = IndexKey { hash, bytes };
            if inner.index.hash(&key.bytes) != hash {
                continue; // a hash collision: not this slot's record
            }
            let Some((scope, key_str)) = split_scoped_key(&key.bytes) else {
                continue;
            };
            let SlotState::InProgress {
                lease_until,
                orphan,
            } = slot.state()
            else {
                continue;
            };
            let claim = StaleClaim {
                scope,
                key: key_str,
                fence: slot.fence(),
                fingerprint: record.fingerprint(),
                claimed_at: from_millis(record.claimed_at),
                lease_deadline: from_millis(lease_until),
                orphan,
            };
            let (op, new_state) = match resolver(&claim) {
                Resolution::Keep => continue,
                Resolution::Release => (Op::Delete(Gone::of(&slot)), None),
                Resolution::Complete(response) => {
                    let size = response_size(&response);
                    if size > inner.config.max_response_bytes {
                        failure = Some(Error::ResponseTooLarge {
                            size,
                            limit: inner.config.max_response_bytes,
                            ticket: None,
                        });
                        break;
                    }
                    let now = self.now();
                    let expires_at = now.saturating_add(duration_millis(inner.config.ttl));
                    let record = Record {
                        fence: slot.fence(),
                        fingerprint: record.fingerprint,
                        claimed_at: record.claimed_at,
                        state: RecordState::Completed {
                            completed_at: now,
                            expires_at,
                            response: response.into(),
                        },
                    };
                    let value = record.encode(&key.bytes);
                    (
                        Op::Put {
                            fence: slot.fence(),
                            key: key.bytes.clone(),
                            value,
                            expiry: Some(expires_at),
                            replaces: None,
                        },
                        Some(SlotState::Completed {
                            expires_at,
                            durable: false,
                        }),
                    )
                }
            };
            let mut stripe = inner.index.lock(&key.hash);
            // Only the claim the resolver saw: same fence, still in progress, still stale.
            let Some(current) = stripe.get_mut(&key.hash).filter(|s| **s == slot) else {
                continue;
            };
            last = Some(inner.pipeline.enqueue(op)?);
            match new_state {
                None => {
                    stripe.remove(&key.hash);
                    self.uncount(&key.bytes);
                    observer.census(-1, 0);
                    inner.watchers.notify(&key.hash);
                }
                Some(state) => {
                    current.set_state(state);
                    observer.census(-1, 1);
                    drop(stripe);
                    completed.push((key, slot.fence()));
                }
            }
            resolved += 1;
        }
        if let Some(seq) = last {
            inner.pipeline.wait(seq)?;
        }
        for (key, fence) in &completed {
            self.mark_durable(key, *fence);
        }
        Counters::bump(&inner.counters.reaped, resolved as u64);
        observer.stale(found - resolved);
        match failure {
            Some(e) => Err(e),
            None => Ok(resolved),
        }
    }

    pub(crate) fn purge_expired(&self) -> Result<usize> {
        let inner = &*self.inner;
        inner.pipeline.check()?;
        let mut purged = 0;
        let mut after = None;
        loop {
            let now = self.now();
            let due = inner
                .pipeline
                .read(|db| disk::expired(db, after, now, PURGE_CHUNK))?;
            after = due.last().map(|d| disk::expiry_key(d.expires_at, d.fence));
            let mut last = None;
            for d in due.iter() {
                let hash = inner.index.hash(&d.key);
                let mut stripe = inner.index.lock(&hash);
                let matches = stripe.get(&hash).is_some_and(|s| {
                    s.fence() == d.fence
                        && matches!(s.state(), SlotState::Completed { expires_at, .. } if expires_at == d.expires_at)
                });
                if !matches {
                    continue;
                }
                last = Some(inner.pipeline.enqueue(Op::Delete(Gone {
                    fence: d.fence,
                    expiry: Some(d.expires_at),
                }))?);
                stripe.remove(&hash);
                self.uncount(&d.key);
                inner.config.observer.census(0, -1);
                purged += 1;
            }
            if let Some(seq) = last {
                inner.pipeline.wait(seq)?;
            }
            if due.len() < PURGE_CHUNK {
                break;
            }
        }
        Counters::bump(&inner.counters.purged, purged as u64);
        Ok(purged)
    }
}
