//! A simulated disk for tests: a redb backend with a live image and a durable image. Writes go
//! to the live image; `sync_data` copies it to the durable image; a crash keeps only the durable
//! image. It can also fail the N-th write or sync.

use crate::sync::{Arc, Mutex};
use redb::StorageBackend;

#[derive(Debug, Default)]
struct Images {
    live: Vec<u8>,
    durable: Vec<u8>,
    writes: u64,
    syncs: u64,
    /// Fail every write once this many have succeeded.
    fail_writes_after: Option<u64>,
    /// Fail every sync once this many have succeeded.
    fail_syncs_after: Option<u64>,
}

/// A disk shared by the backends opened on it, one at a time.
#[derive(Debug, Clone, Default)]
pub(crate) struct SimDisk(Arc<Mutex<Images>>);

impl SimDisk {
    pub(crate) fn new() -> SimDisk {
        SimDisk::default()
    }

    /// A backend over the live image.
    pub(crate) fn backend(&self) -> SimBackend {
        SimBackend(self.clone())
    }

    /// Power loss: everything not synced is gone.
    pub(crate) fn crash(&self) {
        let mut i = self.0.lock();
        i.live = i.durable.clone();
        i.fail_writes_after = None;
        i.fail_syncs_after = None;
    }

    pub(crate) fn syncs(&self) -> u64 {
        self.0.lock().syncs
    }

    pub(crate) fn fail_writes_after(&self, n: u64) {
        let mut i = self.0.lock();
        i.fail_writes_after = Some(i.writes + n);
    }

    pub(crate) fn fail_syncs_after(&self, n: u64) {
        let mut i = self.0.lock();
        i.fail_syncs_after = Some(i.syncs + n);
    }
}

fn injected() -> std::io::Error {
    std::io::Error::other("injected fault")
}

#[derive(Debug)]
pub(crate) struct SimBackend(SimDisk);

impl StorageBackend for SimBackend {
    fn len(&self) -> Result<u64, std::io::Error> {
        Ok(self.0 .0.lock().live.len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        let i = self.0 .0.lock();
        let start = usize::try_from(offset).map_err(|_| injected())?;
        let src = i
            .live
            .get(start..start + out.len())
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
        out.copy_from_slice(src);
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        let len = usize::try_from(len).map_err(|_| injected())?;
        self.0 .0.lock().live.resize(len, 0);
        Ok(())
    }

    fn sync_data(&self) -> Result<(), std::io::Error> {
        let mut i = self.0 .0.lock();
        if i.fail_syncs_after.is_some_and(|n| i.syncs >= n) {
            return Err(injected());
        }
        i.syncs += 1;
        i.durable = i.live.clone();
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        let mut i = self.0 .0.lock();
        if i.fail_writes_after.is_some_and(|n| i.writes >= n) {
            return Err(injected());
        }
        i.writes += 1;
        let start = usize::try_from(offset).map_err(|_| injected())?;
        let end = start + data.len();
        if i.live.len() < end {
            i.live.resize(end, 0);
        }
        i.live[start..end].copy_from_slice(data);
        Ok(())
    }
}
