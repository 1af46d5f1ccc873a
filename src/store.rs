//! The store: claim, complete, release, extend and inspection. Reaping and purging live in
//! `maintenance.rs`.

use crate::builder::{Config, StalePolicy, StoreBuilder};
use crate::claim::{Claim, Entry, EntryState, Takeover, Ticket};
use crate::clock::{duration_millis, from_millis, to_millis};
use crate::commit::{Pipeline, Seq};
use crate::disk::{self, Gone, Op};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::index::{Index, IndexKey, Slot, SlotState};
use crate::record::{response_size, Record, RecordState};
use crate::response::Response;
use crate::scope::{scoped_key, Scope};
use crate::stats::{Counters, Stats};
use crate::sync::{Arc, AtomicU64, Ordering};
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
    next_fence: AtomicU64,
    /// Tells this store's tickets from another's (or a previous process's).
    id: u64,
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

static NEXT_STORE_ID: AtomicU64 = AtomicU64::new(1);

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
        contain_panics(|| Store::start(config, redb::Builder::new().create(path)?))
    }

    pub(crate) fn in_memory_with(config: Config) -> Result<Store> {
        Store::backend_with(config, redb::backends::InMemoryBackend::new())
    }

    pub(crate) fn backend_with(
        config: Config,
        backend: impl redb::StorageBackend,
    ) -> Result<Store> {
        contain_panics(|| Store::start(config, redb::Builder::new().create_with_backend(backend)?))
    }

    fn start(config: Config, db: redb::Database) -> Result<Store> {
        disk::initialise(&db)?;
        let loaded = disk::load(&db)?;
        let index = Index::new(config.stripes);
        for (bytes, slot) in loaded.slots {
            let key = index.key(bytes);
            let fence = slot.fence;
            if let Some(other) = index.lock(&key).insert(key.clone(), slot) {
                return Err(Error::Corrupted {
                    key: crate::scope::display_scoped_key(&key.bytes),
                    reason: format!(
                        "two records for one key (fences {} and {fence})",
                        other.fence
                    ),
                });
            }
        }
        Ok(Store {
            inner: Arc::new(Inner {
                index,
                pipeline: Arc::new(Pipeline::new(db, loaded.reserved)),
                config,
                counters: Counters::default(),
                next_fence: AtomicU64::new(loaded.high_fence + 1),
                id: NEXT_STORE_ID.fetch_add(1, Ordering::Relaxed),
            }),
        })
    }

    pub(crate) fn now(&self) -> u64 {
        to_millis(self.inner.config.clock.now())
    }

    /// Claims `key` in `scope` for a request with `fingerprint`, before the side effect runs.
    ///
    /// - A new key (or one whose record expired) is [`Claim::Acquired`]; the in-progress record
    ///   is durable before this returns (redb commit: `fdatasync(2)` of the file).
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
        let mut stripe = inner.index.lock(key);
        let (takeover, replaces) = match stripe.get(key) {
            None => (None, None),
            Some(slot) => match slot.state {
                SlotState::Completed { expires_at, .. } if now >= expires_at => {
                    (None, Some(Gone::of(slot)))
                }
                _ if slot.fingerprint != fingerprint => {
                    Counters::bump(&c.mismatches, 1);
                    let completed = matches!(slot.state, SlotState::Completed { .. });
                    return Ok(Attempt::Answer(Claim::Mismatch { completed }));
                }
                SlotState::Completed { durable: false, .. } => {
                    return Ok(Attempt::Answer(self.in_progress(Duration::ZERO)));
                }
                SlotState::Completed { durable: true, .. } => {
                    let fence = slot.fence;
                    drop(stripe);
                    return Ok(match self.replay(key, fence)? {
                        Some(claim) => Attempt::Answer(claim),
                        None => Attempt::Again,
                    });
                }
                SlotState::InProgress {
                    lease_until,
                    orphan,
                } => {
                    if now < lease_until {
                        let left = Duration::from_millis(lease_until - now);
                        return Ok(Attempt::Answer(self.in_progress(left)));
                    }
                    if inner.config.stale_policy == StalePolicy::Keep {
                        return Ok(Attempt::Answer(self.in_progress(Duration::ZERO)));
                    }
                    let takeover = Takeover {
                        previous_fence: slot.fence,
                        previous_claimed_at: from_millis(slot.claimed_at),
                        orphan,
                    };
                    (Some(takeover), Some(Gone::of(slot)))
                }
            },
        };
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
        stripe.insert(key.clone(), crate::disk::slot_of(&record, false));
        drop(stripe);
        let ticket = Ticket {
            store: inner.id,
            key: key.clone(),
            fence,
            fingerprint,
            claimed_at: now,
            lease_until: AtomicU64::new(lease_until),
            takeover,
        };
        Ok(Attempt::Queued(seq, ticket))
    }

    /// An `InProgress` answer. `lease_remaining` is zero when no live lease bounds the wait (a
    /// completion being made durable, or a stale claim kept for the reaper): the hint stands
    /// alone then.
    fn in_progress(&self, lease_remaining: Duration) -> Claim {
        Counters::bump(&self.inner.counters.in_progress, 1);
        let hint = self.inner.config.retry_after;
        let retry_after = if lease_remaining.is_zero() {
            hint
        } else {
            hint.min(lease_remaining)
        };
        Claim::InProgress {
            retry_after,
            lease_remaining,
        }
    }

    /// Reads a completed record's response. The index said `fence` is completed and durable;
    /// if the disk now holds another record (expired and re-claimed meanwhile) the claim looks
    /// again.
    fn replay(&self, key: &IndexKey, fence: u64) -> Result<Option<Claim>> {
        let response = self.stored_response(key, fence)?;
        if response.is_some() {
            Counters::bump(&self.inner.counters.replays, 1);
        }
        Ok(response.map(Claim::Replay))
    }

    /// The response of the completed record at `fence`, read from the file; `None` if the
    /// index moved on meanwhile (the key expired and was claimed again), so the caller looks
    /// again.
    ///
    /// # Errors
    /// [`Error::Corrupted`] if the index still holds that completed record but the file does
    /// not: the file changed under the store, and looking again would spin forever.
    fn stored_response(&self, key: &IndexKey, fence: u64) -> Result<Option<Response>> {
        if let Some(Record {
            state: RecordState::Completed { response, .. },
            ..
        }) = disk::read(self.inner.pipeline.db(), fence, &key.bytes)?
        {
            return Ok(Some(response.into()));
        }
        let unchanged = self.inner.index.lock(key).get(key).is_some_and(|slot| {
            slot.fence == fence && matches!(slot.state, SlotState::Completed { durable: true, .. })
        });
        if unchanged {
            return Err(Error::Corrupted {
                key: crate::scope::display_scoped_key(&key.bytes),
                reason: format!("completed record at fence {fence} is missing from the file"),
            });
        }
        Ok(None)
    }

    /// Stores `response` for the ticket's key and ends the claim: every later claim with the
    /// same fingerprint replays it until the TTL runs out. Durable before this returns (redb
    /// commit: `fdatasync(2)`).
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
        ticket: Ticket,
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
            let mut stripe = inner.index.lock(&ticket.key);
            let slot = self.held(&mut stripe, &ticket)?;
            let seq = inner.pipeline.enqueue(Op::Put {
                fence: ticket.fence,
                key: ticket.key.bytes.clone(),
                value,
                expiry: Some(expires_at),
                replaces: None,
            })?;
            slot.state = SlotState::Completed {
                expires_at,
                durable: false,
            };
            seq
        };
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
    pub fn release(&self, ticket: Ticket) -> Result<()> {
        let seq = self.release_start(&ticket)?;
        self.inner.pipeline.wait(seq)?;
        Counters::bump(&self.inner.counters.releases, 1);
        Ok(())
    }

    pub(crate) fn release_start(&self, ticket: &Ticket) -> Result<Seq> {
        let inner = &*self.inner;
        inner.pipeline.check()?;
        let mut stripe = inner.index.lock(&ticket.key);
        let gone = Gone::of(self.held(&mut stripe, ticket)?);
        let seq = inner.pipeline.enqueue(Op::Delete(gone))?;
        stripe.remove(&ticket.key);
        Ok(seq)
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
            let mut stripe = inner.index.lock(&ticket.key);
            let slot = self.held(&mut stripe, ticket)?;
            let seq = inner.pipeline.enqueue(Op::Put {
                fence: ticket.fence,
                key: ticket.key.bytes.clone(),
                value: record.encode(&ticket.key.bytes),
                expiry: None,
                replaces: None,
            })?;
            slot.state = SlotState::InProgress {
                lease_until,
                orphan: false,
            };
            seq
        };
        Ok((seq, lease_until))
    }

    /// Lets claims replay a completion once its batch is fsynced.
    pub(crate) fn mark_durable(&self, key: &IndexKey, fence: u64) {
        if let Some(slot) = self.inner.index.lock(key).get_mut(key) {
            if let SlotState::Completed { expires_at, .. } = slot.state {
                if slot.fence == fence {
                    slot.state = SlotState::Completed {
                        expires_at,
                        durable: true,
                    };
                }
            }
        }
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
        if ticket.store != self.inner.id {
            return Err(lost);
        }
        match stripe.get_mut(&ticket.key) {
            Some(slot)
                if slot.fence == ticket.fence
                    && matches!(slot.state, SlotState::InProgress { .. }) =>
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
            let Some(slot) = inner.index.lock(&key).get(&key).cloned() else {
                return Ok(None);
            };
            let state = match slot.state {
                SlotState::Completed { expires_at, .. } if now >= expires_at => return Ok(None),
                SlotState::InProgress {
                    lease_until,
                    orphan,
                } => EntryState::InProgress {
                    lease_deadline: from_millis(lease_until),
                    orphan,
                },
                SlotState::Completed {
                    expires_at,
                    durable,
                } => {
                    if !durable {
                        EntryState::InProgress {
                            lease_deadline: from_millis(now),
                            orphan: false,
                        }
                    } else {
                        match self.stored_response(&key, slot.fence)? {
                            Some(response) => EntryState::Completed {
                                expires_at: from_millis(expires_at),
                                response,
                            },
                            None => continue,
                        }
                    }
                }
            };
            return Ok(Some(Entry {
                fence: slot.fence,
                fingerprint: slot.fingerprint,
                claimed_at: from_millis(slot.claimed_at),
                state,
            }));
        }
    }

    /// The counters since the store was opened.
    pub fn stats(&self) -> Stats {
        let inner = &*self.inner;
        let live = u64::try_from(inner.index.len()).unwrap_or(u64::MAX);
        inner.counters.snapshot(inner.pipeline.batches(), live)
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
