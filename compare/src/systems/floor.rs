//! fsync-floor: what one durable write costs this disk. Each write is a 4 KiB `pwrite` in place
//! (always the same offset of a preallocated file) followed by `fdatasync`. No lookup, no
//! allocation, no metadata change: nothing a store could do with less. One caller only.

use super::{Client, Result, Setup, System};
use crate::workload::Request;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

/// Bytes per write: one page.
const BLOCK: usize = 4096;
/// Size of the preallocated file.
const FILE_LEN: usize = 1 << 20;

pub struct FloorSystem {
    path: PathBuf,
    dir: PathBuf,
}

impl FloorSystem {
    /// Writes the file in full and syncs it, so later writes change no metadata.
    pub fn open(setup: &Setup) -> Result<FloorSystem> {
        std::fs::create_dir_all(&setup.dir)?;
        let path = setup.dir.join("floor.bin");
        let mut file = File::create(&path)?;
        file.write_all(&vec![0x5a; FILE_LEN])?;
        file.sync_all()?;
        File::open(&setup.dir)?.sync_all()?;
        Ok(FloorSystem {
            path,
            dir: setup.dir.clone(),
        })
    }
}

impl System for FloorSystem {
    fn client(&self) -> Result<Box<dyn Client + '_>> {
        Ok(Box::new(FloorClient {
            file: OpenOptions::new().write(true).open(&self.path)?,
            block: vec![0xa5; BLOCK],
        }))
    }

    fn destroy(self: Box<Self>) -> Result<()> {
        std::fs::remove_dir_all(&self.dir)?;
        Ok(())
    }
}

struct FloorClient {
    file: File,
    block: Vec<u8>,
}

impl FloorClient {
    fn write(&mut self) -> Result<()> {
        // Change the bytes each time, so no layer could skip an identical write.
        self.block[0] = self.block[0].wrapping_add(1);
        self.file.write_all_at(&self.block, 0)?;
        self.file.sync_data()?;
        Ok(())
    }
}

impl Client for FloorClient {
    fn claim(&mut self, _req: &Request) -> Result<()> {
        self.write()
    }

    fn complete(&mut self, _req: &Request) -> Result<()> {
        self.write()
    }
}
