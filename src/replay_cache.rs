//! A bounded cache of completed responses that replays read through: a retry storm on one key
//! reads its record once, not once per retry. The file engine keys it by fence, the PostgreSQL
//! engine by scoped key.
//!
//! A completed record never changes until it expires (a completion is final, and a fence is
//! never reused). On the file, an entry can only go out of date by its record being deleted,
//! after which the index no longer points at that fence and nothing looks it up. On PostgreSQL
//! an entry is served only while its `expires_at` is well ahead of the database's time (see
//! `postgres/mod.rs`). Entries are evicted oldest first once their bytes pass the budget. Each
//! entry keeps its scoped key and full fingerprint, so a hit is checked exactly as a read is.

use crate::model::fingerprint::Fingerprint;
use crate::model::response::Response;
use crate::sync::{Arc, Mutex};
use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

const SHARDS: usize = 16;
/// Bookkeeping per entry besides its bytes (map slot, queue slot, `Arc`, allocations).
const ENTRY_OVERHEAD: usize = 128;

/// A completed record as a replay needs it.
#[derive(Debug)]
pub(crate) struct Cached {
    pub(crate) key: Box<[u8]>,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) response: Response,
    /// When the record expires (milliseconds since the epoch): `u64::MAX` on the file, whose
    /// index decides expiry before the cache is asked.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) expires_at: u64,
}

/// What a cache is keyed by, and how a key picks its shard.
pub(crate) trait CacheKey: Hash + Eq + Clone {
    fn shard(&self, state: &RandomState) -> usize;
}

impl CacheKey for u64 {
    fn shard(&self, _: &RandomState) -> usize {
        // Fences are consecutive, so their low bits spread evenly.
        usize::try_from(*self % SHARDS as u64).expect("below SHARDS")
    }
}

#[cfg(feature = "postgres")]
impl CacheKey for Box<[u8]> {
    fn shard(&self, state: &RandomState) -> usize {
        bytes_shard(self, state)
    }
}

#[cfg(feature = "postgres")]
/// The shard of a scoped key, keyed: clients choose keys, and must not be able to crowd one
/// shard. A `Box<[u8]>` hashes as its bytes, so a lookup by `&[u8]` finds the same shard.
fn bytes_shard(bytes: &[u8], state: &RandomState) -> usize {
    usize::try_from(std::hash::BuildHasher::hash_one(state, bytes) % SHARDS as u64)
        .expect("below SHARDS")
}

#[cfg(feature = "postgres")]
impl ReplayCache<Box<[u8]>> {
    /// [`ReplayCache::get`] by the key's bytes, without allocating a key (a claim asks this
    /// before anything else).
    pub(crate) fn get_bytes(&self, key: &[u8]) -> Option<Arc<Cached>> {
        if self.budget == 0 {
            return None;
        }
        self.shards[bytes_shard(key, &self.state)]
            .lock()
            .map
            .get(key)
            .cloned()
    }
}

impl Cached {
    fn cost(&self) -> usize {
        ENTRY_OVERHEAD
            + self.key.len()
            + self.response.body.len()
            + self
                .response
                .headers
                .iter()
                .map(|(n, v)| n.len() + v.len() + 48)
                .sum::<usize>()
    }
}

#[derive(Debug)]
struct Shard<K> {
    map: HashMap<K, Arc<Cached>>,
    order: VecDeque<K>,
    bytes: usize,
}

impl<K> Default for Shard<K> {
    fn default() -> Self {
        Shard {
            map: HashMap::new(),
            order: VecDeque::new(),
            bytes: 0,
        }
    }
}

#[derive(Debug)]
pub(crate) struct ReplayCache<K = u64> {
    shards: Box<[Mutex<Shard<K>>]>,
    budget: usize,
    state: RandomState,
}

impl<K: CacheKey> ReplayCache<K> {
    /// A cache of at most about `bytes`; 0 caches nothing.
    pub(crate) fn new(bytes: usize) -> ReplayCache<K> {
        ReplayCache {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            budget: bytes / SHARDS,
            state: RandomState::new(),
        }
    }

    fn shard(&self, key: &K) -> &Mutex<Shard<K>> {
        &self.shards[key.shard(&self.state)]
    }

    pub(crate) fn get(&self, key: &K) -> Option<Arc<Cached>> {
        if self.budget == 0 {
            return None;
        }
        self.shard(key).lock().map.get(key).cloned()
    }

    /// Caches `entry` unless it would take more than a quarter of its shard's budget.
    pub(crate) fn insert(&self, key: K, entry: Cached) {
        let cost = entry.cost();
        if cost > self.budget / 4 {
            return;
        }
        let mut shard = self.shard(&key).lock();
        if shard.map.insert(key.clone(), Arc::new(entry)).is_some() {
            return; // a racing replay cached it first; its cost is already counted
        }
        shard.order.push_back(key);
        shard.bytes += cost;
        while shard.bytes > self.budget {
            let Some(old) = shard.order.pop_front() else {
                break;
            };
            if let Some(gone) = shard.map.remove(&old) {
                shard.bytes -= gone.cost();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(body: usize) -> Cached {
        Cached {
            key: Box::new(*b"key"),
            fingerprint: Fingerprint::of(b"f"),
            response: Response::new(200, vec![7; body]),
            expires_at: u64::MAX,
        }
    }

    #[test]
    fn hits_what_it_holds_and_stays_within_its_budget() {
        let cache = ReplayCache::<u64>::new(16 * 4096);
        cache.insert(1, entry(10));
        assert_eq!(cache.get(&1).unwrap().response.body, vec![7; 10]);
        assert!(cache.get(&2).is_none());
        // Fill one shard (fences 1, 17, 33, ... share it) well past its 4096 bytes.
        for i in 0..100 {
            cache.insert(1 + 16 * i, entry(200));
        }
        let shard = cache.shard(&1).lock();
        assert!(shard.bytes <= 4096, "{}", shard.bytes);
        assert_eq!(shard.map.len(), shard.order.len());
        assert!(shard.map.contains_key(&(1 + 16 * 99)), "the newest stays");
        assert!(!shard.map.contains_key(&17), "the oldest went");
    }

    /// The PostgreSQL engine looks keys up by their bytes; a lookup that hashed the slice
    /// differently from the stored `Box` would miss every time.
    #[cfg(feature = "postgres")]
    #[test]
    fn a_scoped_key_cache_finds_by_bytes_what_was_stored_by_box() {
        let cache = ReplayCache::<Box<[u8]>>::new(16 * 4096);
        for i in 0..64u8 {
            cache.insert(Box::from(&[i, 1, 2][..]), entry(10));
        }
        for i in 0..64u8 {
            assert!(cache.get_bytes(&[i, 1, 2]).is_some(), "key {i}");
        }
        assert!(cache.get_bytes(b"absent").is_none());
        assert!(ReplayCache::<Box<[u8]>>::new(0)
            .get_bytes(&[0, 1, 2])
            .is_none());
    }

    #[test]
    fn large_responses_and_a_zero_budget_are_not_cached() {
        let cache = ReplayCache::<u64>::new(16 * 4096);
        cache.insert(3, entry(2000));
        assert!(cache.get(&3).is_none());
        let off = ReplayCache::<u64>::new(0);
        off.insert(3, entry(1));
        assert!(off.get(&3).is_none());
    }
}
