//! Opening a store: one builder, every default in its doc, and the `Store` constructors that
//! use the defaults.

use crate::clock::Clock;
use crate::config::{Config, PageCheck, StalePolicy};
use crate::error::Result;
use crate::model::response::MAX_RESPONSE_LIMIT;
use crate::observe::Observer;
use crate::store::Store;
use crate::sync::Arc;
use std::path::Path;
use std::time::Duration;

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

    /// Connects to the PostgreSQL database at `url` with the default settings. See
    /// [`StoreBuilder::connect`].
    ///
    /// # Errors
    /// As [`StoreBuilder::connect`].
    #[cfg(feature = "postgres")]
    pub fn connect(url: &str) -> Result<Store> {
        StoreBuilder::default().connect(url)
    }

    /// A store in memory with the default settings, for users' own tests.
    ///
    /// # Errors
    /// As [`StoreBuilder::in_memory`].
    pub fn in_memory() -> Result<Store> {
        StoreBuilder::default().in_memory()
    }
}

/// Configures and opens a [`Store`].
///
/// ```
/// use std::time::Duration;
/// let dir = tempfile::tempdir()?;
/// let store = idemdb::Store::builder()
///     .ttl(Duration::from_secs(48 * 3600))
///     .lease(Duration::from_secs(90))
///     .stale_policy(idemdb::StalePolicy::Keep)
///     .open(dir.path().join("payments.idem"))?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct StoreBuilder {
    config: Config,
}

impl StoreBuilder {
    /// How long a completed record is replayed, counted from its completion. Default: 24 hours.
    /// Clients' retry windows must fit inside it: a retry after the TTL executes again.
    ///
    /// # Panics
    /// If `ttl` is zero.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        assert!(!ttl.is_zero(), "ttl must be positive");
        self.config.ttl = ttl;
        self
    }

    /// How long a claim is held before it is stale, unless [`Store::extend`] renews it.
    /// Default: 60 seconds, well above the p99.9 of a payment-provider call with its own
    /// timeouts and retries, yet short enough that a crashed attempt's key frees within a
    /// minute.
    ///
    /// # Panics
    /// If `lease` is zero.
    pub fn lease(mut self, lease: Duration) -> Self {
        assert!(!lease.is_zero(), "lease must be positive");
        self.config.lease = lease;
        self
    }

    /// The hint [`crate::Claim::InProgress`] carries (capped by the holder's remaining lease).
    /// Default: 1 second.
    pub fn retry_after(mut self, hint: Duration) -> Self {
        self.config.retry_after = hint;
        self
    }

    /// What claims do with stale claims. Default: [`StalePolicy::TakeOver`].
    pub fn stale_policy(mut self, policy: StalePolicy) -> Self {
        self.config.stale_policy = policy;
        self
    }

    /// The largest response (status, headers and body, as encoded) `complete` accepts.
    /// Default: 1 MiB.
    ///
    /// # Panics
    /// If `limit` exceeds 64 MiB ([`crate::MAX_RESPONSE_LIMIT`]), which bounds what a damaged
    /// file can make the decoder allocate.
    pub fn max_response_bytes(mut self, limit: usize) -> Self {
        assert!(
            limit <= MAX_RESPONSE_LIMIT,
            "max_response_bytes is at most {MAX_RESPONSE_LIMIT}"
        );
        self.config.max_response_bytes = limit;
        self
    }

    /// Whether a store file writes completed responses compressed (lz4, block format), for
    /// those whose encoding is at least 64 bytes and shrinks by at least 16. Default: off.
    ///
    /// Compression costs CPU on the completing thread and at each replay read from the file
    /// (the replay cache holds responses decompressed), and saves file bytes, journal bytes and
    /// the disk's writes in proportion to how well the responses compress: JSON objects of 1-4 KB
    /// (`docs/performance.md`, "Compressed responses") shrink to about half. Each record says
    /// whether its response is compressed (`docs/format.md`), so every build reads a store
    /// whichever way it was written, and turning this on or off needs no change to the file.
    /// A file store only: PostgreSQL compresses large values itself (TOAST).
    ///
    /// ```
    /// use idemdb::{Claim, Fingerprint, Response, Scope, Store};
    /// let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("s.idem");
    /// let store = Store::builder().compress_responses(true).open(&path)?;
    /// let scope = Scope::new("t", "POST /charges");
    /// let body = r#"{"object":"charge","status":"succeeded"}"#.repeat(20);
    /// let Claim::Acquired(t) = store.claim(&scope, "k", Fingerprint::of(b"x"))? else { panic!() };
    /// store.complete(t, Response::new(200, body.clone()))?;
    /// drop(store);
    /// // Read back by a store that does not compress: the same bytes.
    /// let store = Store::open(&path)?;
    /// let Claim::Replay(r) = store.claim(&scope, "k", Fingerprint::of(b"x"))? else { panic!() };
    /// assert_eq!(r.body(), body.as_bytes());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn compress_responses(mut self, on: bool) -> Self {
        self.config.compress_responses = on;
        self
    }

    /// The number of index lock stripes. Default: 64.
    ///
    /// # Panics
    /// If `stripes` is not a power of two, or above 65536.
    pub fn stripes(mut self, stripes: usize) -> Self {
        assert!(
            stripes.is_power_of_two() && stripes <= 1 << 16,
            "stripes must be a power of two up to 65536"
        );
        self.config.stripes = stripes;
        self
    }

    /// The memory redb may use to cache file pages. Default: 64 MiB (redb's own default is
    /// 1 GiB, which the open's read of every head would fill). The index, about 70 bytes per
    /// live key, is separate; `docs/performance.md` has the measured figures.
    pub fn cache_size(mut self, bytes: usize) -> Self {
        self.config.cache_bytes = bytes;
        self
    }

    /// The size of the journal file (`<path>-journal`) that makes each batch durable with one
    /// sequential write and one `fdatasync`, before redb applies it. Default: 16 MiB. When it
    /// fills, the next batch is committed durably into the redb file (a checkpoint) and the
    /// journal starts over. `0` turns it off: every batch is then a durable redb commit, which
    /// writes more pages per batch (see `docs/performance-history.md`). Sizes between 1 and 4 KiB are
    /// taken as 4 KiB (the journal's header and a few entries). The file never shrinks: a
    /// smaller size only bounds where new entries go.
    ///
    /// A store whose file says its journal holds writes refuses to open without it.
    pub fn journal_size(mut self, bytes: u64) -> Self {
        self.config.journal_bytes = Some(bytes);
        self
    }

    /// The disk space a store file keeps for its recovery (a file store only): a file
    /// `<path>-reserve` of this many allocated bytes, which an open that finds the filesystem
    /// short of it deletes, so that replaying the journal and checkpointing it always fit. Claims
    /// that would write a record are refused with [`crate::Error::DiskFull`] (HTTP: 503 with
    /// `Retry-After`) while the reserve is missing or less than this much is free beside it,
    /// before the disk fills and the store halts; they succeed again, without a restart, once
    /// twice this much is free (the reserve is then made anew). Everything else goes on:
    /// replays, completions, releases, purges.
    ///
    /// Default: three times the journal's size (48 MiB with the default journal), at least
    /// 4 MiB; one epoch of the journal has needed at most 2.04 times its size in new blocks
    /// (`docs/design.md`, "A full disk"). `0` turns the reserve and the refusals off: a full
    /// disk then halts the store, and its recovery needs whatever space frees up.
    pub fn reserve_size(mut self, bytes: u64) -> Self {
        self.config.reserve_bytes = Some(bytes);
        self
    }

    /// Memory for recently replayed responses, so repeated retries of one key read its record
    /// from the file (or the database) once. Default: 8 MiB; 0 turns it off. Responses larger
    /// than a 64th of it are never cached. On PostgreSQL a cached response is replayed without
    /// a statement only while its record's expiry is more than a second ahead of the
    /// database's time as this store last saw it: a completion is final until it expires.
    pub fn replay_cache_size(mut self, bytes: usize) -> Self {
        self.config.replay_cache_bytes = bytes;
        self
    }

    /// What the open checks of the store file's pages. Default: [`PageCheck::Trust`]: redb's
    /// pages are trusted and idemdb's own checksums checked, so a 10M-record store serves again
    /// within seconds of a crash; [`PageCheck::Verify`] reads and checks every page first, so a
    /// damaged file is refused rather than followed. [`PageCheck`] weighs the two.
    pub fn page_check(mut self, check: PageCheck) -> Self {
        self.config.page_check = check;
        self
    }

    /// The most live records one tenant may hold: a claim that would create one more gets
    /// [`crate::Error::TenantFull`] (the HTTP layer: 429 with `Retry-After`), nothing is
    /// stored, and other tenants are unaffected. A record counts from the claim that creates
    /// it until it is released, reaped or purged (an expired completion counts until
    /// `purge_expired`); claims that replace a record of the same key (an expired one, a
    /// takeover), replays and duplicates are never refused. Default: no limit.
    ///
    /// On PostgreSQL the claim statement enforces it, exactly, whatever the replicas: a
    /// tenant's claims of new keys are admitted one transaction at a time under a lock of the
    /// tenant's, against counts the schema keeps (a store with a bound makes its schema count
    /// its records, with triggers, from then on: they cost every write of every replica; see
    /// `docs/postgres.md`, "Bounds"). Every replica should set the same limit: one without it
    /// does not wait for the lock.
    pub fn max_live_records_per_tenant(mut self, limit: u64) -> Self {
        self.config.max_live_per_tenant = Some(limit);
        self
    }

    /// The most bytes of records the store file may hold before it refuses claims of new
    /// keys with [`crate::Error::StoreFull`] (HTTP: 503 with `Retry-After`), so that a disk
    /// filling up is a refusal of new requests rather than a failed write that halts the
    /// store. Counted: each record's encoded key, fingerprint, times and response, as of the
    /// last answered write ([`crate::Stats::stored_bytes`]). Claims of keys that hold a record,
    /// completions, releases, extensions, reaps and purges are never refused: a completion's
    /// side effect has happened. So the records may pass the limit by the responses of the
    /// claims in progress when it was reached (each at most `max_response_bytes`), and the
    /// files take more than the records (redb's pages and free space, the journal's fixed
    /// size): leave that room on the disk. Default: no limit.
    ///
    /// On PostgreSQL the claim statement checks the counts the schema keeps (as for
    /// [`StoreBuilder::max_live_records_per_tenant`]); a record counts its key's columns,
    /// fingerprint, headers and body and 48 bytes, not the table's pages. Claims admitted at
    /// once by several replicas may pass it by what they claim together.
    pub fn max_store_bytes(mut self, limit: u64) -> Self {
        self.config.max_store_bytes = Some(limit);
        self
    }

    /// How a store file comes back after a failed write or sync halted it (every operation
    /// then answers [`crate::Error::Halted`], HTTP 503): it reopens itself in place, from what
    /// the disk holds, first `delay` after an operation finds it halted, then at doubling
    /// intervals up to 10 s while the disk still fails. `None` keeps it halted until the
    /// process opens it again. Default: 100 ms.
    ///
    /// A heal is what a restart would do, without one: the halted store closes its files,
    /// their page cache is dropped (`posix_fadvise(POSIX_FADV_DONTNEED)` on Linux, so that
    /// pages a failed `fdatasync` left behind are read from the disk again), and the store
    /// opens them as at startup (replaying the journal, rebuilding the index). Every
    /// acknowledged operation is there after it; an operation whose call failed may or may
    /// not be, as after a crash; tickets issued before it are fenced off (`LeaseLost`; their
    /// claims are orphans: taken over once their lease runs out, or reaped). See `docs/design.md`.
    ///
    /// Not used by stores in memory (they cannot fail that way) or on PostgreSQL (whose
    /// connections are reopened anyway).
    pub fn heal_after(mut self, delay: Option<Duration>) -> Self {
        self.config.heal_after = delay;
        self.config.heal_set = true;
        self
    }

    /// The clock leases and TTLs read. Default: [`crate::SystemClock`]. Tests pass a
    /// [`crate::ManualClock`].
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.config.clock = Arc::new(clock);
        self.config.clock_injected = true;
        self
    }

    /// A name for this store in what it reports: a `store="<name>"` label on each of its
    /// metrics (feature `metrics`) and a `store` field on each of its spans and events
    /// (feature `tracing`), so that several stores in one process are told apart. Default:
    /// none, and no such label, which suits one store per process. Stores that share a name
    /// (or have none) share their series: their counters add up, and each of their gauges
    /// shows whichever store set it last. `docs/operations.md` lists what is reported.
    ///
    /// ```
    /// let orders = idemdb::Store::builder().name("orders").in_memory()?;
    /// let refunds = idemdb::Store::builder().name("refunds").in_memory()?;
    /// # Ok::<(), idemdb::Error>(())
    /// ```
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.config.name = Some(name.into());
        self
    }

    /// The configuration a store opens with: its instruments registered now, with the
    /// metrics recorder installed at this moment. `file`: the store file, for the file gauges.
    fn attached(mut self, file: Option<&Path>) -> Config {
        self.config.observer = Observer::attach(self.config.name.as_deref(), file);
        self.config
    }

    /// PostgreSQL: the schema that holds the store's tables, so that several independent
    /// stores share one database. Default: `idemdb`. Created on connect if missing.
    /// File stores ignore it.
    ///
    /// The name must follow [`validate_schema`]'s rule; [`StoreBuilder::connect`] refuses
    /// one that does not ([`crate::Error::InvalidSchema`]) before it connects.
    #[cfg(feature = "postgres")]
    pub fn schema(mut self, name: impl Into<String>) -> Self {
        self.config.schema = name.into();
        self
    }

    /// PostgreSQL: a stable name for this replica (its host name, or a pod name of a
    /// stateful set). A replica that restarts under the same name sees the claims its earlier
    /// run left as orphans at once: [`Store::reap`] offers them straight away. Other replicas
    /// see them in progress until their leases end. Default: a random name per connect, so
    /// a restarted replica's leftovers wait for their leases. File stores ignore it.
    ///
    /// Two stores running at once must not share a name: the later one would take the
    /// earlier one's live claims for orphans.
    #[cfg(feature = "postgres")]
    pub fn owner(mut self, name: impl Into<String>) -> Self {
        self.config.owner = Some(name.into());
        self
    }

    /// PostgreSQL: the most connections the store opens. Default: 4. Each runs one batch of
    /// operations at a time; while all are busy, waiting operations gather into the next
    /// batches. File stores ignore it.
    ///
    /// # Panics
    /// If `connections` is zero.
    #[cfg(feature = "postgres")]
    pub fn pool_size(mut self, connections: usize) -> Self {
        assert!(connections > 0, "pool_size must be positive");
        self.config.pool_size = connections;
        self
    }

    /// PostgreSQL: the most operations taken into one batch (so at most that many of one kind
    /// share a statement). Default: 512.
    /// `1` sends one statement per operation, which only the benchmarks want (they measure
    /// what grouping saves).
    ///
    /// # Panics
    /// If `limit` is zero.
    #[cfg(feature = "postgres")]
    #[doc(hidden)]
    pub fn batch_limit(mut self, limit: usize) -> Self {
        assert!(limit > 0, "batch_limit must be positive");
        self.config.batch_limit = limit;
        self
    }

    /// PostgreSQL: how the connections use TLS (libpq's `sslmode`), over what the connection
    /// string says. Default: [`crate::SslMode::Prefer`], as libpq, which protects against a
    /// passive listener only when the server offers TLS; [`crate::SslMode::VerifyFull`] (with
    /// [`StoreBuilder::ssl_root_cert`]) is what stops a party in between. See
    /// `docs/postgres.md`, "TLS".
    #[cfg(feature = "postgres")]
    pub fn ssl_mode(mut self, mode: crate::SslMode) -> Self {
        self.config.tls.mode = Some(mode);
        self
    }

    /// PostgreSQL: the PEM file of root certificates the server's certificate must be signed
    /// by (libpq's `sslrootcert`), or `"system"` for the platform's roots (which requires
    /// [`crate::SslMode::VerifyFull`], and is then the default mode). Read when the store
    /// connects.
    #[cfg(feature = "postgres")]
    pub fn ssl_root_cert(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.config.tls.root_cert = Some(path.into());
        self
    }

    /// PostgreSQL: a client certificate (PEM, with its chain) and its private key (PEM), for
    /// a server that authenticates clients by certificate (libpq's `sslcert` and `sslkey`).
    #[cfg(feature = "postgres")]
    pub fn ssl_client_cert(
        mut self,
        cert: impl Into<std::path::PathBuf>,
        key: impl Into<std::path::PathBuf>,
    ) -> Self {
        self.config.tls.client_cert = Some((cert.into(), key.into()));
        self
    }

    /// PostgreSQL: whether the connections are the store's own server sessions
    /// ([`crate::PoolMode::Session`], the default) or go through a pooler in transaction mode
    /// such as PgBouncer's `pool_mode = transaction` ([`crate::PoolMode::Transaction`]: no
    /// prepared statements, no session settings), over the connection string's `pool_mode=`.
    /// See `docs/postgres.md`, "Through PgBouncer".
    #[cfg(feature = "postgres")]
    pub fn pool_mode(mut self, mode: crate::PoolMode) -> Self {
        self.config.pool_mode = Some(mode);
        self
    }

    /// Connects to the PostgreSQL database at `url`, creating or checking the store's schema.
    /// `url` is a connection string in either of libpq's forms, a `postgres://` URL or
    /// `key=value` pairs, several hosts with `target_session_attrs=read-write` included, as
    /// `tokio-postgres` reads it: `PG*` environment variables and `.pgpass` are not consulted.
    /// Unless `url` says otherwise, connecting times out after 10 s, a connection whose data
    /// goes unacknowledged for 30 s is given up (`tcp_user_timeout`), and idle connections are
    /// probed after 15 s.
    /// The store's sessions commit with `synchronous_commit = on` (or the server's
    /// `remote_apply`). The options that only mean something for a file (`cache_size`,
    /// `journal_size`, `page_check`, `stripes`) are ignored. TLS follows libpq's `sslmode`,
    /// `sslrootcert`, `sslcert` and `sslkey` in `url` (or [`StoreBuilder::ssl_mode`] and the
    /// methods beside it), with rustls. See `docs/postgres.md`.
    ///
    /// # Errors
    /// [`crate::Error::InvalidSchema`] for a [`StoreBuilder::schema`] name that breaks
    /// [`validate_schema`]'s rule (before anything is connected to);
    /// [`crate::Error::Database`] for a bad connection string, an unreachable server, a
    /// refused login or missing permissions, or a server running with `fsync = off`;
    /// [`crate::Error::Tls`] for a certificate file that cannot be read, or a server certificate
    /// that does not verify (what did not match is said);
    /// [`crate::Error::UnsupportedFormat`] for a schema a newer idemdb made.
    #[cfg(feature = "postgres")]
    pub fn connect(self, url: &str) -> Result<Store> {
        validate_schema(&self.config.schema)?;
        let config = self.attached(None);
        let pg = crate::postgres::connect(config.clone(), url)?;
        Ok(Store::new(crate::engine::Engine::Postgres(pg), &config))
    }

    /// Opens the store at `path`, creating it (and fsyncing its directory) if it does not exist,
    /// and rebuilds the index from it.
    ///
    /// # Errors
    /// [`crate::Error::AlreadyOpen`] if another `Store` has the file open;
    /// [`crate::Error::Corrupted`] if what the open reads is damaged: the `meta` table, the
    /// journal, a record head (its CRC-32), or the heads' order and count against the
    /// records'; with [`PageCheck::Verify`], any page of the file. The default open reads no
    /// whole record: a damaged record is refused (`Corrupted`) when a request reads it, and
    /// `idemdb verify` reads every one;
    /// [`crate::Error::UnsupportedFormat`] for a file of another format version;
    /// [`crate::Error::Io`] for the operating system's errors.
    pub fn open(self, path: impl AsRef<Path>) -> Result<Store> {
        let path = path.as_ref();
        let config = self.attached(Some(path));
        let store = crate::file::open::file(config.clone(), path)?;
        Ok(serve(
            store,
            crate::file::heal::Source::File(path.to_owned()),
            config,
        ))
    }

    /// Creates a store file at `path`, which must not exist, holding the records
    /// [`Store::export`] wrote to `input`, and opens it; returns the store and how many records
    /// it holds. Fences are kept and the store's next fences are larger; claims in progress
    /// arrive as orphans (their holders were another store's), which [`Store::reap`] offers
    /// at once.
    ///
    /// All or nothing: the file is made under a temporary name, every record written in one
    /// durable commit (`fdatasync(2)`), then linked into place and its directory fsynced, so a
    /// failure or a crash leaves no store at `path`. The input is read a line at a time:
    /// memory holds redb's dirty pages and 16 bytes per key, not the whole export.
    ///
    /// ```
    /// use idemdb::{Claim, Fingerprint, Response, Scope, Store};
    /// let dir = tempfile::tempdir()?;
    /// let old = Store::open(dir.path().join("old.idem"))?;
    /// let scope = Scope::new("t", "POST /x");
    /// let Claim::Acquired(t) = old.claim(&scope, "k1", Fingerprint::of(b"x"))? else { panic!() };
    /// old.complete(t, Response::new(201, "done"))?;
    /// let mut lines = Vec::new();
    /// old.export(&mut lines)?;
    /// let (new, n) = Store::builder().import_new(dir.path().join("new.idem"), lines.as_slice())?;
    /// assert_eq!(n, 1);
    /// assert!(matches!(new.claim(&scope, "k1", Fingerprint::of(b"x"))?, Claim::Replay(_)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`crate::Error::InvalidImport`] for a line that is not an exported record (naming the
    /// line), a key or fence twice, or a `path` that exists; [`crate::Error::Io`] if `input`
    /// or the disk fails; then nothing is created. The errors of [`StoreBuilder::open`].
    #[cfg(feature = "export")]
    pub fn import_new(
        self,
        path: impl AsRef<Path>,
        input: impl std::io::BufRead,
    ) -> Result<(Store, u64)> {
        let path = path.as_ref();
        let config = self.attached(Some(path));
        let (store, imported) = crate::file::import::new_file(config.clone(), path, input)?;
        let store = serve(
            store,
            crate::file::heal::Source::File(path.to_owned()),
            config,
        );
        Ok((store, imported))
    }

    /// A store held in memory only, for tests: same semantics, nothing survives the process.
    ///
    /// # Errors
    /// Only if the storage engine fails to initialise, which it does not in memory.
    pub fn in_memory(self) -> Result<Store> {
        let config = self.attached(None);
        crate::file::open::in_memory(config.clone())
            .map(|store| serve(store, crate::file::heal::Source::Memory, config))
    }

    /// Opens the store on a simulated disk. For idemdb's own crash tests and fuzzing only:
    /// not part of the stable API.
    ///
    /// # Errors
    /// As [`StoreBuilder::open`].
    #[cfg(any(test, fuzzing, feature = "simulation"))]
    #[doc(hidden)]
    pub fn open_simulated(mut self, disk: &crate::simulation::SimDisk) -> Result<Store> {
        if !self.config.heal_set {
            // The crash tests count on a halted store staying halted.
            self.config.heal_after = None;
        }
        let config = self.attached(None);
        let store = crate::file::open::simulated(config.clone(), disk)?;
        Ok(serve(
            store,
            crate::file::heal::Source::Simulated(disk.clone()),
            config,
        ))
    }
}

/// Checks a PostgreSQL schema name ([`StoreBuilder::schema`]): 1 to 63 bytes of lower-case
/// ASCII letters (`a`-`z`), digits and `_`, not starting with a digit, and not starting with
/// `pg_`, which PostgreSQL reserves for its own schemas. Such a name needs no quoting wherever
/// an operator types it (`psql`, `pg_dump -n`, the `idemdb` command's `--schema`). For
/// programs that take the name from their operator, to refuse it before connecting.
///
/// ```
/// use idemdb::{validate_schema, Error};
/// assert!(validate_schema("payments_v2").is_ok());
/// let refused = validate_schema("Payments-v2").unwrap_err();
/// assert!(matches!(refused, Error::InvalidSchema { .. }));
/// // Says what is wrong and what a good name looks like.
/// assert!(refused.to_string().contains("lower-case ASCII letters, digits and _"));
/// assert!(validate_schema("pg_payments").is_err()); // reserved by PostgreSQL
/// ```
///
/// # Errors
/// [`crate::Error::InvalidSchema`] with the name and the first thing wrong with it.
#[cfg(feature = "postgres")]
pub fn validate_schema(name: &str) -> Result<()> {
    // The rule lives beside the SQL that quotes the name.
    crate::postgres::check_schema_name(name)
}

/// The public store over a file store just opened, healing as configured.
fn serve(
    store: crate::file::FileStore,
    source: crate::file::heal::Source,
    config: crate::config::Config,
) -> Store {
    let engine = crate::engine::Engine::File(crate::file::heal::Healing::new(
        store,
        source,
        config.clone(),
    ));
    Store::new(engine, &config)
}
