//! A bounded cache of completed responses, by fence, that replays read through: a retry storm on
//! one key reads its record from the file once, not once per retry.
//!
//! A fence's completed record never changes (a completion is final, and a fence is never reused),
//! so an entry can only go out of date by its record being deleted, after which the index no
//! longer points at that fence and nothing looks it up. Entries are evicted oldest first once
//! their bytes pass the budget. Each entry keeps its scoped key and full fingerprint, so a hit
//! is checked exactly as a read from the file is.

use crate::fingerprint::Fingerprint;
use crate::response::Response;
use crate::sync::{Arc, Mutex};
use std::collections::{HashMap, VecDeque};

const SHARDS: usize = 16;
/// Bookkeeping per entry besides its bytes (map slot, queue slot, `Arc`, allocations).
const ENTRY_OVERHEAD: usize = 128;

/// A completed record as a replay needs it.
#[derive(Debug)]
pub(crate) struct Cached {
    pub(crate) key: Box<[u8]>,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) response: Response,
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

#[derive(Debug, Default)]
struct Shard {
    map: HashMap<u64, Arc<Cached>>,
    order: VecDeque<u64>,
    bytes: usize,
}

#[derive(Debug)]
pub(crate) struct ReplayCache {
    shards: Box<[Mutex<Shard>]>,
    budget: usize,
}

impl ReplayCache {
    /// A cache of at most about `bytes`; 0 caches nothing.
    pub(crate) fn new(bytes: usize) -> ReplayCache {
        ReplayCache {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            budget: bytes / SHARDS,
        }
    }

    fn shard(&self, fence: u64) -> &Mutex<Shard> {
        // Fences are consecutive, so their low bits spread evenly.
        &self.shards[usize::try_from(fence % SHARDS as u64).expect("below SHARDS")]
    }

    pub(crate) fn get(&self, fence: u64) -> Option<Arc<Cached>> {
        if self.budget == 0 {
            return None;
        }
        self.shard(fence).lock().map.get(&fence).cloned()
    }

    /// Caches `entry` unless it would take more than a quarter of its shard's budget.
    pub(crate) fn insert(&self, fence: u64, entry: Cached) {
        let cost = entry.cost();
        if cost > self.budget / 4 {
            return;
        }
        let mut shard = self.shard(fence).lock();
        if shard.map.insert(fence, Arc::new(entry)).is_some() {
            return; // a racing replay cached it first; its cost is already counted
        }
        shard.order.push_back(fence);
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
        }
    }

    #[test]
    fn hits_what_it_holds_and_stays_within_its_budget() {
        let cache = ReplayCache::new(16 * 4096);
        cache.insert(1, entry(10));
        assert_eq!(cache.get(1).unwrap().response.body, vec![7; 10]);
        assert!(cache.get(2).is_none());
        // Fill one shard (fences 1, 17, 33, ... share it) well past its 4096 bytes.
        for i in 0..100 {
            cache.insert(1 + 16 * i, entry(200));
        }
        let shard = cache.shard(1).lock();
        assert!(shard.bytes <= 4096, "{}", shard.bytes);
        assert_eq!(shard.map.len(), shard.order.len());
        assert!(shard.map.contains_key(&(1 + 16 * 99)), "the newest stays");
        assert!(!shard.map.contains_key(&17), "the oldest went");
    }

    #[test]
    fn large_responses_and_a_zero_budget_are_not_cached() {
        let cache = ReplayCache::new(16 * 4096);
        cache.insert(3, entry(2000));
        assert!(cache.get(3).is_none());
        let off = ReplayCache::new(0);
        off.insert(3, entry(1));
        assert!(off.get(3).is_none());
    }
}
