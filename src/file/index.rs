//! The in-memory index: every live record's decision state, in lock stripes, so that
//! in-progress and mismatch answers never touch the disk and a replay reads exactly one record.
//!
//! An entry is 40 bytes: the key's 128-bit hash and a 24-byte [`Slot`]. Neither the scoped key
//! nor the full fingerprint is kept in memory; both are in the record on disk, which the index
//! points into by fence. That is what holds a store with 10 million live keys under 128 resident
//! bytes per key (`docs/performance.md`).
//!
//! # Why a hash may stand for the key
//! Keys are hashed with two SipHash-1-3 instances under keys derived from the store's random
//! secret (`hashing.rs`), so a client cannot choose keys that collide, and two live keys collide
//! by chance with probability about n²/2¹²⁹: 1.5·10⁻²⁵ at ten million keys. Even then no
//! response crosses keys: a replay and a takeover read the record on disk and check its scoped
//! key, and refuse with [`crate::Error::Corrupted`] if it is another key's. The open rebuilds
//! the index under a new secret if two records collide. The fingerprint's 64-bit tag is keyed
//! the same way; a replay and a takeover compare the full fingerprint from disk.

use crate::file::hashing::Hashing;
use crate::model::fingerprint::Fingerprint;
use crate::sync::{CachePadded, Mutex, MutexGuard};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};

/// A scoped key's identity in the index: two independent keyed 64-bit hashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeyHash {
    /// Picks the stripe and the bucket.
    lo: u64,
    hi: u64,
}

impl KeyHash {
    pub(crate) fn from_parts(lo: u64, hi: u64) -> KeyHash {
        KeyHash { lo, hi }
    }

    pub(crate) fn parts(&self) -> (u64, u64) {
        (self.lo, self.hi)
    }
}

impl Hash for KeyHash {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.lo);
    }
}

/// A scoped key with its hash computed once, by the store's keyed hashers. Tickets and queued
/// writes carry the bytes; the index keeps only the hash.
#[derive(Debug, Clone)]
pub(crate) struct IndexKey {
    pub(crate) hash: KeyHash,
    pub(crate) bytes: Box<[u8]>,
}

/// A keyed 64-bit digest of a request fingerprint: equal fingerprints have equal tags, and a
/// client cannot make two different fingerprints share one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tag(pub(crate) u64);

/// What the index knows of one record, in 24 bytes; the rest (scoped key, full fingerprint,
/// claim time, response) is in the record at `fence` on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Slot {
    /// The fence in the low 62 bits; [`COMPLETED`] and [`FLAG`] above it.
    word: u64,
    tag: Tag,
    /// `lease_until` in progress, `expires_at` completed (milliseconds since the epoch).
    deadline: u64,
}

const COMPLETED: u64 = 1 << 63;
/// `orphan` in progress, `durable` completed.
const FLAG: u64 = 1 << 62;
const FENCE_BITS: u64 = FLAG - 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotState {
    InProgress {
        lease_until: u64,
        /// Nobody holds its ticket: a previous process left it, or the ticket was dropped.
        orphan: bool,
    },
    Completed {
        expires_at: u64,
        /// False until the completing batch is fsynced; until then readers answer
        /// "in progress", so no replay is served that a crash could take back.
        durable: bool,
    },
}

impl Slot {
    pub(crate) fn new(fence: u64, tag: Tag, state: SlotState) -> Slot {
        assert!(fence <= FENCE_BITS, "fences stay below 2^62");
        let mut slot = Slot {
            word: fence,
            tag,
            deadline: 0,
        };
        slot.set_state(state);
        slot
    }

    pub(crate) fn fence(&self) -> u64 {
        self.word & FENCE_BITS
    }

    pub(crate) fn tag(&self) -> Tag {
        self.tag
    }

    pub(crate) fn state(&self) -> SlotState {
        let flag = self.word & FLAG != 0;
        if self.word & COMPLETED != 0 {
            SlotState::Completed {
                expires_at: self.deadline,
                durable: flag,
            }
        } else {
            SlotState::InProgress {
                lease_until: self.deadline,
                orphan: flag,
            }
        }
    }

    pub(crate) fn set_state(&mut self, state: SlotState) {
        let (completed, flag, deadline) = match state {
            SlotState::InProgress {
                lease_until,
                orphan,
            } => (false, orphan, lease_until),
            SlotState::Completed {
                expires_at,
                durable,
            } => (true, durable, expires_at),
        };
        self.word =
            self.fence() | if completed { COMPLETED } else { 0 } | if flag { FLAG } else { 0 };
        self.deadline = deadline;
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
        unreachable!("KeyHash hashes as a single u64")
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

pub(crate) type Stripe = HashMap<KeyHash, Slot, BuildHasherDefault<PassThrough>>;

/// A power-of-two number of cache-padded stripes.
pub(crate) struct Index {
    stripes: Box<[CachePadded<Mutex<Stripe>>]>,
    /// Live records per tenant, when the store limits them.
    pub(crate) tenants: Option<crate::file::tenants::TenantCounts>,
    hashing: Hashing,
    shift: u32,
}

impl Index {
    pub(crate) fn new(stripes: usize, tenant_limit: Option<u64>, hashing: Hashing) -> Index {
        assert!(stripes.is_power_of_two() && stripes <= 1 << 16);
        Index {
            stripes: (0..stripes).map(|_| CachePadded::default()).collect(),
            tenants: tenant_limit
                .map(|limit| crate::file::tenants::TenantCounts::new(limit, hashing)),
            hashing,
            shift: 64 - stripes.trailing_zeros(),
        }
    }

    pub(crate) fn hashing(&self) -> &Hashing {
        &self.hashing
    }

    pub(crate) fn hash(&self, bytes: &[u8]) -> KeyHash {
        let (lo, hi) = self.hashing.key(bytes);
        KeyHash { lo, hi }
    }

    pub(crate) fn key(&self, bytes: Box<[u8]>) -> IndexKey {
        IndexKey {
            hash: self.hash(&bytes),
            bytes,
        }
    }

    pub(crate) fn tag(&self, fingerprint: &Fingerprint) -> Tag {
        Tag(self.hashing.tag(fingerprint.as_bytes()))
    }

    /// The stripe holding `hash`. The stripe is picked from the hash bits just below the top
    /// seven, which hashbrown uses for its control bytes, and far above the bits it uses for
    /// bucket positions, so stripes do not thin out either.
    pub(crate) fn lock(&self, hash: &KeyHash) -> MutexGuard<'_, Stripe> {
        self.stripes[self.stripe_of(hash)].lock()
    }

    /// The number of the stripe holding `hash`, below [`Index::stripe_count`].
    pub(crate) fn stripe_of(&self, hash: &KeyHash) -> usize {
        if self.shift == 64 {
            0
        } else {
            usize::try_from((hash.lo << 7) >> self.shift).expect("stripe index fits usize")
        }
    }

    pub(crate) fn stripe_count(&self) -> usize {
        self.stripes.len()
    }

    pub(crate) fn lock_stripe(&self, i: usize) -> MutexGuard<'_, Stripe> {
        self.stripes[i].lock()
    }

    pub(crate) fn stripes(&self) -> impl Iterator<Item = MutexGuard<'_, Stripe>> {
        self.stripes.iter().map(|s| s.lock())
    }

    /// Makes room for `records` entries in all, spread evenly, so an open does not rehash.
    pub(crate) fn reserve(&self, records: usize) {
        let each = records / self.stripes.len() + records / self.stripes.len() / 16 + 16;
        for mut stripe in self.stripes() {
            let len = stripe.len();
            stripe.reserve(each.saturating_sub(len));
        }
    }

    /// How many claims in progress and completed records the index holds: a scan of every
    /// stripe, for the figures an open reports.
    pub(crate) fn census(&self) -> (u64, u64) {
        let mut in_progress = 0u64;
        let mut total = 0u64;
        for stripe in self.stripes() {
            total += stripe.len() as u64;
            in_progress += stripe
                .values()
                .filter(|s| matches!(s.state(), SlotState::InProgress { .. }))
                .count() as u64;
        }
        (in_progress, total - in_progress)
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

    fn hashing() -> Hashing {
        Hashing::new(crate::file::hashing::SipKey::random())
    }

    fn in_progress() -> SlotState {
        SlotState::InProgress {
            lease_until: 7,
            orphan: false,
        }
    }

    #[test]
    fn keys_spread_over_stripes() {
        let index = Index::new(16, None, hashing());
        let tag = index.tag(&Fingerprint::of(b""));
        for i in 0..1600u32 {
            let key = index.key(i.to_le_bytes().to_vec().into_boxed_slice());
            index
                .lock(&key.hash)
                .insert(key.hash, Slot::new(1, tag, in_progress()));
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
        let index = Index::new(1, None, hashing());
        let key = index.key(Box::new([1, 2]));
        assert!(index.lock(&key.hash).get(&key.hash).is_none());
    }

    /// The memory figure in the module docs depends on this size.
    #[test]
    fn an_entry_is_40_bytes() {
        assert_eq!(std::mem::size_of::<(KeyHash, Slot)>(), 40);
    }

    #[test]
    fn a_slot_round_trips_every_state_and_keeps_its_fence() {
        let index = Index::new(1, None, hashing());
        let tag = index.tag(&Fingerprint::of(b"x"));
        let fence = FENCE_BITS;
        for state in [
            in_progress(),
            SlotState::InProgress {
                lease_until: u64::MAX,
                orphan: true,
            },
            SlotState::Completed {
                expires_at: 0,
                durable: false,
            },
            SlotState::Completed {
                expires_at: u64::MAX,
                durable: true,
            },
        ] {
            let mut slot = Slot::new(fence, tag, in_progress());
            slot.set_state(state);
            assert_eq!(slot.state(), state);
            assert_eq!(slot.fence(), fence);
            assert_eq!(slot.tag(), tag);
            assert_eq!(Slot::new(3, tag, state).state(), state);
        }
    }

    #[test]
    fn tags_and_hashes_tell_inputs_apart() {
        let index = Index::new(4, None, hashing());
        assert_ne!(
            index.tag(&Fingerprint::of(b"a")),
            index.tag(&Fingerprint::of(b"b"))
        );
        assert_eq!(
            index.tag(&Fingerprint::of(b"a")),
            index.tag(&Fingerprint::of(b"a"))
        );
        let (a, b) = (index.hash(b"tenant/a"), index.hash(b"tenant/b"));
        assert_ne!(a.lo, b.lo);
        assert_ne!(a.hi, b.hi);
        assert_ne!(a.lo, a.hi, "the two halves are independent hashes");
    }
}
