//! The settings a store runs with. [`crate::StoreBuilder`] documents each one and its default;
//! the defaults themselves are written once, here.

use crate::clock::{Clock, SystemClock};
use crate::sync::Arc;
use std::time::Duration;

/// What a claim does with a stale claim (an in-progress record whose lease ran out).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum StalePolicy {
    /// The next claim with the same fingerprint takes the key over: it gets
    /// [`crate::Claim::Acquired`] with a ticket whose [`crate::Ticket::takeover`] describes the
    /// abandoned attempt, so the handler reconciles downstream before repeating the side
    /// effect. The abandoned ticket's later `complete` fails with `LeaseLost`. The default.
    #[default]
    TakeOver,
    /// Stale claims stay in progress (claims answer `InProgress`) until
    /// [`crate::Store::reap`] resolves them. For side effects that must never run twice without
    /// a human or a reconciler deciding.
    Keep,
}

/// What the open checks of the store file's pages before it follows them.
///
/// The choice is between a restart in seconds and a proof against arbitrary damage to the
/// file at rest: verifying reads the whole file (a 10M-record store: 41 s with a cold page
/// cache, against under 5 s trusting; `docs/performance.md`). The default trusts, because a
/// service that is down is also a failure; run `idemdb verify` (which verifies every page)
/// after anything that may have damaged the file, or choose [`PageCheck::Verify`] for a store
/// on media you do not trust.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum PageCheck {
    /// Every page of the file's trees is read and its checksum verified when the store opens
    /// (redb's integrity check), and the open is refused with [`crate::Error::Corrupted`] if
    /// one fails: a damaged file is never followed, so it cannot crash or exhaust the process.
    /// The open then costs a read of the whole file, clean close or crash alike.
    Verify,
    /// redb's pages are trusted, as redb does by default: the open reads the record heads (48
    /// bytes a record) and the journal, and redb's allocator state as the last checkpoint
    /// recorded it. idemdb's own checks stay on: each head's CRC-32, the heads' order and count
    /// against the records', and each record's CRC-32, key and agreement with its head when a
    /// request reads it. Bytes damaged outside idemdb (a disk, a backup tool, a person) may
    /// make redb panic (contained as `Error::Corrupted`) or end the process: for some damage to
    /// a page pointer it allocates far more memory than the file holds or recurses without end,
    /// and some of its panics panic again as redb unwinds its own state (an abort). Those are
    /// not contained, but they do not recur: an open leaves a marker (`<store>-opening`) that
    /// only its success removes, and the open after one that never finished verifies every page
    /// first, so it refuses the damaged file with `Error::Corrupted` instead of dying again. A
    /// death in a read after the open is not marked, and can recur. The default.
    #[default]
    Trust,
}

/// redb's page cache: enough for the interior pages of a store with tens of millions of
/// records, which every lookup touches. Leaf pages are read once (at open) or rarely (a replay),
/// and the operating system's page cache keeps the hot ones anyway.
const DEFAULT_CACHE_BYTES: usize = 64 << 20;

/// Settings the store runs with.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) ttl: Duration,
    pub(crate) lease: Duration,
    pub(crate) retry_after: Duration,
    pub(crate) stale_policy: StalePolicy,
    pub(crate) max_response_bytes: usize,
    pub(crate) stripes: usize,
    pub(crate) cache_bytes: usize,
    /// `None`: the default for the medium (see `file/open.rs`).
    pub(crate) journal_bytes: Option<u64>,
    /// The reserve file's size; `None`: [`crate::file::space::RESERVE_PER_JOURNAL`] journals.
    pub(crate) reserve_bytes: Option<u64>,
    pub(crate) replay_cache_bytes: usize,
    pub(crate) page_check: PageCheck,
    pub(crate) clock: Arc<dyn Clock>,
    /// Whether [`crate::StoreBuilder::clock`] set `clock`. On PostgreSQL the database's clock
    /// is the time unless a clock was injected (for tests), whose time then replaces it for
    /// this store's statements (see `docs/postgres.md`).
    pub(crate) clock_injected: bool,
    /// A store file halted by a failed write or sync reopens itself this long after an
    /// operation first finds it halted (then at doubling intervals); `None`: it stays halted.
    pub(crate) heal_after: Option<Duration>,
    /// Whether [`crate::StoreBuilder::heal_after`] set `heal_after` (a store on the simulated
    /// disk heals only then).
    pub(crate) heal_set: bool,
    /// The most live records one tenant may hold; `None`: no limit (file engine only).
    pub(crate) max_live_per_tenant: Option<u64>,
    /// The most bytes of records a claim of a new key may find (file engine only).
    pub(crate) max_store_bytes: Option<u64>,
    /// Whether completed responses are written lz4-compressed (file engine only).
    pub(crate) compress_responses: bool,
    /// The `store` label of the store's metrics and field of its spans; `None`: none.
    pub(crate) name: Option<String>,
    /// The store's instruments: inert until the store opens ([`crate::observe::Observer::attach`]).
    pub(crate) observer: crate::observe::Observer,
    /// Journaled batches are applied to redb on a thread of the store's own, after their
    /// callers are answered; `false` (the simulated disk): by the leader, so that a seeded run
    /// does its I/O in one order.
    pub(crate) background_apply: bool,
    /// PostgreSQL: the schema holding the store's tables.
    #[cfg(feature = "postgres")]
    pub(crate) schema: String,
    /// PostgreSQL: this replica's stable name; `None` for a random one.
    #[cfg(feature = "postgres")]
    pub(crate) owner: Option<String>,
    /// PostgreSQL: the most connections the store opens.
    #[cfg(feature = "postgres")]
    pub(crate) pool_size: usize,
    /// PostgreSQL: the most operations of one kind in one statement.
    #[cfg(feature = "postgres")]
    pub(crate) batch_limit: usize,
    /// PostgreSQL: TLS settings from the builder, over the connection string's.
    #[cfg(feature = "postgres")]
    pub(crate) tls: crate::postgres::tls::Settings,
    /// PostgreSQL: the builder's pool mode, over the connection string's.
    #[cfg(feature = "postgres")]
    pub(crate) pool_mode: Option<crate::PoolMode>,
}

impl Config {
    /// How a store file writes the responses of its completed records.
    pub(crate) fn packing(&self) -> crate::file::record::Packing {
        if self.compress_responses {
            crate::file::record::Packing::Lz4
        } else {
            crate::file::record::Packing::Plain
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            ttl: Duration::from_secs(24 * 3600),
            lease: Duration::from_secs(60),
            retry_after: Duration::from_secs(1),
            stale_policy: StalePolicy::TakeOver,
            max_response_bytes: 1 << 20,
            stripes: 64,
            cache_bytes: DEFAULT_CACHE_BYTES,
            journal_bytes: None,
            reserve_bytes: None,
            replay_cache_bytes: 8 << 20,
            page_check: PageCheck::Trust,
            clock: Arc::new(SystemClock),
            clock_injected: false,
            heal_after: Some(Duration::from_millis(100)),
            heal_set: false,
            max_live_per_tenant: None,
            max_store_bytes: None,
            compress_responses: false,
            name: None,
            observer: crate::observe::Observer::default(),
            background_apply: true,
            #[cfg(feature = "postgres")]
            schema: String::from("idemdb"),
            #[cfg(feature = "postgres")]
            owner: None,
            // Enough to keep a few batches in flight while others commit.
            #[cfg(feature = "postgres")]
            pool_size: 4,
            #[cfg(feature = "postgres")]
            batch_limit: 512,
            #[cfg(feature = "postgres")]
            tls: crate::postgres::tls::Settings::default(),
            #[cfg(feature = "postgres")]
            pool_mode: None,
        }
    }
}
