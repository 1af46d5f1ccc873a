//! What an engine reports to the store above the seam: the figures only it knows, and what a
//! reap or a purge did.

use crate::error::Error;

/// What only the engine knows of a store's figures; the answers are counted above the seam.
#[derive(Debug, Default)]
pub(crate) struct EngineFigures {
    pub(crate) withdrawn: u64,
    pub(crate) commit_batches: u64,
    pub(crate) checkpoints: u64,
    pub(crate) live_records: Option<u64>,
    pub(crate) stored_bytes: u64,
    pub(crate) heals: u64,
    pub(crate) disk_full: bool,
}

/// Where a scan that reads past damage hands each record it could not read (the
/// `Error::Corrupted` naming it); `None`: the first such record ends the scan with its error.
pub(crate) type PastDamage<'a> = Option<&'a mut dyn FnMut(Error)>;

/// What a reap or a purge did: how many records it resolved or deleted, and the error that
/// stopped it, if one did. A reap that the seam's check stopped (an oversize response from the
/// resolver) counts what it resolved before, which stays resolved; an engine that fails counts
/// nothing, as its caller gets the error and cannot tell what landed.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub(crate) done: usize,
    pub(crate) stopped: Option<Error>,
}

impl Tally {
    /// A tally of `done` records, stopped by `result`'s error if it has one.
    pub(crate) fn of(done: usize, result: crate::Result<()>) -> Tally {
        Tally {
            done,
            stopped: result.err(),
        }
    }

    /// Nothing done: stopped before the first record.
    pub(crate) fn failed(e: Error) -> Tally {
        Tally {
            done: 0,
            stopped: Some(e),
        }
    }
}
