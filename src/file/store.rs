//! The file engine's claim, complete, release, extend and inspection. Opening it is `open.rs`;
//! reaping and purging are `maintenance.rs`; waiting for a claim to end is `watch.rs`; the
//! async forms are `asynchronous.rs`. What each operation promises is documented once, on the
//! public [`crate::Store`].

use crate::clock::{duration_millis, from_millis, to_millis};
use crate::config::{Config, StalePolicy};
use crate::error::{Damaged, Error, Result};
use crate::file::batch::{Gone, Op};
use crate::file::commit::{Pipeline, Seq};
use crate::file::index::{Index, IndexKey, KeyHash, Slot, SlotState, Tag};
use crate::file::journal::Journal;
use crate::file::load;
use crate::file::read;
use crate::file::record::RecordState as Stored;
use crate::file::record::{Packing, Record, RecordState};
use crate::file::space::Space;
use crate::file::watch::Watchers;
use crate::model::claim::{Claim, Entry, EntryState, Takeover};
use crate::model::fingerprint::Fingerprint;
use crate::model::report::EngineFigures;
use crate::model::response::Response;
use crate::model::scope::{display_scoped_key, scoped_key, Scope};
use crate::model::ticket::{Issued, Issuer, Ticket};
use crate::replay_cache::{Cached, ReplayCache};
use crate::sync::{Arc, AtomicU64, Ordering, Weak};
use std::time::Duration;

/// The file engine: one process owns one redb file, with its index in memory.
#[derive(Clone, Debug)]
pub(crate) struct FileStore {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) index: Index,
    pub(crate) pipeline: Arc<Pipeline>,
    pub(crate) config: Config,
    /// Shared with the stores a heal replaced and replaces this one with.
    pub(crate) carried: Arc<Carried>,
    replays: ReplayCache,
    next_fence: AtomicU64,
    pub(crate) watchers: Arc<Watchers>,
    /// The disk's free space and the reserve for recovery; `None` in memory, on the simulated
    /// disk, with `reserve_size(0)`, and where the free space cannot be read.
    pub(crate) space: Option<Arc<Space>>,
}

/// What the file engine counts itself (the answers are counted above the seam), carried over
/// by a heal to the store it opens.
#[derive(Debug, Default)]
pub(crate) struct Carried {
    pub(crate) withdrawn: AtomicU64,
    pub(crate) heals: AtomicU64,
    /// Commit batches and checkpoints of the stores a heal replaced.
    batches_before: AtomicU64,
    checkpoints_before: AtomicU64,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.pipeline.close();
    }
}

impl Issuer for Inner {
    /// If the ticket still holds its claim, the claim is an orphan now. Nothing is written:
    /// the claim stays in progress until its lease runs out (the side effect may have
    /// happened), but `reap` offers it at once and duplicates are told to come back when the
    /// lease ends.
    fn holder_gone(&self, key: &[u8], fence: u64) {
        let hash = self.index.hash(key);
        let mut stripe = self.index.lock(&hash);
        if let Some(slot) = stripe.get_mut(&hash).filter(|s| s.fence() == fence) {
            if let SlotState::InProgress { lease_until, .. } = slot.state() {
                slot.set_state(SlotState::InProgress {
                    lease_until,
                    orphan: true,
                });
            }
        }
    }
}

/// How far one claim attempt got.
pub(crate) enum Attempt {
    /// Decided from the index (or a replay read): nothing to wait for.
    Answer(Claim),
    /// A replay's record changed under it: look again.
    Again,
    /// Acquired: the claim's write is queued; the ticket is the caller's once it is durable.
    Queued(Seq, Ticket),
}

impl FileStore {
    /// A store over `db`, whose records `index` was built from by the scan that found
    /// `loaded`: fences start above its highest; its reservation is the file's.
    pub(crate) fn assemble(
        config: Config,
        index: Index,
        db: redb::Database,
        loaded: &load::Loaded,
        journal: Option<Journal>,
        space: Option<Arc<Space>>,
    ) -> FileStore {
        let watchers = Arc::new(Watchers::default());
        let on_halt = {
            let watchers = Arc::clone(&watchers);
            Box::new(move || watchers.notify_all())
        };
        FileStore {
            inner: Arc::new(Inner {
                index,
                pipeline: Arc::new(Pipeline::new(
                    db,
                    loaded.file,
                    loaded.record_bytes,
                    journal,
                    config.background_apply,
                    on_halt,
                    config.observer.clone(),
                )),
                watchers,
                replays: ReplayCache::new(config.replay_cache_bytes),
                config,
                carried: Arc::default(),
                next_fence: AtomicU64::new(loaded.high_fence + 1),
                space,
            }),
        }
    }

    /// The identity its tickets carry: this store's, not the one a heal replaces it with.
    pub(crate) fn issuer(&self) -> *const () {
        Arc::as_ptr(&self.inner).cast()
    }

    /// `Halted` once a commit failed.
    pub(crate) fn check(&self) -> Result<()> {
        self.inner.pipeline.check()
    }

    pub(crate) fn now(&self) -> u64 {
        to_millis(self.inner.config.clock.now())
    }

    pub(crate) fn claim(
        &self,
        scope: &Scope,
        key: &str,
        fingerprint: Fingerprint,
    ) -> Result<Claim> {
        let key = self.index_key(scope, key)?;
        loop {
            match self.claim_start(&key, fingerprint)? {
                Attempt::Answer(claim) => return Ok(claim),
                Attempt::Again => continue,
                Attempt::Queued(seq, ticket) => {
                    self.inner.pipeline.wait(seq)?;
                    return Ok(Claim::Acquired(ticket));
                }
            }
        }
    }

    /// The index key of `key` in `scope`; `Halted` once a commit failed.
    pub(crate) fn claim_key(&self, scope: &Scope, key: &str) -> Result<IndexKey> {
        self.inner.pipeline.check()?;
        self.index_key(scope, key)
    }

    /// The index key of `key` in `scope`, halted or not: a halted store still answers claims
    /// that only read what is durable ([`FileStore::claim_start`]).
    pub(crate) fn index_key(&self, scope: &Scope, key: &str) -> Result<IndexKey> {
        Ok(self.inner.index.key(scoped_key(scope, key)?))
    }

    /// One attempt, up to queueing the claim's write.
    ///
    /// Degraded, not down: once a commit failed, the claim is still answered if its answer
    /// only reads the key's slot and that slot holds what the disk holds (see
    /// [`Pipeline::answers_from`]): a durable completion (replay, or mismatch), a durable claim
    /// in progress (in progress, or mismatch). Anything else, and every answer that writes, is
    /// `Halted`.
    pub(crate) fn claim_start(&self, key: &IndexKey, fingerprint: Fingerprint) -> Result<Attempt> {
        let inner = &*self.inner;
        let now = self.now();
        let tag = inner.index.tag(&fingerprint);
        let stripe = inner.index.lock(&key.hash);
        if inner.pipeline.is_halted() {
            let durable = stripe.get(&key.hash).is_some_and(|slot| {
                !matches!(slot.state(), SlotState::Completed { durable: false, .. })
                    && inner.pipeline.answers_from(slot.fence())
            });
            if !durable {
                return Err(inner.pipeline.halted_error());
            }
        }
        let replaces = match stripe.get(&key.hash) {
            None => None,
            Some(slot) => match slot.state() {
                SlotState::Completed { expires_at, .. } if now >= expires_at => {
                    Some(Gone::of(slot))
                }
                _ if slot.tag() != tag => {
                    let completed = matches!(slot.state(), SlotState::Completed { .. });
                    return Ok(Attempt::Answer(Claim::Mismatch { completed }));
                }
                SlotState::Completed { durable: false, .. } => {
                    return Ok(Attempt::Answer(self.in_progress(Duration::ZERO, false)));
                }
                SlotState::Completed { durable: true, .. } => {
                    let seen = slot.clone();
                    drop(stripe);
                    return self.replay(key, &seen, fingerprint);
                }
                SlotState::InProgress {
                    lease_until,
                    orphan,
                } => {
                    if now < lease_until {
                        let left = Duration::from_millis(lease_until - now);
                        return Ok(Attempt::Answer(self.in_progress(left, orphan)));
                    }
                    if inner.config.stale_policy == StalePolicy::Keep {
                        return Ok(Attempt::Answer(self.in_progress(Duration::ZERO, orphan)));
                    }
                    let seen = slot.clone();
                    drop(stripe);
                    return self.take_over(key, fingerprint, tag, &seen);
                }
            },
        };
        self.acquire(key, fingerprint, tag, stripe, None, replaces)
    }

    /// Queues a new claim of `key`; the stripe lock is held from the decision until the claim
    /// is in the index and the queue.
    fn acquire(
        &self,
        key: &IndexKey,
        fingerprint: Fingerprint,
        tag: Tag,
        mut stripe: crate::sync::MutexGuard<'_, crate::file::index::Stripe>,
        takeover: Option<Takeover>,
        replaces: Option<Gone>,
    ) -> Result<Attempt> {
        let inner = &*self.inner;
        // A halted store answers only what reads (see `claim_start`).
        inner.pipeline.check()?;
        if let Some(space) = &inner.space {
            space.admit(inner.pipeline.record_bytes_bound())?;
        }
        let now = self.now();
        let fence = inner.next_fence.fetch_add(1, Ordering::Relaxed);
        let lease_until = now.saturating_add(duration_millis(inner.config.lease));
        let record = Record {
            fence,
            fingerprint: *fingerprint.as_bytes(),
            claimed_at: now,
            state: RecordState::InProgress { lease_until },
        };
        let value = record.encode(&key.bytes, Packing::Plain);
        if let (Some(limit), None) = (inner.config.max_store_bytes, &replaces) {
            let over = |bytes: u64| bytes.saturating_add(value.len() as u64) > limit;
            // The bound needs no wait for the applier; only a claim it refuses waits, to count
            // what the answered writes deleted too.
            if over(inner.pipeline.record_bytes_bound()) {
                let bytes = inner.pipeline.record_bytes();
                if over(bytes) {
                    return Err(Error::StoreFull { bytes, limit });
                }
            }
        }
        // Only a record for a key that holds none counts against its tenant.
        let tenants = inner.index.tenants.as_ref().filter(|_| replaces.is_none());
        let replaced = replaces.is_some();
        if let Some(tenants) = tenants {
            tenants.admit(&key.bytes)?;
        }
        let queued = inner.pipeline.enqueue(Op::Put {
            fence,
            value,
            expiry: None,
            replaces,
            // Just drawn: above every fence the file holds (see `Op::Put::fresh`).
            fresh: true,
        });
        let seq = match queued {
            Ok(seq) => seq,
            Err(e) => {
                if let Some(tenants) = tenants {
                    tenants.removed(&key.bytes);
                }
                return Err(e);
            }
        };
        let state = SlotState::InProgress {
            lease_until,
            orphan: false,
        };
        stripe.insert(key.hash, Slot::new(fence, tag, state));
        drop(stripe);
        // A takeover replaces a claim in progress; otherwise an expired completion, or nothing.
        match (&takeover, replaced) {
            (Some(_), _) => {}
            (None, true) => inner.config.observer.census(1, -1),
            (None, false) => inner.config.observer.census(1, 0),
        }
        let issuer: Weak<dyn Issuer> = Arc::downgrade(&self.inner) as Weak<Inner>;
        let ticket = Ticket::issue(
            issuer,
            Issued {
                key: key.bytes.clone(),
                fence,
                fingerprint,
                claimed_at: now,
                lease_until,
                takeover,
            },
        );
        Ok(Attempt::Queued(seq, ticket))
    }

    /// Takes over the stale claim `seen`. Its record is read first, with no lock held: it is
    /// the proof that the claim is this key's, the full fingerprint to compare, and the claim
    /// time the new ticket reports. If the claim changed meanwhile, the caller looks again.
    fn take_over(
        &self,
        key: &IndexKey,
        fingerprint: Fingerprint,
        tag: Tag,
        seen: &Slot,
    ) -> Result<Attempt> {
        let Some(previous) = self.record_at(key, seen)? else {
            return Ok(Attempt::Again);
        };
        if previous.fingerprint() != fingerprint {
            return Ok(Attempt::Answer(Claim::Mismatch { completed: false }));
        }
        let stripe = self.inner.index.lock(&key.hash);
        if stripe.get(&key.hash) != Some(seen) {
            return Ok(Attempt::Again);
        }
        let SlotState::InProgress { orphan, .. } = seen.state() else {
            unreachable!("only an in-progress claim is taken over")
        };
        let takeover = Takeover {
            previous_fence: seen.fence(),
            previous_claimed_at: from_millis(previous.claimed_at),
            orphan,
        };
        self.acquire(
            key,
            fingerprint,
            tag,
            stripe,
            Some(takeover),
            Some(Gone::of(seen)),
        )
    }

    /// An `InProgress` answer (see [`Claim::in_progress`]).
    fn in_progress(&self, lease_remaining: Duration, orphan: bool) -> Claim {
        Claim::in_progress(self.inner.config.retry_after, lease_remaining, orphan)
    }

    /// Reads a completed record's response. The index said `fence` is completed and durable
    /// and its fingerprint tag matched; the full fingerprint is compared here. If the disk now
    /// holds another record (expired and re-claimed meanwhile) the claim looks again.
    fn replay(&self, key: &IndexKey, seen: &Slot, fingerprint: Fingerprint) -> Result<Attempt> {
        let fence = seen.fence();
        if let Some(hit) = self.inner.replays.get(&fence) {
            if hit.key == key.bytes {
                return Ok(if hit.fingerprint != fingerprint {
                    Attempt::Answer(Claim::Mismatch { completed: true })
                } else {
                    Attempt::Answer(Claim::Replay(hit.response.clone()))
                });
            }
        }
        Ok(match self.record_at(key, seen)? {
            Some(record) if record.fingerprint() != fingerprint => {
                Attempt::Answer(Claim::Mismatch { completed: true })
            }
            Some(Record {
                state: Stored::Completed { response, .. },
                ..
            }) => {
                let response = Response::from(response);
                self.inner.replays.insert(
                    fence,
                    Cached {
                        key: key.bytes.clone(),
                        fingerprint,
                        response: response.clone(),
                        expires_at: u64::MAX,
                    },
                );
                Attempt::Answer(Claim::Replay(response))
            }
            _ => Attempt::Again,
        })
    }

    /// The record the index has for `key` in `seen` (a slot taken from the index), read from
    /// the file with no lock held; `None` if the index moved on meanwhile (the record was
    /// replaced or deleted, or its completion recorded).
    ///
    /// The record must agree with its head, from which the open built the slot: the same key,
    /// the same fingerprint, and completed if the slot says its completion is durable. A record
    /// can disagree only while a queued write has yet to land, so a disagreement is looked at
    /// again once every queued write landed, and is damage if it stays.
    ///
    /// # Errors
    /// [`Error::Corrupted`] if the record is another key's (a damaged file, or a 128-bit hash
    /// collision: either way no response crosses keys), or if it still disagrees with an
    /// unchanged slot after every queued write landed: the file has no record there, or one
    /// whose fingerprint or state is not its head's (looking again would spin forever).
    pub(crate) fn record_at(&self, key: &IndexKey, seen: &Slot) -> Result<Option<Record>> {
        let inner = &*self.inner;
        let fence = seen.fence();
        let damaged = |reason: String| Error::Corrupted {
            damaged: Damaged::Record {
                fence: Some(fence),
                key: Some(display_scoped_key(&key.bytes)),
            },
            reason,
        };
        let mut flushed = false;
        loop {
            let disagreement = match inner.pipeline.read(|db| read::read_at(db, fence))? {
                Some((stored, _)) if stored != key.bytes => {
                    return Err(damaged(format!(
                        "the index points this key at fence {fence}, whose record is {}'s",
                        display_scoped_key(&stored)
                    )))
                }
                Some((_, record)) => match self.disagreement(seen, &record) {
                    None => return Ok(Some(record)),
                    Some(reason) => reason,
                },
                None => "the index holds this record, the file does not",
            };
            let unchanged = inner.index.lock(&key.hash).get(&key.hash) == Some(seen);
            if !unchanged {
                return Ok(None);
            }
            if flushed {
                return Err(damaged(disagreement.into()));
            }
            // A claim's record, or a completion, may still be queued: let every queued write
            // land.
            inner.pipeline.flush()?;
            flushed = true;
        }
    }

    /// How `record` disagrees with the slot `seen` the index holds for it, if it does.
    fn disagreement(&self, seen: &Slot, record: &Record) -> Option<&'static str> {
        if self.inner.index.tag(&record.fingerprint()) != seen.tag() {
            return Some("the record's fingerprint is not the one its head holds");
        }
        match (seen.state(), &record.state) {
            (SlotState::Completed { durable: true, .. }, Stored::InProgress { .. }) => {
                Some("its head says it is completed, the record that it is in progress")
            }
            _ => None,
        }
    }

    pub(crate) fn complete(&self, ticket: Ticket, response: Response) -> Result<()> {
        let (seq, hash, fence) = self.complete_start(ticket, response)?;
        self.inner.pipeline.wait(seq)?;
        self.mark_durable(&hash, fence);
        Ok(())
    }

    /// Queues a completion; [`FileStore::mark_durable`] with the fence it returns once it is
    /// durable. The ticket was checked at the seam (this store's, the response within the
    /// limit).
    ///
    /// The completed record is written at a fence of its own, taken in queue order, and
    /// replaces the claim's record in the same transaction: completions are appended to the
    /// records table in rising order and fill its leaves, where rewriting the claim's record in
    /// place, three times its size, would split leaves packed with claims (`docs/design.md`,
    /// "Where a completion is stored"). The record still names its claim's fence.
    pub(crate) fn complete_start(
        &self,
        mut ticket: Ticket,
        response: Response,
    ) -> Result<(Seq, KeyHash, u64)> {
        let inner = &*self.inner;
        inner.pipeline.check()?;
        let hash = inner.index.hash(ticket.key());
        let now = self.now();
        let expires_at = now.saturating_add(duration_millis(inner.config.ttl));
        let record = Record {
            fence: ticket.fence(),
            fingerprint: *ticket.fingerprint().as_bytes(),
            claimed_at: ticket.claimed_at(),
            state: RecordState::Completed {
                completed_at: now,
                expires_at,
                response: response.into(),
            },
        };
        let packed = record.pack(inner.config.packing());
        let (seq, place) = {
            let mut stripe = inner.index.lock(&hash);
            let slot = held(&mut stripe, &hash, &ticket)?;
            let (seq, place) = inner.pipeline.enqueue_with(|| {
                let place = inner.next_fence.fetch_add(1, Ordering::Relaxed);
                let op = Op::Put {
                    fence: place,
                    value: packed.encode_at(place, ticket.key()),
                    expiry: Some(expires_at),
                    replaces: Some(Gone::of(slot)),
                    fresh: true,
                };
                (op, place)
            })?;
            let state = SlotState::Completed {
                expires_at,
                durable: false,
            };
            *slot = Slot::new(place, slot.tag(), state);
            (seq, place)
        };
        inner.config.observer.census(-1, 1);
        ticket.spend();
        Ok((seq, hash, place))
    }

    pub(crate) fn release(&self, mut ticket: Ticket) -> Result<()> {
        let seq = self.release_start(&mut ticket)?;
        self.inner.pipeline.wait(seq)
    }

    pub(crate) fn release_start(&self, ticket: &mut Ticket) -> Result<Seq> {
        let inner = &*self.inner;
        inner.pipeline.check()?;
        let hash = inner.index.hash(ticket.key());
        let mut stripe = inner.index.lock(&hash);
        let gone = Gone::of(held(&mut stripe, &hash, ticket)?);
        let seq = inner.pipeline.enqueue(Op::Delete(gone))?;
        stripe.remove(&hash);
        self.uncount(ticket.key());
        inner.config.observer.census(-1, 0);
        inner.watchers.notify(&hash);
        drop(stripe);
        ticket.spend();
        Ok(seq)
    }

    /// Undoes an acquired claim that nobody received (its `claim_async` future was dropped
    /// before it returned the ticket). No side effect can have started under it, so it must
    /// not hold the key: a fresh claim is released (its delete is queued behind its put and
    /// committed in the background). A takeover is not released, since the attempt it replaced
    /// may have acted: its lease is ended instead, so the next claim takes the key over again
    /// (and reconciles), or the reaper resolves it.
    pub(crate) fn withdraw(&self, mut ticket: Ticket) {
        ticket.spend();
        let inner = &*self.inner;
        let hash = inner.index.hash(ticket.key());
        let mut stripe = inner.index.lock(&hash);
        let Some(slot) = stripe.get_mut(&hash) else {
            return;
        };
        if slot.fence() != ticket.fence() || !matches!(slot.state(), SlotState::InProgress { .. }) {
            return;
        }
        inner.carried.withdrawn.fetch_add(1, Ordering::Relaxed);
        if ticket.takeover().is_some() {
            slot.set_state(SlotState::InProgress {
                lease_until: self.now(),
                orphan: true,
            });
            inner.watchers.notify(&hash);
            return;
        }
        // After a failed commit the store answers nothing any more: leave it be.
        if let Ok(seq) = inner.pipeline.enqueue(Op::Delete(Gone::of(slot))) {
            stripe.remove(&hash);
            self.uncount(ticket.key());
            inner.config.observer.census(-1, 0);
            inner.watchers.notify(&hash);
            drop(stripe);
            inner.pipeline.commit_soon(seq);
        }
    }

    pub(crate) fn extend(&self, ticket: &Ticket, by: Duration) -> Result<()> {
        let (seq, lease_until) = self.extend_start(ticket, by)?;
        self.inner.pipeline.wait(seq)?;
        ticket.renewed(lease_until);
        Ok(())
    }

    pub(crate) fn extend_start(&self, ticket: &Ticket, by: Duration) -> Result<(Seq, u64)> {
        let inner = &*self.inner;
        inner.pipeline.check()?;
        let hash = inner.index.hash(ticket.key());
        let lease_until = self.now().saturating_add(duration_millis(by));
        let record = Record {
            fence: ticket.fence(),
            fingerprint: *ticket.fingerprint().as_bytes(),
            claimed_at: ticket.claimed_at(),
            state: RecordState::InProgress { lease_until },
        };
        let seq = {
            let mut stripe = inner.index.lock(&hash);
            let slot = held(&mut stripe, &hash, ticket)?;
            let seq = inner.pipeline.enqueue(Op::Put {
                fence: ticket.fence(),
                value: record.encode(ticket.key(), Packing::Plain),
                expiry: None,
                replaces: None,
                // The claim's fence, written before.
                fresh: false,
            })?;
            slot.set_state(SlotState::InProgress {
                lease_until,
                orphan: false,
            });
            seq
        };
        Ok((seq, lease_until))
    }

    /// Lets claims replay a completion once its batch is fsynced.
    pub(crate) fn mark_durable(&self, hash: &KeyHash, fence: u64) {
        let mut stripe = self.inner.index.lock(hash);
        if let Some(slot) = stripe.get_mut(hash).filter(|s| s.fence() == fence) {
            if let SlotState::Completed { expires_at, .. } = slot.state() {
                slot.set_state(SlotState::Completed {
                    expires_at,
                    durable: true,
                });
            }
        }
        self.inner.watchers.notify(hash);
    }

    pub(crate) fn get(&self, scope: &Scope, key: &str) -> Result<Option<Entry>> {
        let inner = &*self.inner;
        inner.pipeline.check()?;
        let key = inner.index.key(scoped_key(scope, key)?);
        loop {
            let now = self.now();
            let Some(slot) = inner.index.lock(&key.hash).get(&key.hash).cloned() else {
                return Ok(None);
            };
            if let SlotState::Completed { expires_at, .. } = slot.state() {
                if now >= expires_at {
                    return Ok(None);
                }
            }
            let Some(record) = self.record_at(&key, &slot)? else {
                continue;
            };
            let (fingerprint, claimed_at) = (record.fingerprint(), record.claimed_at);
            let fence = record.fence;
            let state = match (slot.state(), record.state) {
                (
                    SlotState::InProgress {
                        lease_until,
                        orphan,
                    },
                    _,
                ) => EntryState::InProgress {
                    lease_deadline: from_millis(lease_until),
                    orphan,
                },
                (SlotState::Completed { durable: false, .. }, _) => EntryState::InProgress {
                    lease_deadline: from_millis(now),
                    orphan: false,
                },
                (SlotState::Completed { expires_at, .. }, Stored::Completed { response, .. }) => {
                    EntryState::Completed {
                        expires_at: from_millis(expires_at),
                        response: response.into(),
                    }
                }
                // Completed in the index, still in progress in the file: the completion's
                // write landed between the two reads. Look again.
                (SlotState::Completed { .. }, Stored::InProgress { .. }) => continue,
            };
            return Ok(Some(Entry {
                fence,
                fingerprint,
                claimed_at: from_millis(claimed_at),
                state,
            }));
        }
    }

    /// A record of `scoped` was deleted: it no longer counts against its tenant.
    pub(crate) fn uncount(&self, scoped: &[u8]) {
        if let Some(tenants) = &self.inner.index.tenants {
            tenants.removed(scoped);
        }
    }

    /// Takes over the figures of `halted`, the store this one replaces after a heal. Call it
    /// before this store is shared.
    pub(crate) fn continue_counting(&mut self, halted: &FileStore) {
        let carried = Arc::clone(&halted.inner.carried);
        let p = &halted.inner.pipeline;
        carried
            .batches_before
            .fetch_add(p.batches(), Ordering::Relaxed);
        carried
            .checkpoints_before
            .fetch_add(p.checkpoints(), Ordering::Relaxed);
        carried.heals.fetch_add(1, Ordering::Relaxed);
        Arc::get_mut(&mut self.inner)
            .expect("a store just opened is not shared")
            .carried = carried;
    }

    pub(crate) fn lease_duration(&self) -> Duration {
        self.inner.config.lease
    }

    pub(crate) fn record_count(&self) -> Result<u64> {
        self.inner.pipeline.check()?;
        Ok(u64::try_from(self.inner.index.len()).unwrap_or(u64::MAX))
    }

    pub(crate) fn figures(&self) -> EngineFigures {
        let inner = &*self.inner;
        let (p, c) = (&inner.pipeline, &inner.carried);
        let get = |n: &AtomicU64| n.load(Ordering::Relaxed);
        EngineFigures {
            withdrawn: get(&c.withdrawn),
            commit_batches: p.batches() + get(&c.batches_before),
            checkpoints: p.checkpoints() + get(&c.checkpoints_before),
            live_records: Some(u64::try_from(inner.index.len()).unwrap_or(u64::MAX)),
            stored_bytes: p.record_bytes(),
            heals: get(&c.heals),
            disk_full: inner.space.as_ref().is_some_and(|s| s.is_full()),
        }
    }
}

/// The slot of the key hashed `hash` that `ticket` holds (the seam checked it is this
/// store's), or `LeaseLost`.
fn held<'s>(
    stripe: &'s mut crate::file::index::Stripe,
    hash: &KeyHash,
    ticket: &Ticket,
) -> Result<&'s mut Slot> {
    match stripe.get_mut(hash) {
        Some(slot)
            if slot.fence() == ticket.fence()
                && matches!(slot.state(), SlotState::InProgress { .. }) =>
        {
            Ok(slot)
        }
        _ => Err(Error::LeaseLost {
            fence: ticket.fence(),
        }),
    }
}
