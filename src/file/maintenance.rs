//! Reaping stale claims and purging expired records. Both run on demand: call them from a
//! timer of your own (for example every few seconds for `reap`, every minute for `purge`).

use crate::clock::{duration_millis, from_millis};
use crate::error::Result;
use crate::file::batch::{Gone, Op};
use crate::file::commit::Seq;
use crate::file::index::{IndexKey, KeyHash, Slot, SlotState};
use crate::file::read;
use crate::file::record::{Record, RecordState};
use crate::file::store::FileStore;
use crate::model::claim::{Resolution, StaleClaim};
use crate::model::report::Tally;
use crate::model::scope::{scoped_key, split_scoped_key, Scope};

/// How many due records one purge round deletes before it waits for their commit.
const PURGE_CHUNK: usize = 4096;

#[cfg(test)]
thread_local! {
    /// Run once by the next purge on this thread, between its scan of the index and its
    /// deletions.
    pub(crate) static BETWEEN_PURGE_SCAN_AND_DELETE: std::cell::RefCell<Option<Box<dyn FnOnce()>>> =
        std::cell::RefCell::new(None);
}

/// Resolutions queued by a reap or a resolve, to be waited for together.
#[derive(Default)]
struct Resolving {
    last: Option<Seq>,
    /// Completions, marked durable once their batch is.
    completed: Vec<(KeyHash, u64)>,
    resolved: usize,
}

/// Whether a slot is a stale claim at `now`: its lease ran out, or its holder is gone.
fn is_stale(slot: &Slot, now: u64) -> bool {
    match slot.state() {
        SlotState::InProgress {
            lease_until,
            orphan,
        } => orphan || now >= lease_until,
        SlotState::Completed { .. } => false,
    }
}

impl FileStore {
    pub(crate) fn reap(
        &self,
        mut resolver: impl FnMut(&StaleClaim) -> Result<Resolution>,
    ) -> Tally {
        let inner = &*self.inner;
        if let Err(e) = inner.pipeline.check() {
            return Tally::failed(e);
        }
        let now = self.now();
        let mut stale: Vec<(KeyHash, Slot)> = Vec::new();
        for stripe in inner.index.stripes() {
            stale.extend(
                stripe
                    .iter()
                    .filter(|(_, slot)| is_stale(slot, now))
                    .map(|(k, slot)| (*k, slot.clone())),
            );
        }
        let observer = &inner.config.observer;
        if stale.is_empty() {
            observer.stale(0);
            return Tally::default();
        }
        let found = stale.len();
        // The index holds no keys: each claim's record names it. All are read in one snapshot
        // before any resolver runs (a resolver may change them).
        let records = match inner
            .pipeline
            .read(|db| read::read_many(db, stale.iter().map(|(_, s)| s.fence())))
        {
            Ok(records) => records,
            Err(e) => return Tally::failed(e),
        };
        let mut resolving = Resolving::default();
        let mut stopped = Ok(());
        for ((hash, slot), read) in stale.into_iter().zip(records) {
            // Not on disk yet (its commit is still queued): the next reap offers it.
            let Some((bytes, record)) = read else {
                continue;
            };
            let key = IndexKey { hash, bytes };
            if inner.index.hash(&key.bytes) != hash {
                continue; // a hash collision: not this slot's record
            }
            let Some(claim) = stale_claim(&key, &slot, &record) else {
                continue;
            };
            let decision = match resolver(&claim) {
                Ok(decision) => decision,
                Err(e) => {
                    stopped = Err(e);
                    break;
                }
            };
            if let Err(e) = self.resolve_stale(&key, &slot, &record, decision, &mut resolving) {
                return Tally::failed(e);
            }
        }
        let resolved = resolving.resolved;
        if let Err(e) = self.settle(resolving) {
            return Tally::failed(e);
        }
        observer.stale(found - resolved);
        Tally::of(resolved, stopped)
    }

    /// Resolves the stale claim of `key` with `fence`, if it is one, as `resolution` (a
    /// release or a completion; the seam answers `Keep` itself): see [`crate::Store::resolve`].
    pub(crate) fn resolve(
        &self,
        scope: &Scope,
        key: &str,
        fence: u64,
        resolution: Resolution,
    ) -> Result<bool> {
        let inner = &*self.inner;
        inner.pipeline.check()?;
        let key = inner.index.key(scoped_key(scope, key)?);
        let now = self.now();
        let Some(slot) = inner.index.lock(&key.hash).get(&key.hash).cloned() else {
            return Ok(false);
        };
        if slot.fence() != fence || !is_stale(&slot, now) {
            return Ok(false);
        }
        let Some(record) = self.record_at(&key, &slot)? else {
            return Ok(false); // changed meanwhile
        };
        let mut resolving = Resolving::default();
        self.resolve_stale(&key, &slot, &record, resolution, &mut resolving)?;
        let resolved = resolving.resolved == 1;
        self.settle(resolving)?;
        Ok(resolved)
    }

    /// Queues `decision` for the stale claim `slot` of `key` (whose record is `record`), if
    /// the index still holds that very claim.
    fn resolve_stale(
        &self,
        key: &IndexKey,
        slot: &Slot,
        record: &Record,
        decision: Resolution,
        resolving: &mut Resolving,
    ) -> Result<()> {
        let inner = &*self.inner;
        let (op, new_state) = match decision {
            Resolution::Keep => return Ok(()),
            Resolution::Release => (Op::Delete(Gone::of(slot)), None),
            Resolution::Complete(response) => {
                let now = self.now();
                let expires_at = now.saturating_add(duration_millis(inner.config.ttl));
                let completed = Record {
                    fence: slot.fence(),
                    fingerprint: record.fingerprint,
                    claimed_at: record.claimed_at,
                    state: RecordState::Completed {
                        completed_at: now,
                        expires_at,
                        response: response.into(),
                    },
                };
                (
                    Op::Put {
                        fence: slot.fence(),
                        value: completed.encode(&key.bytes, self.inner.config.packing()),
                        expiry: Some(expires_at),
                        replaces: None,
                        fresh: false,
                    },
                    Some(SlotState::Completed {
                        expires_at,
                        durable: false,
                    }),
                )
            }
        };
        let observer = &inner.config.observer;
        let mut stripe = inner.index.lock(&key.hash);
        // Only the claim the resolver saw: same fence, still in progress, still stale.
        let Some(current) = stripe.get_mut(&key.hash).filter(|s| *s == slot) else {
            return Ok(());
        };
        resolving.last = Some(inner.pipeline.enqueue(op)?);
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
                resolving.completed.push((key.hash, slot.fence()));
            }
        }
        resolving.resolved += 1;
        Ok(())
    }

    /// Waits until the queued resolutions are durable, then lets their completions replay.
    fn settle(&self, resolving: Resolving) -> Result<()> {
        if let Some(seq) = resolving.last {
            self.inner.pipeline.wait(seq)?;
        }
        for (hash, fence) in &resolving.completed {
            self.mark_durable(hash, *fence);
        }
        Ok(())
    }

    /// Deletes the completed records whose expiry is at or before now, found in the index:
    /// each stripe is locked while its slots are read (about a millisecond per hundred thousand
    /// records), and due records are gathered across stripes into chunks of [`PURGE_CHUNK`],
    /// each deleted in one commit (a record only if its slot is still the one read). With
    /// per-tenant limits, the due records are read for their keys, whose tenants are uncounted.
    pub(crate) fn purge_expired(&self) -> Tally {
        let inner = &*self.inner;
        if let Err(e) = inner.pipeline.check() {
            return Tally::failed(e);
        }
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
            let n = match self.purge_chunk(&due) {
                Ok(n) => n,
                Err(e) => return Tally::failed(e),
            };
            purged += n;
            if n == 0 && due.len() == PURGE_CHUNK {
                // None of a full chunk could go (not in the file yet): reading the stripe
                // again would find the same ones.
                stripe += 1;
            }
        }
        Tally::of(purged, Ok(()))
    }

    /// Deletes the records of `due` whose slots are unchanged, and waits until the deletions
    /// are durable.
    fn purge_chunk(&self, due: &[(KeyHash, Slot)]) -> Result<usize> {
        let inner = &*self.inner;
        let keys = match &inner.index.tenants {
            Some(_) => Some(
                inner
                    .pipeline
                    .read(|db| read::read_many(db, due.iter().map(|(_, s)| s.fence())))?,
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

/// The stale claim `slot` of `key` as a resolver sees it.
fn stale_claim(key: &IndexKey, slot: &Slot, record: &Record) -> Option<StaleClaim> {
    let (scope, key) = split_scoped_key(&key.bytes)?;
    let SlotState::InProgress {
        lease_until,
        orphan,
    } = slot.state()
    else {
        return None;
    };
    Some(StaleClaim {
        scope,
        key,
        fence: slot.fence(),
        fingerprint: record.fingerprint(),
        claimed_at: from_millis(record.claimed_at),
        lease_deadline: from_millis(lease_until),
        orphan,
    })
}
