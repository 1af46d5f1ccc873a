//! The `heads` table: for every record, the index's slot for it, in 48 bytes, keyed by the
//! same fence. An open rebuilds the index from these alone (about 50 bytes a record, against
//! the 400 to 1,000 a record with its response takes), so a restart reads a tenth of the file
//! and no response; the records stay the authority, read and verified when a request needs one.
//!
//! Every batch writes a record's head in the same redb transaction as the record (and the
//! journal's replay goes through the same code), so the two tables never disagree in a
//! committed state. A head that fails its checksum, or a table whose length differs from the
//! records', is derived data gone wrong: the open rebuilds the table from the records
//! (`upgrade::rebuild_heads`), as it does for a file of store format 2, which had none. Except
//! when a head that passes its checksum names a fence the records table lacks: then the records
//! lost data, and the open refuses rather than rebuild the heads from what is left.
//!
//! Layout (little-endian): key hash lo (u64), key hash hi (u64), fingerprint tag (u64), deadline
//! (u64: lease end in progress, expiry completed), tenant hash (u64), the record value's length
//! with the completed flag in its top bit (u32), CRC-32 of the fence and the 44 bytes before it.

use crate::file::hashing::Hashing;
use crate::file::index::{Index, KeyHash, Slot, SlotState, Tag};
use crate::file::record::{Head, HeadState};
use crate::model::scope::tenant_of;
use redb::TableDefinition;

pub(crate) const HEAD_BYTES: usize = 48;

/// fence -> the [`StoredHead`] of the record at that fence.
pub(crate) const HEADS: TableDefinition<u64, [u8; HEAD_BYTES]> = TableDefinition::new("heads");

const COMPLETED: u32 = 1 << 31;

/// What the index needs of one record, as the `heads` table holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StoredHead {
    pub(crate) key: KeyHash,
    pub(crate) tag: Tag,
    pub(crate) tenant: u64,
    pub(crate) completed: bool,
    pub(crate) deadline: u64,
    /// The length of the record's value, for the store's byte count.
    pub(crate) value_len: u32,
}

impl StoredHead {
    /// The head of the record `value` (whose decoded front is `head`) for `scoped_key`.
    pub(crate) fn of(hashing: &Hashing, scoped_key: &[u8], head: &Head, value_len: usize) -> Self {
        let (lo, hi) = hashing.key(scoped_key);
        let (completed, deadline) = match head.state {
            HeadState::InProgress { lease_until } => (false, lease_until),
            HeadState::Completed { expires_at, .. } => (true, expires_at),
        };
        StoredHead {
            key: KeyHash::from_parts(lo, hi),
            tag: Tag(hashing.tag(&head.fingerprint)),
            tenant: hashing.tenant(tenant_of(scoped_key)),
            completed,
            deadline,
            // Record values are bounded far below 2^31 (responses by 64 MiB).
            value_len: u32::try_from(value_len)
                .unwrap_or(COMPLETED - 1)
                .min(COMPLETED - 1),
        }
    }

    pub(crate) fn encode(&self, fence: u64) -> [u8; HEAD_BYTES] {
        let mut out = [0u8; HEAD_BYTES];
        let (lo, hi) = self.key.parts();
        out[0..8].copy_from_slice(&lo.to_le_bytes());
        out[8..16].copy_from_slice(&hi.to_le_bytes());
        out[16..24].copy_from_slice(&self.tag.0.to_le_bytes());
        out[24..32].copy_from_slice(&self.deadline.to_le_bytes());
        out[32..40].copy_from_slice(&self.tenant.to_le_bytes());
        let flags = self.value_len | if self.completed { COMPLETED } else { 0 };
        out[40..44].copy_from_slice(&flags.to_le_bytes());
        let crc = checksum(fence, &out[..44]);
        out[44..48].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// `None` if the bytes fail their checksum (which covers the fence they are stored at).
    pub(crate) fn decode(fence: u64, bytes: &[u8; HEAD_BYTES]) -> Option<StoredHead> {
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let stored = u32::from_le_bytes(bytes[44..48].try_into().expect("4 bytes"));
        if stored != checksum(fence, &bytes[..44]) {
            return None;
        }
        let flags = u32::from_le_bytes(bytes[40..44].try_into().expect("4 bytes"));
        Some(StoredHead {
            key: KeyHash::from_parts(word(0), word(8)),
            tag: Tag(word(16)),
            deadline: word(24),
            tenant: word(32),
            completed: flags & COMPLETED != 0,
            value_len: flags & !COMPLETED,
        })
    }

    /// The slot an open puts in the index: a claim in progress is an orphan (its holder was a
    /// previous process), a completion is durable (it is in the file).
    pub(crate) fn slot(&self, fence: u64) -> Slot {
        let state = if self.completed {
            SlotState::Completed {
                expires_at: self.deadline,
                durable: true,
            }
        } else {
            SlotState::InProgress {
                lease_until: self.deadline,
                orphan: true,
            }
        };
        Slot::new(fence, self.tag, state)
    }

    /// Counts the record's tenant, when the index keeps counts.
    pub(crate) fn count_tenant(&self, index: &Index) {
        if let Some(tenants) = &index.tenants {
            tenants.loaded(self.tenant);
        }
    }
}

fn checksum(fence: u64, bytes: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&fence.to_le_bytes());
    h.update(bytes);
    h.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file::hashing::SipKey;

    fn sample(completed: bool) -> StoredHead {
        StoredHead {
            key: KeyHash::from_parts(1, u64::MAX),
            tag: Tag(3),
            tenant: 4,
            completed,
            deadline: 5,
            value_len: (1 << 31) - 1,
        }
    }

    #[test]
    fn a_head_round_trips_and_its_checksum_covers_every_byte_and_the_fence() {
        for completed in [false, true] {
            let head = sample(completed);
            let bytes = head.encode(42);
            assert_eq!(StoredHead::decode(42, &bytes), Some(head));
            assert_eq!(
                StoredHead::decode(43, &bytes),
                None,
                "read at another fence"
            );
            for i in 0..HEAD_BYTES {
                let mut damaged = bytes;
                damaged[i] ^= 0x10;
                assert_eq!(StoredHead::decode(42, &damaged), None, "byte {i} flipped");
            }
        }
    }

    #[test]
    fn a_head_names_the_same_key_tag_and_tenant_as_the_index() {
        let hashing = Hashing::new(SipKey::random());
        let index = Index::new(4, Some(10), hashing);
        let key = crate::model::scope::scoped_key(&crate::Scope::new("t", "e"), "k").unwrap();
        let head = Head {
            fence: 9,
            fingerprint: [7; 32],
            claimed_at: 1,
            state: HeadState::Completed {
                completed_at: 2,
                expires_at: 3,
            },
        };
        let stored = StoredHead::of(&hashing, &key, &head, 100);
        assert_eq!(stored.key, index.hash(&key));
        let fingerprint = crate::Fingerprint::from_bytes([7; 32]);
        assert_eq!(stored.tag, index.tag(&fingerprint));
        assert_eq!(
            stored.slot(9).state(),
            SlotState::Completed {
                expires_at: 3,
                durable: true
            }
        );
        stored.count_tenant(&index);
        assert_eq!(index.tenants.as_ref().unwrap().live("t"), 1);
    }
}
