//! Opening a store: creating its file atomically, recovering the journal into it, and
//! rebuilding the index from it. `docs/design.md` ("Crash recovery argument") says why this
//! order makes every acknowledged operation reappear.

use crate::config::{Config, PageCheck};
use crate::error::{Damaged, Error, Result};
use crate::file::batch;
use crate::file::hashing::{Hashing, SipKey};
use crate::file::index::Index;
use crate::file::journal::{self, Journal};
use crate::file::layout;
use crate::file::load;
use crate::file::marker::OpenMarker;
use crate::file::platform;
use crate::file::space::{Space, RESERVE_PER_JOURNAL};
use crate::file::store::FileStore;
use crate::file::upgrade;
use crate::sync::Arc;
use std::path::Path;

/// redb's page cache while a store opens: the scan reads every page once, and filling a large
/// cache only costs time (measured: 10.2 s with 64 MiB, 8.1 s with 4 MiB, for 10 million
/// records). The file is then reopened with the configured cache.
const SCAN_CACHE_BYTES: usize = 4 << 20;

/// The journal's default size: 16 MiB, a few tens of thousands of batches between checkpoints.
const DEFAULT_JOURNAL_BYTES: u64 = 16 << 20;
/// On the simulated disk, a small journal, so crash tests cross many checkpoints.
#[cfg(any(test, fuzzing, feature = "simulation"))]
const SIMULATED_JOURNAL_BYTES: u64 = 64 << 10;

/// Opens (or creates) the store file at `path` and its journal beside it.
pub(crate) fn file(config: Config, path: &Path) -> Result<FileStore> {
    file_keeping(config, path, None)
}

/// [`file`], with the reserve a halted store of this file still holds (a heal): its lock
/// stays taken.
pub(crate) fn file_keeping(
    config: Config,
    path: &Path,
    space: Option<Arc<Space>>,
) -> Result<FileStore> {
    if !path.try_exists()? {
        // Another process may create it meanwhile: then that one is opened.
        create_atomically(path, |_| Ok(()))?;
    }
    // redb would make an empty file into a new database: a store truncated to nothing must not
    // quietly become a new, empty one.
    let file_bytes = std::fs::metadata(path)?.len();
    if file_bytes == 0 {
        return Err(Error::Corrupted {
            damaged: Damaged::File,
            reason: "the store file is empty; if it never held a store, delete it to create one"
                .into(),
        });
    }
    let journal = journal::file::journal_path(path);
    let capacity = config.journal_bytes.unwrap_or(DEFAULT_JOURNAL_BYTES);
    let space = match space {
        Some(space) => Some(space),
        None => Space::lock(path, reserve_bytes(&config, capacity, &journal))?.map(Arc::new),
    };
    if let Some(space) = &space {
        if space.before_recovery()? {
            config.observer.reserve_released(space.reserve_bytes());
        }
    }
    let marker = OpenMarker::begin(path);
    let check = verify(&config) || marker.unfinished;
    if marker.unfinished {
        config.observer.unfinished_open_found();
    }
    let opened = contain_panics(|| {
        let open = |cache, check| -> Result<redb::Database> {
            Ok(redb::Builder::new()
                .set_cache_size(cache)
                .set_check_integrity_on_open(check)
                .create(path)?)
        };
        let db = Guarded::new(open(SCAN_CACHE_BYTES, check)?);
        // Only now, with redb's lock on the store file held, is the journal touched.
        let source = JournalSource {
            existed: journal.try_exists()?,
            capacity,
            open: Box::new(move || journal::file::open(&journal)),
        };
        start(config, db, file_bytes, Some(&open), Some(source), space)
    });
    match &opened {
        Ok(_) => marker.finished(),
        Err(Error::AlreadyOpen) => marker.abandoned(),
        // A damaged file, a failing disk: the next open verifies the pages too.
        Err(_) => {}
    }
    opened
}

/// A store held in memory: no journal, every batch a (memory-)durable redb commit.
pub(crate) fn in_memory(config: Config) -> Result<FileStore> {
    contain_panics(|| {
        let db = Guarded::new(
            redb::Builder::new()
                .set_cache_size(config.cache_bytes)
                .create_with_backend(redb::backends::InMemoryBackend::new())?,
        );
        layout::create(&db)?;
        start(config, db, 0, None, None, None)
    })
}

/// A store on the simulated disk of the crash tests.
#[cfg(any(test, fuzzing, feature = "simulation"))]
pub(crate) fn simulated(
    mut config: Config,
    disk: &crate::simulation::SimDisk,
) -> Result<FileStore> {
    config.background_apply = false;
    contain_panics(|| {
        let open = |cache, check| -> Result<redb::Database> {
            Ok(redb::Builder::new()
                .set_cache_size(cache)
                .set_check_integrity_on_open(check)
                .create_with_backend(disk.backend())?)
        };
        let file_bytes = disk.image_len();
        let db = Guarded::new(open(SCAN_CACHE_BYTES, verify(&config) && file_bytes > 0)?);
        if file_bytes == 0 {
            layout::create(&db)?;
        }
        let journal = disk.journal_backend();
        let source = JournalSource {
            existed: disk.journal_len() > 0,
            capacity: config.journal_bytes.unwrap_or(SIMULATED_JOURNAL_BYTES),
            open: Box::new(move || Ok(Box::new(journal) as Box<dyn redb::StorageBackend>)),
        };
        start(config, db, file_bytes, Some(&open), Some(source), None)
    })
}

/// A database being opened. Dropped as usual, except while a panic unwinds (redb panics on
/// some damaged pages): then it is leaked, because redb's `Drop` unwraps locks that panic
/// poisoned, and a second panic during the unwinding would abort the process.
struct Guarded(Option<redb::Database>);

impl Guarded {
    fn new(db: redb::Database) -> Guarded {
        Guarded(Some(db))
    }

    fn into_inner(mut self) -> redb::Database {
        self.0.take().expect("held until taken")
    }
}

impl std::ops::Deref for Guarded {
    type Target = redb::Database;

    fn deref(&self) -> &redb::Database {
        self.0.as_ref().expect("held until taken")
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        if let Some(db) = self.0.take() {
            if std::thread::panicking() {
                std::mem::forget(db);
            }
        }
    }
}

/// The reserve's size: as configured, or [`RESERVE_PER_JOURNAL`] times the journal's capacity
/// (or its file's length, if larger: the epoch being replayed may fill it), at least
/// [`MIN_RESERVE_BYTES`].
fn reserve_bytes(config: &Config, capacity: u64, journal: &Path) -> u64 {
    config.reserve_bytes.unwrap_or_else(|| {
        let made = std::fs::metadata(journal).map_or(0, |m| m.len());
        RESERVE_PER_JOURNAL
            .saturating_mul(capacity.max(made))
            .max(MIN_RESERVE_BYTES)
    })
}

/// The smallest default reserve: room for redb's own recovery commit and one batch when the
/// journal is small or off.
const MIN_RESERVE_BYTES: u64 = 1 << 20;

/// Whether redb verifies every page's checksum as it opens the file.
fn verify(config: &Config) -> bool {
    config.page_check == PageCheck::Verify
}

/// How to reach the journal of a store being opened.
struct JournalSource {
    /// Whether the file was there before this open.
    existed: bool,
    /// 0 turns the journal off.
    capacity: u64,
    open: Box<dyn FnOnce() -> Result<Box<dyn redb::StorageBackend>>>,
}

/// Recovers the journal into `db`, builds the index from it, and starts the store. With
/// `reopen`, the file is then reopened with the configured page cache (see
/// [`SCAN_CACHE_BYTES`]).
fn start(
    config: Config,
    db: Guarded,
    file_bytes: u64,
    reopen: Option<&dyn Fn(usize, bool) -> Result<redb::Database>>,
    journal: Option<JournalSource>,
    space: Option<Arc<Space>>,
) -> Result<FileStore> {
    let meta = layout::meta(&db)?;
    if meta.format == layout::EXPIRY_FORMAT {
        upgrade::drop_expiry_table(&db)?;
    }
    // Before the journal's replay changes anything: the file as its last commit left it.
    layout::check_record_count(&db, &meta)?;
    let secret = match meta.secret {
        Some(secret) => secret,
        None => {
            // Format 2 had no heads: they are written from the records, once, before the
            // journal's replay adds the heads of what it holds.
            let secret = SipKey::random();
            upgrade::rebuild_heads(&db, secret)?;
            secret
        }
    };
    let mut file = batch::FileState {
        reserved: meta.fence_reserved,
        hashing: Hashing::new(secret),
    };
    let mut replayed = 0;
    let journal = match journal {
        Some(source) if source.capacity > 0 => {
            let (journal, ops) = recover_journal(&db, source, &meta, &mut file)?;
            replayed = ops;
            Some(journal)
        }
        _ if meta.journal_epoch > 0 => {
            // The journal may hold acknowledged batches: it must be read, never skipped.
            return Err(journal_missing(meta.journal_epoch));
        }
        _ => None,
    };
    let (index, loaded) = load_index(&config, &db, file, file_bytes)?;
    if meta.format < layout::STORE_FORMAT {
        upgrade::count_records(&db)?;
    }
    if crate::observe::ACTIVE {
        let (in_progress, completed) = index.census();
        config.observer.opened(replayed, in_progress, completed);
    }
    let db = match reopen {
        Some(open) => {
            drop(db);
            // Verified (if at all) by the first open, and closed cleanly since.
            Guarded::new(open(config.cache_bytes, false)?)
        }
        None => db,
    };
    if let Some(space) = &space {
        space.measure(loaded.record_bytes);
    }
    Ok(FileStore::assemble(
        config,
        index,
        db.into_inner(),
        &loaded,
        journal,
        space,
    ))
}

fn journal_missing(epoch: u64) -> Error {
    Error::Corrupted {
        damaged: Damaged::Journal,
        reason: format!(
            "the store file says its journal holds epoch {epoch}, but the journal file is \
             missing (or the journal is turned off); it may hold acknowledged writes"
        ),
    }
}

/// Replays the journal's current epoch into the redb file and checkpoints it: one durable
/// commit of every journaled op, raising the epoch, so the journal starts empty. A journal
/// that holds nothing of its epoch is not checkpointed ([`Journal::resumable`]): its epoch
/// goes on. Returns the journal and how many ops it replayed.
fn recover_journal(
    db: &redb::Database,
    source: JournalSource,
    meta: &layout::Meta,
    state: &mut batch::FileState,
) -> Result<(Journal, usize)> {
    let epoch = meta.journal_epoch;
    if (epoch > 0 || meta.journal_bytes > 0) && !source.existed {
        return Err(journal_missing(epoch));
    }
    let file = (source.open)()?;
    let binding = journal::Binding {
        store_id: meta.store_id,
        epoch,
        made: meta.journal_bytes,
        header_floor: meta.journal_header,
    };
    let (mut journal, ops) = Journal::recover(file, binding, source.capacity)?;
    if journal.resumable(&binding) {
        return Ok((journal, 0));
    }
    // The records' bytes are counted by the scan that follows.
    crate::file::commit::checkpoint(&mut journal, db, &ops, state)?;
    Ok((journal, ops.len()))
}

/// Builds the index from the file's heads. A heads table that is damaged or does not match the
/// records is rebuilt from the records, which are the authority; two records whose keys share a
/// 128-bit hash (about 10⁻²⁵ at ten million keys) make it rebuilt under a fresh secret.
fn load_index(
    config: &Config,
    db: &redb::Database,
    mut file: batch::FileState,
    file_bytes: u64,
) -> Result<(Index, load::Loaded)> {
    let mut rebuilds = 0;
    loop {
        let index = Index::new(config.stripes, config.max_live_per_tenant, file.hashing);
        let secret = match load::load(db, &index, file.reserved, file_bytes)? {
            load::Scan::Loaded(loaded) => return Ok((index, loaded)),
            _ if rebuilds == MAX_REBUILDS => {
                return Err(Error::Corrupted {
                    damaged: Damaged::Index,
                    reason: format!(
                        "the heads table still fails after {MAX_REBUILDS} rebuilds from the \
                         records (two keys sharing a hash under every secret tried, or heads \
                         damaged as they are written)"
                    ),
                })
            }
            load::Scan::Collision => SipKey::random(),
            load::Scan::HeadsDamaged(reason) => {
                config.observer.heads_rebuilt(&reason);
                file.hashing.secret()
            }
        };
        drop(index);
        upgrade::rebuild_heads(db, secret)?;
        file.hashing = Hashing::new(secret);
        rebuilds += 1;
    }
}

/// How many times one open rebuilds the heads before it gives up.
const MAX_REBUILDS: usize = 3;

/// Runs an open, turning a panic into [`Error::Corrupted`]. redb 4.6 trusts its pages on a
/// clean open and panics on some damaged ones (an unknown page type, an out-of-range slice, a
/// table name that is not UTF-8); found by the `open_file` fuzz target. A damaged file must be
/// a typed error, never a crash of the service that opens it.
///
/// A read past the end of the file during the open, or data the storage engine finds invalid,
/// is damage too (a file cut short of what its own pages say, a page that lies), and is
/// reported as such rather than as an I/O error.
fn contain_panics(open: impl FnOnce() -> Result<FileStore>) -> Result<FileStore> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(open)) {
        Err(panic) => Err(crate::error::storage_panic(panic)),
        Ok(Err(Error::Io(e))) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            Err(Error::Corrupted {
                damaged: Damaged::File,
                reason: format!(
                    "the store file ends before its own pages say it does: it was truncated, or \
                     a page pointer is damaged ({e})"
                ),
            })
        }
        Ok(Err(Error::Io(e))) if e.kind() == std::io::ErrorKind::InvalidData => {
            Err(Error::Corrupted {
                damaged: Damaged::Pages,
                reason: format!("the storage engine found invalid data in the file: {e}"),
            })
        }
        Ok(opened) => opened,
    }
}

/// Creates an initialised store file at `path`, with what `fill` writes into it. The file is
/// built under a temporary name in the same directory and fsynced, then hard-linked into place,
/// which fails rather than replace a file another process created meanwhile; then the directory
/// is fsynced. A crash part way leaves at most a stray `*.creating-*` file, never a half-made
/// store at `path` (which redb would refuse to open, locking the user out of a store that never
/// held anything). Returns `false` if another process created `path` first.
pub(crate) fn create_atomically(
    path: &Path,
    fill: impl FnOnce(&redb::Database) -> Result<()>,
) -> Result<bool> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".creating-{}-{nanos}", std::process::id()));
    let tmp = path.with_file_name(name);
    let made = (|| {
        let db = redb::Builder::new().create(&tmp)?;
        layout::create(&db)?;
        fill(&db)
    })();
    let linked = made.map(|()| std::fs::hard_link(&tmp, path));
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
        _ => {}
    }
    let created = match linked? {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
        Err(e) => return Err(e.into()),
        Ok(()) => true,
    };
    platform::sync_parent_dir(path)?;
    Ok(created)
}
