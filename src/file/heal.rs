//! Healing: a store file halted by a failed write or sync reopens itself in place, from what the
//! disk holds, once the disk works again.
//!
//! Why halt at all: after a failed `fdatasync(2)` the page cache cannot be trusted. Linux marks
//! the pages that did not reach the disk clean, so reads keep returning data the disk does not
//! hold, and a later sync succeeds without writing them. So the failed commit's pipeline stops
//! acknowledging anything (`commit/`). Before healing, only a restart of the process brought
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
use crate::sync::{Arc, AtomicUsize, Condvar, Mutex, Ordering, RwLock};
use std::path::PathBuf;
use std::time::Duration;

/// The longest wait between two attempts.
pub(crate) const MAX_DELAY: Duration = Duration::from_secs(10);

const HEALER_NAME: &str = "idemdb-heal";

/// Tests hold healer threads here, after an attempt, while it is set.
#[cfg(test)]
pub(crate) static HOLD_HEALER: crate::sync::AtomicBool = crate::sync::AtomicBool::new(false);

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
///
/// Each clone is a handle. The last one to go stops the healer thread before it lets go of
/// the store, so that the store closes on the dropping thread, before `drop` returns. (A
/// healer still holding the store would close it later, on its own thread, while the caller
/// may already be opening the file again: on the simulated disk, two redb handles then wrote
/// one file, and a power loss found a header describing the stale handle's pages.)
#[derive(Debug)]
pub(crate) struct Healing {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    current: RwLock<FileStore>,
    source: Source,
    config: Config,
    state: Mutex<State>,
    /// Wakes the healer from its wait between attempts when the last handle goes.
    wake: Condvar,
    /// The [`Healing`] handles alive.
    handles: AtomicUsize,
}

#[derive(Debug, Default)]
struct State {
    /// An `idemdb-heal` thread is attempting.
    running: bool,
    /// The last healer thread started, joined by the next start or by the last handle.
    healer: Option<std::thread::JoinHandle<()>>,
    /// The last handle is going: the healer stops.
    closing: bool,
    /// Why attempts ended for good.
    gave_up: Option<String>,
}

impl Clone for Healing {
    fn clone(&self) -> Healing {
        self.shared.handles.fetch_add(1, Ordering::Relaxed);
        Healing {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl Drop for Healing {
    fn drop(&mut self) {
        if self.shared.handles.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let healer = {
            let mut state = self.shared.state.lock();
            state.closing = true;
            state.healer.take()
        };
        self.shared.wake.notify_all();
        // An attempt under way finishes first (the healer checks `closing` between attempts).
        if let Some(healer) = healer {
            if healer.thread().id() != std::thread::current().id() {
                let _ = healer.join();
            }
        }
    }
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
                wake: Condvar::new(),
                handles: AtomicUsize::new(1),
            }),
        }
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
        if state.running || state.gave_up.is_some() || state.closing {
            return;
        }
        // The previous healer healed the store and is returning (or has).
        if let Some(previous) = state.healer.take() {
            let _ = previous.join();
        }
        let shared = Arc::clone(&self.shared);
        let spawned = std::thread::Builder::new()
            .name(HEALER_NAME.into())
            .spawn(move || attempt_until_healed(&shared, first));
        // Without a thread the store stays halted; the next operation tries again.
        state.running = spawned.is_ok();
        state.healer = spawned.ok();
    }
}

/// The `idemdb-heal` thread: attempts until the store is healed, closed, or cannot be healed.
fn attempt_until_healed(shared: &Shared, first: Duration) {
    let mut delay = first;
    loop {
        {
            let mut state = shared.state.lock();
            if !state.closing {
                shared.wake.wait_for(&mut state, delay);
            }
            if state.closing {
                state.running = false;
                return;
            }
        }
        let outcome = shared.attempt();
        #[cfg(test)]
        while HOLD_HEALER.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
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
        Ok(())
    }

    fn reopen(&self) -> Result<FileStore> {
        let config = self.config.clone();
        match &self.source {
            Source::File(path) => {
                for file in [path.clone(), crate::file::journal::file::journal_path(path)] {
                    crate::file::platform::drop_cache(&file)?;
                }
                let space = self.current.read().inner.space.clone();
                crate::file::open::file_keeping(config, path, space)
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
