//! What idemdb needs of the operating system, in one place: positioned reads and writes, a
//! flush that reaches stable storage, and a durable directory entry for a new file.
//!
//! Supported: unix. Linux (x86_64, ext4) is what CI tests; macOS and the BSDs build from the
//! same code and are not tested here. The flush is `File::sync_data`, which the standard
//! library implements as `fdatasync(2)` on Linux and as `fcntl(F_FULLFSYNC)` on Apple targets
//! (a plain `fsync` there leaves data in the drive's cache). Other targets are refused at
//! compile time: Windows would need its own durable directory entry for a new file (its `std`
//! cannot open a directory to flush it), and an untested durability path is worse than none.

#[cfg(not(unix))]
compile_error!(
    "idemdb supports unix targets only (Linux is tested; macOS and the BSDs build from the same \
     code): its journal and store-file creation rely on positioned I/O and on fsyncing a \
     directory, which it implements for unix alone. See src/platform.rs."
);

use std::fs::File;
use std::io;
use std::path::Path;

/// Reads exactly `out.len()` bytes at `offset`.
pub(crate) fn read_exact_at(file: &File, out: &mut [u8], offset: u64) -> io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, out, offset)
}

/// Writes all of `data` at `offset`.
pub(crate) fn write_all_at(file: &File, data: &[u8], offset: u64) -> io::Result<()> {
    std::os::unix::fs::FileExt::write_all_at(file, data, offset)
}

/// Makes the file's data durable: `fdatasync(2)` on Linux, `fcntl(F_FULLFSYNC)` on Apple
/// targets (both through `File::sync_data`).
pub(crate) fn sync_data(file: &File) -> io::Result<()> {
    file.sync_data()
}

/// Makes a new file's directory entry durable: `fsync(2)` of its parent directory.
pub(crate) fn sync_parent_dir(path: &Path) -> io::Result<()> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    File::open(parent)?.sync_all()
}

/// Drops the page cache of the file at `path` (nothing if there is no such file), so that the
/// next reads come from the disk: `posix_fadvise(POSIX_FADV_DONTNEED)` on Linux. After a failed
/// `fdatasync` the pages that did not reach the disk are clean, and this evicts them; dirty
/// pages are only queued for writing. Other systems keep their cache (a heal there reads what a
/// restart of the process would read).
pub(crate) fn drop_cache(path: &Path) -> io::Result<()> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    #[cfg(target_os = "linux")]
    rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed)?;
    #[cfg(not(target_os = "linux"))]
    drop(file);
    Ok(())
}
