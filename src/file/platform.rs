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

/// The file beside the store file at `store` named `<store file><suffix>` (its journal, its
/// open marker, its reserve).
pub(crate) fn beside(store: &Path, suffix: &str) -> std::path::PathBuf {
    let mut name = store.as_os_str().to_owned();
    name.push(suffix);
    name.into()
}

/// The directory holding the file at `path` (`.` for a bare file name).
pub(crate) fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Makes a new file's directory entry durable: `fsync(2)` of its parent directory.
pub(crate) fn sync_parent_dir(path: &Path) -> io::Result<()> {
    File::open(parent_dir(path))?.sync_all()
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

/// The bytes an unprivileged writer may still allocate on the filesystem holding `path`:
/// `statvfs(2)`'s `f_bavail * f_frsize` on Linux. `None` elsewhere: the reserve is not kept.
pub(crate) fn available_bytes(path: &Path) -> io::Result<Option<u64>> {
    #[cfg(target_os = "linux")]
    {
        let fs = rustix::fs::statvfs(path)?;
        Ok(Some(fs.f_bavail.saturating_mul(fs.f_frsize)))
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = path;
        Ok(None)
    }
}

/// Gives `file` `len` bytes of disk blocks of its own: `fallocate(2)` on Linux (which fails
/// with ENOSPC rather than leave a hole), and writing zeros where a filesystem does not offer it.
pub(crate) fn allocate(file: &File, len: u64) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    match rustix::fs::fallocate(file, rustix::fs::FallocateFlags::empty(), 0, len) {
        Ok(()) => return Ok(()),
        Err(e) if e == rustix::io::Errno::OPNOTSUPP => {}
        Err(e) => return Err(e.into()),
    }
    let zeros = vec![0u8; 1 << 20];
    let mut at = 0;
    while at < len {
        let n = usize::try_from(len - at).map_or(zeros.len(), |left| left.min(zeros.len()));
        write_all_at(file, &zeros[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

/// Takes an exclusive `flock(2)` on `file` without waiting; `false` if another open file holds
/// one. Elsewhere than Linux: always `true` (the store file's own lock still excludes).
pub(crate) fn try_lock(file: &File) -> io::Result<bool> {
    #[cfg(target_os = "linux")]
    match rustix::fs::flock(file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(true),
        Err(e) if e == rustix::io::Errno::WOULDBLOCK => Ok(false),
        Err(e) => Err(e.into()),
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = file;
        Ok(true)
    }
}
