//! Exporting the file engine's live records (see `crate::transfer`).

use crate::clock::to_millis;
use crate::error::Result;
use crate::file::disk;
use crate::file::index::{KeyHash, Slot, SlotState};
use crate::file::store::FileStore;
use crate::record::RecordState;
use crate::response::Response;
use crate::scope::split_scoped_key;
use crate::transfer::{Moved, MovedState};

/// Records read from the file per read transaction.
const CHUNK: usize = 1024;

impl FileStore {
    /// Hands every live record to `each`, in fence order: claims in progress and completions
    /// not yet expired, as the index has them once every queued write landed. Each chunk of
    /// records is read in one snapshot; a record that changes meanwhile is exported as it was
    /// read, or left out if it is gone.
    pub(crate) fn export_each(&self, mut each: impl FnMut(Moved) -> Result<()>) -> Result<u64> {
        let inner = &*self.inner;
        inner.pipeline.check()?;
        inner.pipeline.flush()?;
        let now = to_millis(inner.config.clock.now());
        let mut live: Vec<(KeyHash, Slot)> = Vec::with_capacity(inner.index.len());
        for stripe in inner.index.stripes() {
            live.extend(stripe.iter().map(|(hash, slot)| (*hash, slot.clone())));
        }
        live.sort_unstable_by_key(|(_, slot)| slot.fence());
        let mut exported = 0;
        for chunk in live.chunks(CHUNK) {
            let records = inner
                .pipeline
                .read(|db| disk::read_many(db, chunk.iter().map(|(_, s)| s.fence())))?;
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
                let state = match (slot.state(), record.state) {
                    (SlotState::Completed { expires_at, .. }, _) if now >= expires_at => continue,
                    (
                        SlotState::Completed { .. },
                        RecordState::Completed {
                            completed_at,
                            expires_at,
                            response,
                        },
                    ) => MovedState::Completed {
                        completed_at,
                        expires_at,
                        response: Response::from(response),
                    },
                    (SlotState::InProgress { lease_until, .. }, _) => {
                        MovedState::InProgress { lease_until }
                    }
                    // Completed in the index, not yet in this snapshot: it landed after the
                    // flush; the next export has it.
                    (SlotState::Completed { .. }, RecordState::InProgress { .. }) => continue,
                };
                each(Moved {
                    scope,
                    key,
                    fence: slot.fence(),
                    fingerprint,
                    claimed_at,
                    state,
                })?;
                exported += 1;
            }
        }
        Ok(exported)
    }
}
