//! Healing: a store file halted by a failed write or sync reopens itself in place, from what the
//! disk holds, once the disk works again.
//!
//! Why halt at all: after a failed `fdatasync(2)` the page cache cannot be trusted. Linux marks
//! the pages that did not reach the disk clean, so reads keep returning data the disk does not
//! hold, and a later sync succeeds without writing them. So the failed commit's pipeline stops
//! acknowledging anything (`commit.rs`). Before healing, only a restart of the process brought
//! the store back. A heal does what a restart does, without one:
//!
//! 1. The halted pipeline lets go of its files: it waits for a running commit, then closes the
//!    journal and the redb file (redb locks its file while open).
//! 2. The page cache of both files is dropped (`posix_fadvise(POSIX_FADV_DONTNEED)`, Linux), so
//!    that pages a failed sync left behind are read from the disk again. Pages never written
//!    back (dirty) stay, and are written by the next sync: they are writes whose calls failed.
//! 3. The files are opened as at startup (`open.rs`): the journal is replayed into the store
//!    file and checkpointed, a durable redb commit that only succeeds once the disk accepts
//!    writes and syncs again; the index is rebuilt from the file.
//! 4. The new store replaces the halted one for every clone of the `Store`.
//!
//! Until then every operation answers `Error::Halted` (the HTTP layer: 503 with Retry-After).
//! Attempts run on a thread of their own, `idemdb-heal`, started by the first operation that
//! finds the store halted; the first waits `heal_after`, each failed one doubles the wait, up
//! to [`MAX_DELAY`]. An attempt that fails for a reason no retry can fix (a damaged file, a
//! panic inside redb, whose file then stays open) ends them: the store stays halted, and its
//! `Halted` errors say why.
//!
//! What a healed store holds is what a restart would find: every acknowledged operation (each
//! was in a journal entry or a redb commit whose sync succeeded); an operation whose call
//! failed may or may not be there, as after a crash. Tickets issued before the heal belong to
//! the halted store: the new one refuses them with `Error::LeaseLost`, as it does any ticket of
//! another store, and their claims are in it as orphans (taken over once their lease runs out,
//! or handed to `reap`'s resolver), as after a restart.

use crate::config::Config;
use crate::error::{Error, Result};
use crate::file::store::FileStore;
use crate::sync::{Arc, Mutex, Ordering, RwLock, Weak};
use std::path::PathBuf;
use std::time::Duration;

/// The longest wait between two attempts.
pub(crate) const MAX_DELAY: Duration = Duration::from_secs(10);

const HEALER_NAME: &str = "idemdb-heal";

/// Where a store's files are, to open them again.
#[derive(Debug)]
pub(crate) enum Source {
    File(PathBuf),
    /// Nothing to reopen: a store in memory does no I/O that can fail.
    Memory,
    #[cfg(any(test, fuzzing, feature = "simulation"))]
    Simulated(crate::simulation::SimDisk),
}

/// The store every clone of a `Store` on a file uses: the current one, replaced by a heal.
#[derive(Clone, Debug)]
pub(crate) struct Healing {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    current: RwLock<FileStore>,
    source: Source,
    config: Config,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// An `idemdb-heal` thread is attempting.
    running: bool,
    /// Why attempts ended for good.
    gave_up: Option<String>,
}

/// Why an attempt failed.
enum Failed {
    /// The disk may work later.
    Retry(String),
    /// It will not: the store stays halted.
    GiveUp(String),
}

impl Healing {
    pub(crate) fn new(store: FileStore, source: Source, config: Config) -> Healing {
        Healing {
            shared: Arc::new(Shared {
                current: RwLock::new(store),
                source,
                config,
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// The instruments of the store, which every store a heal opens keeps.
    pub(crate) fn observer(&self) -> &crate::observe::Observer {
        &self.shared.config.observer
    }

    /// The store to run an operation on. One that halted starts the attempts to heal it (and
    /// answers `Halted` meanwhile).
    pub(crate) fn current(&self) -> FileStore {
        let store = self.shared.current.read().clone();
        if store.inner.pipeline.is_halted() {
            self.start();
        }
        store
    }

    fn start(&self) {
        let Some(first) = self.shared.config.heal_after else {
            return;
        };
        if matches!(self.shared.source, Source::Memory) {
            return;
        }
        let mut state = self.shared.state.lock();
        if state.running || state.gave_up.is_some() {
            return;
        }
        let weak = Arc::downgrade(&self.shared);
        let spawned = std::thread::Builder::new()
            .name(HEALER_NAME.into())
            .spawn(move || attempt_until_healed(&weak, first));
        // Without a thread the store stays halted; the next operation tries again.
        state.running = spawned.is_ok();
    }
}

/// The `idemdb-heal` thread: attempts until the store is healed, gone, or cannot be healed.
fn attempt_until_healed(shared: &Weak<Shared>, first: Duration) {
    let mut delay = first;
    loop {
        std::thread::sleep(delay);
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let outcome = shared.attempt();
        let observer = &shared.config.observer;
        let mut state = shared.state.lock();
        match outcome {
            Ok(()) => {
                observer.heal_attempted(Ok(()));
                state.running = false;
                return;
            }
            Err(Failed::Retry(why)) => observer.heal_attempted(Err((&why, true))),
            Err(Failed::GiveUp(why)) => {
                observer.heal_attempted(Err((&why, false)));
                state.running = false;
                shared.current.read().inner.pipeline.note_on_halt(&why);
                state.gave_up = Some(why);
                return;
            }
        }
        drop(state);
        delay = delay.saturating_mul(2).min(MAX_DELAY);
    }
}

impl Shared {
    fn attempt(&self) -> std::result::Result<(), Failed> {
        let halted = self.current.read().clone();
        let pipeline = &halted.inner.pipeline;
        if !pipeline.is_halted() {
            return Ok(());
        }
        if !pipeline.release_files() {
            return Err(Failed::GiveUp(
                "redb panicked inside this store, so its file stays open until the process \
                 exits: restart the process to reopen it"
                    .into(),
            ));
        }
        let mut healed = self.reopen().map_err(|e| match e {
            Error::Io(e) => Failed::Retry(e.to_string()),
            other => Failed::GiveUp(format!("the store could not be reopened: {other}")),
        })?;
        healed.continue_counting(&halted);
        *self.current.write() = healed;
        halted.inner.counters.heals.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn reopen(&self) -> Result<FileStore> {
        let config = self.config.clone();
        match &self.source {
            Source::File(path) => {
                for file in [path.clone(), crate::file::journal::file::journal_path(path)] {
                    crate::file::platform::drop_cache(&file)?;
                }
                crate::file::open::file(config, path)
            }
            Source::Memory => Err(Error::Halted {
                cause: "a store in memory is not reopened".into(),
            }),
            #[cfg(any(test, fuzzing, feature = "simulation"))]
            Source::Simulated(disk) => {
                disk.drop_cache();
                crate::file::open::simulated(config, disk)
            }
        }
    }
}
