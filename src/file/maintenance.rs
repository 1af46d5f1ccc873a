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

/// How many due records one purge round deletes before it waits for their commit.
const PURGE_CHUNK: usize = 4096;

#[cfg(test)]
thread_local! {
    /// Run once by the next purge on this thread, between its scan of the index and its
    /// deletions.
    pub(crate) static BETWEEN_PURGE_SCAN_AND_DELETE: std::cell::RefCell<Option<Box<dyn FnOnce()>>> =
        std::cell::RefCell::new(None);
}

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

    /// Deletes the completed records whose expiry is at or before now, found in the index:
    /// each stripe is locked while its slots are read (about a millisecond per hundred thousand
    /// records), and due records are gathered across stripes into chunks of [`PURGE_CHUNK`],
    /// each deleted in one commit (a record only if its slot is still the one read). With
    /// per-tenant limits, the due records are read for their keys, whose tenants are uncounted.
    pub(crate) fn purge_expired(&self) -> Result<usize> {
        let inner = &*self.inner;
        inner.pipeline.check()?;
        let now = self.now();
        let stripes = inner.index.stripe_count();
        let mut purged = 0;
        let mut due: Vec<(KeyHash, Slot)> = Vec::with_capacity(PURGE_CHUNK);
        let mut stripe = 0;
        while stripe < stripes {
            due.clear();
            while stripe < stripes {
                let room = PURGE_CHUNK - due.len();
                due.extend(
                    inner
                        .index
                        .lock_stripe(stripe)
                        .iter()
                        .filter(|(_, slot)| {
                            matches!(slot.state(), SlotState::Completed { expires_at, .. } if expires_at <= now)
                        })
                        .take(room)
                        .map(|(hash, slot)| (*hash, slot.clone())),
                );
                if due.len() == PURGE_CHUNK {
                    break; // this stripe may hold more: read it again next round
                }
                stripe += 1;
            }
            #[cfg(test)]
            if let Some(hook) = BETWEEN_PURGE_SCAN_AND_DELETE.with(|h| h.borrow_mut().take()) {
                hook();
            }
            let n = self.purge_chunk(&due)?;
            purged += n;
            if n == 0 && due.len() == PURGE_CHUNK {
                // None of a full chunk could go (not in the file yet): reading the stripe
                // again would find the same ones.
                stripe += 1;
            }
        }
        Counters::bump(&inner.counters.purged, purged as u64);
        Ok(purged)
    }

    /// Deletes the records of `due` whose slots are unchanged, and waits until the deletions
    /// are durable.
    fn purge_chunk(&self, due: &[(KeyHash, Slot)]) -> Result<usize> {
        let inner = &*self.inner;
        let keys = match &inner.index.tenants {
            Some(_) => Some(
                inner
                    .pipeline
                    .read(|db| disk::read_many(db, due.iter().map(|(_, s)| s.fence())))?,
            ),
            None => None,
        };
        let mut purged = 0;
        let mut last = None;
        for (i, (hash, slot)) in due.iter().enumerate() {
            let key = match &keys {
                // Not in the file yet (its completion is queued): the next purge takes it.
                Some(read) => match &read[i] {
                    Some((key, _)) => Some(key),
                    None => continue,
                },
                None => None,
            };
            let mut stripe = inner.index.lock(hash);
            if stripe.get(hash) != Some(slot) {
                continue; // completed again, replaced or deleted since the scan
            }
            last = Some(inner.pipeline.enqueue(Op::Delete(Gone::of(slot)))?);
            stripe.remove(hash);
            drop(stripe);
            if let Some(key) = key {
                self.uncount(key);
            }
            inner.config.observer.census(0, -1);
            purged += 1;
        }
        if let Some(seq) = last {
            inner.pipeline.wait(seq)?;
        }
        Ok(purged)
    }
}
