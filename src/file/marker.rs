//! The open marker: `<store file>-opening`, present while an open of the store runs. An open
//! that finds it was preceded by one that never finished (the process died inside it: redb
//! aborting on a damaged page, a stack overflow, an allocation a damaged length asked for, or a
//! plain SIGKILL), so it verifies every page before trusting any (`PageCheck::Verify`), and a
//! damaged file is refused with `Error::Corrupted` instead of killing the process again: a
//! service under a supervisor does not crash-loop on it.
//!
//! The marker is removed only once an open succeeds. An open that fails keeps it, so every
//! later start verifies (and refuses typed) until the file is repaired; except a failure to get
//! the store at all because another `Store` holds it (`AlreadyOpen`), which says nothing of the
//! file: that open removes a marker it made. Making the marker is best effort: where it cannot
//! be written (a full or read-only file system), the open goes on without one.

use std::path::{Path, PathBuf};

/// The marker of one open.
pub(crate) struct OpenMarker {
    path: PathBuf,
    /// A previous open left it: this open verifies.
    pub(crate) unfinished: bool,
    /// This open wrote it.
    made: bool,
}

/// Where the marker of the store at `store` lives.
pub(crate) fn marker_path(store: &Path) -> PathBuf {
    crate::file::platform::beside(store, "-opening")
}

impl OpenMarker {
    /// Marks an open of the store at `store` as begun.
    pub(crate) fn begin(store: &Path) -> OpenMarker {
        let path = marker_path(store);
        let unfinished = path.exists();
        let made = !unfinished
            && std::fs::write(&path, format!("opened by process {}\n", std::process::id())).is_ok();
        OpenMarker {
            path,
            unfinished,
            made,
        }
    }

    /// The open succeeded: the next one may trust the pages again.
    pub(crate) fn finished(self) {
        let _ = std::fs::remove_file(&self.path);
    }

    /// The open could not get the store (another `Store` has it): a marker it made says nothing.
    pub(crate) fn abandoned(self) {
        if self.made {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}
