//! The store: claim, complete, release, extend and inspection. Reaping and purging live in
//! `maintenance.rs`.

use crate::builder::{Config, StalePolicy, StoreBuilder};
use crate::claim::{Claim, Entry, EntryState, Takeover, Ticket};
use crate::clock::{duration_millis, from_millis, to_millis};
use crate::commit::{Pipeline, Seq};
use crate::disk::{self, Gone, Op};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::index::{Index, IndexKey, Slot, SlotState, Tag};
use crate::record::RecordState as Stored;
use crate::record::{response_size, Record, RecordState};
use crate::replay_cache::{Cached, ReplayCache};
use crate::response::Response;
use crate::scope::{display_scoped_key, scoped_key, Scope};
use crate::stats::{Counters, Stats};
use crate::sync::{Arc, AtomicU64, Ordering};
use crate::watch::Watchers;
use std::path::Path;
use std::time::Duration;

/// An idempotency-key store over one redb file.
///
/// `Store` is cheap to clone (an `Arc`), and `Send + Sync`: share one per file across every
/// thread. All operations are blocking; each write returns only once it is durable. Concurrent
/// writes share one fsync (group commit).
///
/// ```
/// use idemdb::{Claim, Fingerprint, Response, Scope, Store};
/// let store = Store::in_memory()?;
/// let scope = Scope::new("tenant_42", "POST /v1/payments");
/// let body = br#"{"amount":5000}"#;
/// match store.claim(&scope, "7c9e6679-7425-40de", Fingerprint::of(body))? {
///     Claim::Acquired(ticket) => {
///         // ... charge the card, exactly once ...
///         store.complete(ticket, Response::new(201, r#"{"id":"pay_1"}"#))?;
///     }
///     other => unreachable!("a new key is acquired: {other:?}"),
/// }
/// // The retry after a lost response gets the stored response back.
/// let Claim::Replay(r) = store.claim(&scope, "7c9e6679-7425-40de", Fingerprint::of(body))? else {
///     unreachable!()
/// };
/// assert_eq!(r.body(), br#"{"id":"pay_1"}"#);
/// # Ok::<(), idemdb::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Store {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) index: Index,
    pub(crate) pipeline: Arc<Pipeline>,
    pub(crate) config: Config,
    pub(crate) counters: Counters,
    replays: ReplayCache,
    next_fence: AtomicU64,
    pub(crate) watchers: Arc<Watchers>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.pipeline.close();
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

impl Store {
    /// Opens (or creates) the store at `path` with the default settings: 24 h TTL, 60 s lease,
    /// [`StalePolicy::TakeOver`], 1 MiB responses. See [`StoreBuilder::open`].
    ///
    /// # Errors
    /// As [`StoreBuilder::open`].
    pub fn open(path: impl AsRef<Path>) -> Result<Store> {
        StoreBuilder::default().open(path)
    }

    /// A builder to change the defaults.
    pub fn builder() -> StoreBuilder {
        StoreBuilder::default()
    }

    /// A store in memory with the default settings, for users' own tests.
    ///
    /// # Errors
    /// As [`StoreBuilder::in_memory`].
    pub fn in_memory() -> Result<Store> {
        StoreBuilder::default().in_memory()
    }

    pub(crate) fn open_with(config: Config, path: &Path) -> Result<Store> {
        if !path.try_exists()? {
            create_atomically(path)?;
        }
        contain_panics(|| {
            let open = |cache| -> Result<redb::Database> {
                Ok(redb::Builder::new().set_cache_size(cache).create(path)?)
            };
            let db = open(SCAN_CACHE_BYTES)?;
            // Only now, with redb's lock on the store file held, is the journal touched.
            let journal = journal_path(path);
            let source = JournalSource {
                existed: journal.try_exists()?,
                capacity: config.journal_bytes.unwrap_or(DEFAULT_JOURNAL_BYTES),
                open: Box::new(move || {
                    let file = std::fs::OpenOptions::new()
                        .read(true)
                        .write(true)
                        .create(true)
                        .truncate(false)
                        .open(&journal)?;
                    sync_parent_dir(&journal)?;
                    Ok(Box::new(JournalFile(file)) as Box<dyn redb::StorageBackend>)
                }),
            };
            Store::start(config, db, Some(&open), Some(source))
        })
    }

    pub(crate) fn in_memory_with(config: Config) -> Result<Store> {
        contain_panics(|| {
            let db = redb::Builder::new()
                .set_cache_size(config.cache_bytes)
                .create_with_backend(redb::backends::InMemoryBackend::new())?;
            Store::start(config, db, None, None)
        })
    }

    #[cfg(any(test, fuzzing, feature = "simulation"))]
    pub(crate) fn simulated_with(
        config: Config,
        disk: &crate::simulation::SimDisk,
    ) -> Result<Store> {
        contain_panics(|| {
            let open = |cache| -> Result<redb::Database> {
                Ok(redb::Builder::new()
                    .set_cache_size(cache)
                    .create_with_backend(disk.backend())?)
            };
            let db = open(SCAN_CACHE_BYTES)?;
            let journal = disk.journal_backend();
            let source = JournalSource {
                existed: !disk.journal_image().is_empty(),
                capacity: config.journal_bytes.unwrap_or(SIMULATED_JOURNAL_BYTES),
                open: Box::new(move || Ok(Box::new(journal) as Box<dyn redb::StorageBackend>)),
            };
            Store::start(config, db, Some(&open), Some(source))
        })
    }

    /// Recovers the journal into `db`, builds the index from it, and starts the store. `db` is
    /// opened with a small page cache: the scan reads every page once, and filling a large
    /// cache only costs time (measured: 10.2 s with 64 MiB, 8.1 s with 4 MiB, for 10 million
    /// records). With `reopen`, the file is then reopened with the configured cache.
    fn start(
        config: Config,
        db: redb::Database,
        reopen: Option<&dyn Fn(usize) -> Result<redb::Database>>,
        journal: Option<JournalSource>,
    ) -> Result<Store> {
        disk::initialise(&db)?;
        let (mut reserved, epoch) = disk::meta(&db)?;
        let journal = match journal {
            Some(source) if source.capacity > 0 => {
                Some(recover_journal(&db, source, epoch, &mut reserved)?)
            }
            _ if epoch > 0 => {
                // The journal may hold acknowledged batches: it must be read, never skipped.
                return Err(journal_missing(epoch));
            }
            _ => None,
        };
        let (index, loaded) = load_index(&config, &db)?;
        let db = match reopen {
            Some(open) => {
                drop(db);
                open(config.cache_bytes)?
            }
            None => db,
        };
        let watchers = Arc::new(Watchers::default());
        let on_halt = {
            let watchers = Arc::clone(&watchers);
            Box::new(move || watchers.notify_all())
        };
        Ok(Store {
            inner: Arc::new(Inner {
                index,
                pipeline: Arc::new(Pipeline::new(db, loaded.reserved, journal, on_halt)),
                watchers,
                replays: ReplayCache::new(config.replay_cache_bytes),
                config,
                counters: Counters::default(),
                next_fence: AtomicU64::new(loaded.high_fence + 1),
            }),
        })
    }

    pub(crate) fn now(&self) -> u64 {
        to_millis(self.inner.config.clock.now())
    }

    /// Claims `key` in `scope` for a request with `fingerprint`, before the side effect runs.
    ///
    /// - A new key (or one whose record expired) is [`Claim::Acquired`]; the in-progress record
    ///   is durable before this returns (its batch's journal entry is written and the journal
    ///   `fdatasync(2)`ed; see `docs/design.md`).
    /// - A completed key with the same fingerprint is [`Claim::Replay`] with the stored response.
    /// - A key in progress is [`Claim::InProgress`]; a stale one (lease run out) is taken over
    ///   under [`StalePolicy::TakeOver`] (an `Acquired` whose ticket says so).
    /// - A key held or completed with another fingerprint is [`Claim::Mismatch`], and nothing
    ///   changes.
    ///
    /// # Concurrency
    /// Any number of threads may claim the same key at once: exactly one gets `Acquired`, the
    /// others `InProgress` (or, once it completed, `Replay`). If the holder panics or drops its
    /// ticket, the key stays in progress until the lease runs out.
    ///
    /// # Errors
    /// [`Error::InvalidKey`] / [`Error::InvalidScope`] for bad input (nothing stored);
    /// [`Error::Halted`] after a failed commit; [`Error::Io`] if the commit holding this claim
    /// failed, in which case the claim is not held.
    pub fn claim(&self, scope: &Scope, key: &str, fingerprint: Fingerprint) -> Result<Claim> {
        let key = self.claim_key(scope, key)?;
        loop {
            match self.claim_start(&key, fingerprint)? {
                Attempt::Answer(claim) => return Ok(claim),
                Attempt::Again => continue,
                Attempt::Queued(seq, ticket) => {
                    self.inner.pipeline.wait(seq)?;
                    return Ok(self.claim_finish(ticket));
                }
            }
        }
    }

    pub(crate) fn claim_key(&self, scope: &Scope, key: &str) -> Result<IndexKey> {
        self.inner.pipeline.check()?;
        Ok(self.inner.index.key(scoped_key(scope, key)?))
    }

    pub(crate) fn claim_finish(&self, ticket: Ticket) -> Claim {
        let c = &self.inner.counters;
        Counters::bump(&c.acquired, 1);
        if ticket.takeover.is_some() {
            Counters::bump(&c.takeovers, 1);
        }
        Claim::Acquired(ticket)
    }

    /// One attempt, up to queueing the claim's write.
    pub(crate) fn claim_start(&self, key: &IndexKey, fingerprint: Fingerprint) -> Result<Attempt> {
        let inner = &*self.inner;
        let c = &inner.counters;
        let now = self.now();
        let tag = inner.index.tag(&fingerprint);
        let stripe = inner.index.lock(&key.hash);
        let replaces = match stripe.get(&key.hash) {
            None => None,
            Some(slot) => match slot.state() {
                SlotState::Completed { expires_at, .. } if now >= expires_at => {
                    Some(Gone::of(slot))
                }
                _ if slot.tag() != tag => {
                    Counters::bump(&c.mismatches, 1);
                    let completed = matches!(slot.state(), SlotState::Completed { .. });
                    return Ok(Attempt::Answer(Claim::Mismatch { completed }));
                }
                SlotState::Completed { durable: false, .. } => {
                    return Ok(Attempt::Answer(self.in_progress(Duration::ZERO, false)));
                }
                SlotState::Completed { durable: true, .. } => {
                    let fence = slot.fence();
                    drop(stripe);
                    return self.replay(key, fence, fingerprint);
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
                        return Ok(Attempt::Answer(self.in_progress(Duration::ZERO, false)));
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
        mut stripe: crate::sync::MutexGuard<'_, crate::index::Stripe>,
        takeover: Option<Takeover>,
        replaces: Option<Gone>,
    ) -> Result<Attempt> {
        let inner = &*self.inner;
        let now = self.now();
        let fence = inner.next_fence.fetch_add(1, Ordering::Relaxed);
        let lease_until = now.saturating_add(duration_millis(inner.config.lease));
        let record = Record {
            fence,
            fingerprint: *fingerprint.as_bytes(),
            claimed_at: now,
            state: RecordState::InProgress { lease_until },
        };
        let seq = inner.pipeline.enqueue(Op::Put {
            fence,
            key: key.bytes.clone(),
            value: record.encode(&key.bytes),
            expiry: None,
            replaces,
        })?;
        let state = SlotState::InProgress {
            lease_until,
            orphan: false,
        };
        stripe.insert(key.hash, Slot::new(fence, tag, state));
        drop(stripe);
        let ticket = Ticket {
            store: Arc::downgrade(&self.inner),
            key: key.clone(),
            fence,
            fingerprint,
            claimed_at: now,
            lease_until: AtomicU64::new(lease_until),
            takeover,
        };
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
        let Some(previous) = self.record_at(key, seen.fence())? else {
            return Ok(Attempt::Again);
        };
        if previous.fingerprint() != fingerprint {
            Counters::bump(&self.inner.counters.mismatches, 1);
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

    /// An `InProgress` answer. `lease_remaining` is zero when no live lease bounds the wait (a
    /// completion being made durable, or a stale claim kept for the reaper): the hint stands
    /// alone then. When the holder is gone (`orphan`: its ticket was dropped, or its process
    /// died) nothing but the lease's end (or a reap) frees the key, so the honest retry time
    /// is the lease's end, not the short hint.
    fn in_progress(&self, lease_remaining: Duration, orphan: bool) -> Claim {
        Counters::bump(&self.inner.counters.in_progress, 1);
        let hint = self.inner.config.retry_after;
        let retry_after = if lease_remaining.is_zero() {
            hint
        } else if orphan {
            lease_remaining
        } else {
            hint.min(lease_remaining)
        };
        Claim::InProgress {
            retry_after,
            lease_remaining,
        }
    }

    /// Reads a completed record's response. The index said `fence` is completed and durable
    /// and its fingerprint tag matched; the full fingerprint is compared here. If the disk now
    /// holds another record (expired and re-claimed meanwhile) the claim looks again.
    fn replay(&self, key: &IndexKey, fence: u64, fingerprint: Fingerprint) -> Result<Attempt> {
        let c = &self.inner.counters;
        if let Some(hit) = self.inner.replays.get(fence) {
            if hit.key == key.bytes {
                return Ok(if hit.fingerprint != fingerprint {
                    Counters::bump(&c.mismatches, 1);
                    Attempt::Answer(Claim::Mismatch { completed: true })
                } else {
                    Counters::bump(&c.replays, 1);
                    Attempt::Answer(Claim::Replay(hit.response.clone()))
                });
            }
        }
        Ok(match self.record_at(key, fence)? {
            Some(record) if record.fingerprint() != fingerprint => {
                Counters::bump(&c.mismatches, 1);
                Attempt::Answer(Claim::Mismatch { completed: true })
            }
            Some(Record {
                state: Stored::Completed { response, .. },
                ..
            }) => {
                Counters::bump(&c.replays, 1);
                let response = Response::from(response);
                self.inner.replays.insert(
                    fence,
                    Cached {
                        key: key.bytes.clone(),
                        fingerprint,
                        response: response.clone(),
                    },
                );
                Attempt::Answer(Claim::Replay(response))
            }
            _ => Attempt::Again,
        })
    }

    /// The record the index has for `key` at `fence`, read from the file with no lock held;
    /// `None` if the index moved on meanwhile (the record was replaced or deleted).
    ///
    /// # Errors
    /// [`Error::Corrupted`] if the record is another key's (a damaged file, or a 128-bit hash
    /// collision: either way no response crosses keys), or if the index still points at
    /// `fence` but the file has no record there even after every queued write landed (looking
    /// again would spin forever).
    fn record_at(&self, key: &IndexKey, fence: u64) -> Result<Option<Record>> {
        let inner = &*self.inner;
        for first in [true, false] {
            match disk::read_at(inner.pipeline.db(), fence)? {
                Some((stored, record)) if stored == key.bytes => return Ok(Some(record)),
                Some((stored, _)) => {
                    return Err(Error::Corrupted {
                        key: display_scoped_key(&key.bytes),
                        reason: format!(
                            "the index points this key at fence {fence}, whose record is {}'s",
                            display_scoped_key(&stored)
                        ),
                    })
                }
                None => {}
            }
            let unchanged = inner
                .index
                .lock(&key.hash)
                .get(&key.hash)
                .is_some_and(|slot| slot.fence() == fence);
            if !unchanged {
                return Ok(None);
            }
            if first {
                // A claim's record may still be queued: let every queued write land.
                inner.pipeline.flush()?;
            }
        }
        Err(Error::Corrupted {
            key: display_scoped_key(&key.bytes),
            reason: format!("the record at fence {fence} is missing from the file"),
        })
    }

    /// Stores `response` for the ticket's key and ends the claim: every later claim with the
    /// same fingerprint replays it until the TTL runs out. Durable before this returns (journal
    /// entry and `fdatasync(2)`, as for `claim`).
    ///
    /// A claim may be completed after its lease ran out, as long as nobody took it over or
    /// reaped it.
    ///
    /// # Concurrency
    /// Claims of the key made while this runs answer `InProgress` until the completion is
    /// durable, then `Replay`.
    ///
    /// # Errors
    /// [`Error::ResponseTooLarge`] (the claim is still held and the error hands the ticket
    /// back: release it or store a smaller response); [`Error::LeaseLost`] if the claim was released, reaped or taken over, or the
    /// ticket is from another store; [`Error::Halted`] / [`Error::Io`] if the commit failed.
    pub fn complete(&self, ticket: Ticket, response: Response) -> Result<()> {
        let (seq, done) = self.complete_start(ticket, response)?;
        self.inner.pipeline.wait(seq)?;
        self.complete_finish(&done);
        Ok(())
    }

    /// Queues a completion; [`Store::complete_finish`] once it is durable.
    pub(crate) fn complete_start(
        &self,
        mut ticket: Ticket,
        response: Response,
    ) -> Result<(Seq, Ticket)> {
        let inner = &*self.inner;
        inner.pipeline.check()?;
        let size = response_size(&response);
        if size > inner.config.max_response_bytes {
            return Err(Error::ResponseTooLarge {
                size,
                limit: inner.config.max_response_bytes,
                ticket: Some(Box::new(ticket)),
            });
        }
        let now = self.now();
        let expires_at = now.saturating_add(duration_millis(inner.config.ttl));
        let record = Record {
            fence: ticket.fence,
            fingerprint: *ticket.fingerprint.as_bytes(),
            claimed_at: ticket.claimed_at,
            state: RecordState::Completed {
                completed_at: now,
                expires_at,
                response: response.into(),
            },
        };
        let value = record.encode(&ticket.key.bytes);
        let seq = {
            let mut stripe = inner.index.lock(&ticket.key.hash);
            let slot = self.held(&mut stripe, &ticket)?;
            let seq = inner.pipeline.enqueue(Op::Put {
                fence: ticket.fence,
                key: ticket.key.bytes.clone(),
                value,
                expiry: Some(expires_at),
                replaces: None,
            })?;
            slot.set_state(SlotState::Completed {
                expires_at,
                durable: false,
            });
            seq
        };
        ticket.spend();
        Ok((seq, ticket))
    }

    pub(crate) fn complete_finish(&self, ticket: &Ticket) {
        self.mark_durable(&ticket.key, ticket.fence);
        Counters::bump(&self.inner.counters.completes, 1);
    }

    /// Deletes the claim, durably, so the next claim of the key is `Acquired` and executes.
    /// Use it when the failure belonged to the moment (a timeout, a 503 downstream), not to
    /// the request.
    ///
    /// # Concurrency
    /// A claim racing with the release either sees the key in progress or acquires it anew;
    /// it never sees a half-released key.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the claim is no longer held by this ticket;
    /// [`Error::Halted`] / [`Error::Io`] if the commit failed.
    pub fn release(&self, mut ticket: Ticket) -> Result<()> {
        let seq = self.release_start(&mut ticket)?;
        self.inner.pipeline.wait(seq)?;
        Counters::bump(&self.inner.counters.releases, 1);
        Ok(())
    }

    pub(crate) fn release_start(&self, ticket: &mut Ticket) -> Result<Seq> {
        let inner = &*self.inner;
        inner.pipeline.check()?;
        let mut stripe = inner.index.lock(&ticket.key.hash);
        let gone = Gone::of(self.held(&mut stripe, ticket)?);
        let seq = inner.pipeline.enqueue(Op::Delete(gone))?;
        stripe.remove(&ticket.key.hash);
        inner.watchers.notify(&ticket.key.hash);
        drop(stripe);
        ticket.spend();
        Ok(seq)
    }

    /// A ticket was dropped unspent: if it still holds its claim, the claim is an orphan now.
    /// Nothing is written: the claim stays in progress until its lease runs out (the side
    /// effect may have happened), but `reap` offers it at once and duplicates are told to come
    /// back when the lease ends.
    pub(crate) fn holder_gone(&self, key: &IndexKey, fence: u64) {
        let mut stripe = self.inner.index.lock(&key.hash);
        if let Some(slot) = stripe.get_mut(&key.hash) {
            if let SlotState::InProgress { lease_until, .. } = slot.state() {
                if slot.fence() == fence {
                    slot.set_state(SlotState::InProgress {
                        lease_until,
                        orphan: true,
                    });
                }
            }
        }
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
        let mut stripe = inner.index.lock(&ticket.key.hash);
        let Some(slot) = stripe.get_mut(&ticket.key.hash) else {
            return;
        };
        if slot.fence() != ticket.fence || !matches!(slot.state(), SlotState::InProgress { .. }) {
            return;
        }
        Counters::bump(&inner.counters.withdrawn, 1);
        if ticket.takeover.is_some() {
            slot.set_state(SlotState::InProgress {
                lease_until: self.now(),
                orphan: true,
            });
            inner.watchers.notify(&ticket.key.hash);
            return;
        }
        // After a failed commit the store answers nothing any more: leave it be.
        if let Ok(seq) = inner.pipeline.enqueue(Op::Delete(Gone::of(slot))) {
            stripe.remove(&ticket.key.hash);
            inner.watchers.notify(&ticket.key.hash);
            drop(stripe);
            inner.pipeline.commit_soon(seq);
        }
    }

    /// Renews the ticket's lease to run until `by` from now, durably, so a slow handler is not
    /// taken over. May be called any number of times while the claim is held.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the claim is no longer held by this ticket (a takeover may
    /// already have happened: stop and reconcile); [`Error::Halted`] / [`Error::Io`] if the
    /// commit failed.
    pub fn extend(&self, ticket: &Ticket, by: Duration) -> Result<()> {
        let (seq, lease_until) = self.extend_start(ticket, by)?;
        self.inner.pipeline.wait(seq)?;
        ticket.lease_until.store(lease_until, Ordering::Relaxed);
        Ok(())
    }

    pub(crate) fn extend_start(&self, ticket: &Ticket, by: Duration) -> Result<(Seq, u64)> {
        let inner = &*self.inner;
        inner.pipeline.check()?;
        let lease_until = self.now().saturating_add(duration_millis(by));
        let record = Record {
            fence: ticket.fence,
            fingerprint: *ticket.fingerprint.as_bytes(),
            claimed_at: ticket.claimed_at,
            state: RecordState::InProgress { lease_until },
        };
        let seq = {
            let mut stripe = inner.index.lock(&ticket.key.hash);
            let slot = self.held(&mut stripe, ticket)?;
            let seq = inner.pipeline.enqueue(Op::Put {
                fence: ticket.fence,
                key: ticket.key.bytes.clone(),
                value: record.encode(&ticket.key.bytes),
                expiry: None,
                replaces: None,
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
    pub(crate) fn mark_durable(&self, key: &IndexKey, fence: u64) {
        let mut stripe = self.inner.index.lock(&key.hash);
        if let Some(slot) = stripe.get_mut(&key.hash) {
            if let SlotState::Completed { expires_at, .. } = slot.state() {
                if slot.fence() == fence {
                    slot.set_state(SlotState::Completed {
                        expires_at,
                        durable: true,
                    });
                }
            }
        }
        self.inner.watchers.notify(&key.hash);
    }

    /// The slot `ticket` holds, or `LeaseLost`.
    fn held<'s>(
        &self,
        stripe: &'s mut crate::index::Stripe,
        ticket: &Ticket,
    ) -> Result<&'s mut Slot> {
        let lost = Error::LeaseLost {
            fence: ticket.fence,
        };
        if !std::ptr::eq(ticket.store.as_ptr(), Arc::as_ptr(&self.inner)) {
            return Err(lost);
        }
        match stripe.get_mut(&ticket.key.hash) {
            Some(slot)
                if slot.fence() == ticket.fence
                    && matches!(slot.state(), SlotState::InProgress { .. }) =>
            {
                Ok(slot)
            }
            _ => Err(lost),
        }
    }

    /// The record of `key` in `scope` as claims see it now: `None` if absent or expired.
    /// Completed records are read from disk for their response.
    ///
    /// # Concurrency
    /// A snapshot; it may be stale by the time it returns.
    ///
    /// # Errors
    /// [`Error::InvalidKey`] / [`Error::InvalidScope`]; [`Error::Corrupted`] if the record fails
    /// its checksum; [`Error::Halted`] after a failed commit.
    pub fn get(&self, scope: &Scope, key: &str) -> Result<Option<Entry>> {
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
            let Some(record) = self.record_at(&key, slot.fence())? else {
                continue;
            };
            let (fingerprint, claimed_at) = (record.fingerprint(), record.claimed_at);
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
                fence: slot.fence(),
                fingerprint,
                claimed_at: from_millis(claimed_at),
                state,
            }));
        }
    }

    /// The counters since the store was opened.
    pub fn stats(&self) -> Stats {
        let inner = &*self.inner;
        let live = u64::try_from(inner.index.len()).unwrap_or(u64::MAX);
        let p = &inner.pipeline;
        inner.counters.snapshot(p.batches(), p.checkpoints(), live)
    }
}

/// redb's page cache while a store opens.
const SCAN_CACHE_BYTES: usize = 4 << 20;

/// The journal's default size: 16 MiB, a few tens of thousands of batches between checkpoints.
const DEFAULT_JOURNAL_BYTES: u64 = 16 << 20;
/// On the simulated disk, a small journal, so crash tests cross many checkpoints.
#[cfg(any(test, fuzzing, feature = "simulation"))]
const SIMULATED_JOURNAL_BYTES: u64 = 64 << 10;

/// Where a store's journal lives: `<store file>-journal`, beside it.
pub(crate) fn journal_path(store: &Path) -> std::path::PathBuf {
    let mut name = store.as_os_str().to_owned();
    name.push("-journal");
    name.into()
}

/// How to reach the journal of a store being opened.
struct JournalSource {
    /// Whether the file was there before this open.
    existed: bool,
    /// 0 turns the journal off.
    capacity: u64,
    open: Box<dyn FnOnce() -> Result<Box<dyn redb::StorageBackend>>>,
}

fn journal_missing(epoch: u64) -> Error {
    Error::Corrupted {
        key: "(journal)".into(),
        reason: format!(
            "the store file says its journal holds epoch {epoch}, but the journal file is \
             missing (or the journal is turned off); it may hold acknowledged writes"
        ),
    }
}

/// Replays the journal's current epoch into the redb file and checkpoints it: one durable
/// commit of every journaled op, raising the epoch, so the journal starts empty.
fn recover_journal(
    db: &redb::Database,
    source: JournalSource,
    epoch: u64,
    reserved: &mut u64,
) -> Result<crate::journal::Journal> {
    if epoch > 0 && !source.existed {
        return Err(journal_missing(epoch));
    }
    let file = (source.open)()?;
    let (mut journal, ops) = crate::journal::Journal::open(file, source.capacity, epoch)?;
    let next = epoch + 1;
    disk::write_batch(
        db,
        &ops,
        reserved,
        disk::Commit::Durable { epoch: Some(next) },
    )?;
    journal.restart(next);
    Ok(journal)
}

/// A journal in a real file, through positioned reads and writes.
struct JournalFile(std::fs::File);

impl std::fmt::Debug for JournalFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JournalFile")
    }
}

#[cfg(unix)]
impl redb::StorageBackend for JournalFile {
    fn len(&self) -> std::io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(&self.0, out, offset)
    }

    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.0.set_len(len)
    }

    /// `fdatasync(2)`.
    fn sync_data(&self) -> std::io::Result<()> {
        self.0.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(&self.0, data, offset)
    }
}

/// Builds the index from the file. Two records whose keys share a 128-bit hash (about 10⁻²⁵ at
/// ten million keys) make the scan start again with fresh random hash keys.
fn load_index(config: &Config, db: &redb::Database) -> Result<(Index, disk::Loaded)> {
    let mut attempts = 0;
    loop {
        let index = Index::new(config.stripes);
        match disk::load(db, &index)? {
            disk::Scan::Loaded(loaded) => return Ok((index, loaded)),
            disk::Scan::Collision if attempts < 3 => attempts += 1,
            disk::Scan::Collision => {
                return Err(Error::Corrupted {
                    key: "(index)".into(),
                    reason: "two records' keys share an index hash under every hash key tried"
                        .into(),
                })
            }
        }
    }
}

/// Runs an open, turning a panic into [`Error::Corrupted`]. redb 4.6 trusts its pages on a
/// clean open and panics on some damaged ones (an unknown page type, an out-of-range slice, a
/// table name that is not UTF-8); found by the `open_file` fuzz target. A damaged file must be
/// a typed error, never a crash of the service that opens it.
fn contain_panics(open: impl FnOnce() -> Result<Store>) -> Result<Store> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(open))
        .unwrap_or_else(|panic| Err(crate::error::storage_panic(panic)))
}

/// Creates an initialised store file at `path`. The file is built under a temporary name in the
/// same directory and fsynced, then hard-linked into place, which fails rather than replace a
/// file another process created meanwhile; then the directory is fsynced. A crash part way
/// leaves at most a stray `*.creating-*` file, never a half-made store at `path` (which redb
/// would refuse to open, locking the user out of a store that never held anything).
fn create_atomically(path: &Path) -> Result<()> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".creating-{}-{nanos}", std::process::id()));
    let tmp = path.with_file_name(name);
    {
        let db = redb::Builder::new().create(&tmp)?;
        disk::initialise(&db)?;
    }
    let linked = std::fs::hard_link(&tmp, path);
    std::fs::remove_file(&tmp)?;
    match linked {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e.into()),
        _ => {}
    }
    sync_parent_dir(path)
}

/// A new file's directory entry is durable only once the directory is fsynced.
fn sync_parent_dir(path: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        std::fs::File::open(parent)?.sync_all()?;
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}
