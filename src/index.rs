//! The in-memory index: every live record's decision state, in lock stripes, so that replay,
//! in-progress and mismatch answers never touch the disk.

use crate::fingerprint::Fingerprint;
use crate::sync::{CachePadded, Mutex, MutexGuard};
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};

/// What the index knows of one record; the response body stays on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Slot {
    pub(crate) fence: u64,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) claimed_at: u64,
    pub(crate) state: SlotState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotState {
    InProgress {
        lease_until: u64,
        /// Left by a previous process: nobody in this process holds its ticket.
        orphan: bool,
    },
    Completed {
        expires_at: u64,
        /// False until the completing batch is fsynced; until then readers answer
        /// "in progress", so no replay is served that a crash could take back.
        durable: bool,
    },
}

/// A scoped key with its hash computed once, by the store's keyed hasher.
#[derive(Debug, Clone)]
pub(crate) struct IndexKey {
    hash: u64,
    pub(crate) bytes: Box<[u8]>,
}

impl PartialEq for IndexKey {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.bytes == other.bytes
    }
}

impl Eq for IndexKey {}

impl Hash for IndexKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// Passes the precomputed hash through, so each key is hashed once per operation.
#[derive(Default)]
pub(crate) struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, _: &[u8]) {
        unreachable!("IndexKey hashes as a single u64")
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

pub(crate) type Stripe = HashMap<IndexKey, Slot, BuildHasherDefault<PassThrough>>;

/// A power-of-two number of cache-padded stripes. The hasher is SipHash-1-3 with a per-store
/// random key (std's `RandomState`), so clients who choose keys cannot aim them at one stripe
/// or one bucket chain.
pub(crate) struct Index {
    stripes: Box<[CachePadded<Mutex<Stripe>>]>,
    hasher: RandomState,
    shift: u32,
}

impl Index {
    pub(crate) fn new(stripes: usize) -> Index {
        assert!(stripes.is_power_of_two() && stripes <= 1 << 16);
        Index {
            stripes: (0..stripes).map(|_| CachePadded::default()).collect(),
            hasher: RandomState::new(),
            shift: 64 - stripes.trailing_zeros(),
        }
    }

    pub(crate) fn key(&self, bytes: Box<[u8]>) -> IndexKey {
        IndexKey {
            hash: self.hasher.hash_one(&*bytes),
            bytes,
        }
    }

    /// The stripe holding `key`. The stripe is picked from the hash bits just below the top
    /// seven, which hashbrown uses for its control bytes, and far above the bits it uses for
    /// bucket positions, so stripes do not thin out either.
    pub(crate) fn lock(&self, key: &IndexKey) -> MutexGuard<'_, Stripe> {
        let i = if self.shift == 64 {
            0
        } else {
            usize::try_from((key.hash << 7) >> self.shift).expect("stripe index fits usize")
        };
        self.stripes[i].lock()
    }

    pub(crate) fn stripes(&self) -> impl Iterator<Item = MutexGuard<'_, Stripe>> {
        self.stripes.iter().map(|s| s.lock())
    }

    pub(crate) fn len(&self) -> usize {
        self.stripes.iter().map(|s| s.lock().len()).sum()
    }
}

impl std::fmt::Debug for Index {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Index")
            .field("stripes", &self.stripes.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_spread_over_stripes() {
        let index = Index::new(16);
        for i in 0..1600u32 {
            let key = index.key(i.to_le_bytes().to_vec().into_boxed_slice());
            index.lock(&key).insert(
                key.clone(),
                Slot {
                    fence: 1,
                    fingerprint: Fingerprint::of(b""),
                    claimed_at: 0,
                    state: SlotState::InProgress {
                        lease_until: 0,
                        orphan: false,
                    },
                },
            );
        }
        assert_eq!(index.len(), 1600);
        for stripe in index.stripes() {
            assert!(
                (40..=200).contains(&stripe.len()),
                "uneven stripe: {}",
                stripe.len()
            );
        }
    }

    #[test]
    fn one_stripe_works() {
        let index = Index::new(1);
        let key = index.key(Box::new([1, 2]));
        assert!(index.lock(&key).get(&key).is_none());
    }
}
