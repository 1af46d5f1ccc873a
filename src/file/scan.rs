//! Reading the file engine's records one by one: [`crate::Store::scan`] and the export.

use crate::clock::to_millis;
use crate::error::{Damaged, Error, Result};
use crate::file::index::{KeyHash, Slot, SlotState};
use crate::file::read;
use crate::file::record::RecordState;
use crate::file::store::FileStore;
use crate::model::listing::{Query, RecordStatus};
use crate::model::moved::{Moved, MovedState};
use crate::model::report::PastDamage;
use crate::model::response::Response;
use crate::model::scope::split_scoped_key;
use std::ops::ControlFlow;

/// Records read from the file per read transaction.
const CHUNK: usize = 1024;

/// A slot's status at `now`, as [`crate::Entry::status_at`] gives it for the record.
fn status_of(slot: &Slot, now: u64) -> RecordStatus {
    match slot.state() {
        SlotState::InProgress { orphan: true, .. } => RecordStatus::Orphan,
        SlotState::InProgress { lease_until, .. } if lease_until <= now => RecordStatus::Stale,
        SlotState::InProgress { .. } => RecordStatus::InProgress,
        SlotState::Completed { expires_at, .. } if expires_at <= now => RecordStatus::Expired,
        SlotState::Completed { .. } => RecordStatus::Completed,
    }
}

impl FileStore {
    /// Hands the records whose status `query` wants to `each`, in fence order, with whether
    /// each is an orphan and the time they were judged at, until `each` breaks. The index is
    /// read once every queued write landed; each chunk of records is then read in one
    /// snapshot, and a record that changed meanwhile is handed over as it was read, or left
    /// out if it is gone (or its completion is not yet in the file).
    ///
    /// With `past_damage`, a chunk that cannot be read is read again a record at a time, and
    /// each record that fails its checks, or whose page cannot be read, goes to it instead of
    /// ending the scan.
    pub(crate) fn scan_each(
        &self,
        query: &Query,
        mut past_damage: PastDamage<'_>,
        mut each: impl FnMut(Moved, bool, u64) -> ControlFlow<()>,
    ) -> Result<()> {
        let inner = &*self.inner;
        inner.pipeline.check()?;
        inner.pipeline.flush()?;
        let now = to_millis(inner.config.clock.now());
        let mut wanted: Vec<(KeyHash, Slot)> = Vec::new();
        for stripe in inner.index.stripes() {
            wanted.extend(
                stripe
                    .iter()
                    .filter(|(_, slot)| query.wants_status(status_of(slot, now)))
                    .map(|(hash, slot)| (*hash, slot.clone())),
            );
        }
        wanted.sort_unstable_by_key(|(_, slot)| slot.fence());
        for chunk in wanted.chunks(CHUNK) {
            let fences = chunk.iter().map(|(_, s)| s.fence());
            let records = match (
                inner.pipeline.read(|db| read::read_many(db, fences)),
                &mut past_damage,
            ) {
                (Ok(records), _) => records,
                (Err(Error::Corrupted { .. }), Some(damaged)) => {
                    self.read_one_by_one(chunk.iter().map(|(_, s)| s.fence()), damaged)?
                }
                (Err(e), _) => return Err(e),
            };
            for ((hash, slot), read) in chunk.iter().zip(records) {
                let Some((key, record)) = read else {
                    continue; // deleted since the index was read
                };
                if inner.index.hash(&key) != *hash {
                    continue;
                }
                let Some((scope, key)) = split_scoped_key(&key) else {
                    continue;
                };
                let (fingerprint, claimed_at) = (record.fingerprint(), record.claimed_at);
                // The claim's fence, which a completion stored apart keeps naming.
                let fence = record.fence;
                let (state, orphan) = match (slot.state(), record.state) {
                    (
                        SlotState::Completed { .. },
                        RecordState::Completed {
                            completed_at,
                            expires_at,
                            response,
                        },
                    ) => (
                        MovedState::Completed {
                            completed_at,
                            expires_at,
                            response: Response::from(response),
                        },
                        false,
                    ),
                    (
                        SlotState::InProgress {
                            lease_until,
                            orphan,
                        },
                        _,
                    ) => (MovedState::InProgress { lease_until }, orphan),
                    // Completed in the index, not yet in this snapshot: it landed after the
                    // flush; the next scan has it.
                    (SlotState::Completed { .. }, RecordState::InProgress { .. }) => continue,
                };
                let moved = Moved {
                    scope,
                    key,
                    fence,
                    fingerprint,
                    claimed_at,
                    state,
                };
                if each(moved, orphan, now).is_break() {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// Reads the records at `fences` one at a time, each in its own snapshot; one that cannot
    /// be read is handed to `damaged` (named by its fence when its page hides its key) and
    /// left out.
    fn read_one_by_one(
        &self,
        fences: impl Iterator<Item = u64>,
        damaged: &mut &mut dyn FnMut(Error),
    ) -> Result<Vec<Option<read::Keyed>>> {
        let mut out = Vec::new();
        for fence in fences {
            out.push(
                match self.inner.pipeline.read(|db| read::read_at(db, fence)) {
                    Ok(read) => read,
                    Err(Error::Corrupted {
                        damaged: Damaged::Record { fence: at, key },
                        reason,
                    }) => {
                        damaged(Error::Corrupted {
                            damaged: Damaged::Record {
                                fence: at.or(Some(fence)),
                                key,
                            },
                            reason,
                        });
                        None
                    }
                    Err(Error::Corrupted { reason, .. }) => {
                        damaged(Error::Corrupted {
                            damaged: Damaged::Record {
                                fence: Some(fence),
                                key: None,
                            },
                            reason: format!("its page cannot be read: {reason}"),
                        });
                        None
                    }
                    Err(e) => return Err(e),
                },
            );
        }
        Ok(out)
    }
}
