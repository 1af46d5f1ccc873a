//! The journal's file: `<store file>-journal`, beside the store, read and written at offsets
//! through [`crate::file::platform`].

use crate::error::Result;
use crate::file::platform;
use std::path::{Path, PathBuf};

/// Where a store's journal lives: `<store file>-journal`, beside it.
pub(crate) fn journal_path(store: &Path) -> PathBuf {
    crate::file::platform::beside(store, "-journal")
}

/// Opens (creating if need be) the journal file at `path`, and makes its directory entry
/// durable.
pub(crate) fn open(path: &Path) -> Result<Box<dyn redb::StorageBackend>> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    platform::sync_parent_dir(path)?;
    Ok(Box::new(JournalFile(file)))
}

/// A journal in a real file.
struct JournalFile(std::fs::File);

impl std::fmt::Debug for JournalFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JournalFile")
    }
}

impl redb::StorageBackend for JournalFile {
    fn len(&self) -> std::io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        platform::read_exact_at(&self.0, out, offset)
    }

    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.0.set_len(len)
    }

    fn sync_data(&self) -> std::io::Result<()> {
        platform::sync_data(&self.0)
    }

    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        platform::write_all_at(&self.0, data, offset)
    }
}
