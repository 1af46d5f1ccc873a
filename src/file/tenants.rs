//! Live records per tenant, so that one tenant cannot fill the store
//! ([`crate::StoreBuilder::max_live_records_per_tenant`]).
//!
//! Kept only when the limit is set. A record counts from the claim that creates it until the
//! release, withdrawal, reap or purge that deletes it; a completion whose TTL ran out counts
//! until `purge_expired` deletes it. A claim that replaces a record of the same key (an expired
//! completion, a takeover of a stale claim) changes no count, so a tenant at its limit can
//! still retry, replay and take over its own keys. The counts are rebuilt from the file at open,
//! as the index is; a limit lowered below what a tenant already holds refuses its new keys
//! until it is below the limit again.
//!
//! The counts are striped by tenant, each stripe a map from the tenant's keyed 64-bit hash
//! (`hashing.rs`): the `heads` table keeps that hash, so an open counts without reading records,
//! and a client without the store's secret cannot choose tenants that collide. A claim takes its
//! key's index stripe, then its tenant's stripe, briefly; nothing takes them the other way round.

use crate::error::{Error, Result};
use crate::file::hashing::Hashing;
use crate::file::index::PassThrough;
use crate::model::scope::tenant_of;
use crate::sync::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::hash::BuildHasherDefault;

const STRIPES: usize = 16;

/// One stripe: live records by tenant hash (already keyed, so passed through).
type Counts = HashMap<u64, u64, BuildHasherDefault<PassThrough>>;

#[derive(Debug)]
pub(crate) struct TenantCounts {
    limit: u64,
    stripes: Box<[Mutex<Counts>]>,
    hashing: Hashing,
}

impl TenantCounts {
    pub(crate) fn new(limit: u64, hashing: Hashing) -> TenantCounts {
        TenantCounts {
            limit,
            stripes: (0..STRIPES).map(|_| Mutex::default()).collect(),
            hashing,
        }
    }

    fn stripe(&self, tenant: u64) -> MutexGuard<'_, Counts> {
        let i = usize::try_from((tenant >> 32) % STRIPES as u64).expect("below the stripe count");
        self.stripes[i].lock()
    }

    fn hash_of(&self, scoped: &[u8]) -> u64 {
        self.hashing.tenant(tenant_of(scoped))
    }

    /// Counts a new record of the tenant of `scoped` (an encoded scoped key).
    ///
    /// # Errors
    /// [`Error::TenantFull`] if the tenant already holds the limit; nothing is counted.
    pub(crate) fn admit(&self, scoped: &[u8]) -> Result<()> {
        let tenant = self.hash_of(scoped);
        let mut stripe = self.stripe(tenant);
        let live = stripe.get(&tenant).copied().unwrap_or(0);
        if live >= self.limit {
            return Err(Error::TenantFull {
                tenant: String::from_utf8_lossy(tenant_of(scoped)).into_owned(),
                limit: self.limit,
            });
        }
        stripe.insert(tenant, live + 1);
        Ok(())
    }

    /// Counts a record found in the file at open, whatever the limit, by its tenant's hash.
    pub(crate) fn loaded(&self, tenant: u64) {
        *self.stripe(tenant).entry(tenant).or_insert(0) += 1;
    }

    /// Uncounts a deleted record.
    pub(crate) fn removed(&self, scoped: &[u8]) {
        let tenant = self.hash_of(scoped);
        let mut stripe = self.stripe(tenant);
        if let Some(live) = stripe.get_mut(&tenant) {
            *live = live.saturating_sub(1);
            if *live == 0 {
                stripe.remove(&tenant);
            }
        }
    }

    /// The records `tenant` holds now.
    #[cfg(test)]
    pub(crate) fn live(&self, tenant: &str) -> u64 {
        let tenant = self.hashing.tenant(tenant.as_bytes());
        self.stripe(tenant).get(&tenant).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::scope::{scoped_key, Scope};

    fn hashing() -> Hashing {
        Hashing::new(crate::file::hashing::SipKey::random())
    }

    fn key(tenant: &str, key: &str) -> Box<[u8]> {
        scoped_key(&Scope::new(tenant, "POST /pay"), key).unwrap()
    }

    #[test]
    fn a_tenant_at_its_limit_is_refused_and_others_are_not() {
        let counts = TenantCounts::new(2, hashing());
        counts.admit(&key("a", "1")).unwrap();
        counts.admit(&key("a", "2")).unwrap();
        match counts.admit(&key("a", "3")) {
            Err(Error::TenantFull { tenant, limit: 2 }) => assert_eq!(tenant, "a"),
            other => panic!("{other:?}"),
        }
        assert_eq!(counts.live("a"), 2, "a refusal counts nothing");
        counts.admit(&key("b", "1")).unwrap();
        counts.removed(&key("a", "1"));
        counts.admit(&key("a", "3")).unwrap();
        assert_eq!(counts.live("a"), 2);
    }

    #[test]
    fn loaded_records_count_past_the_limit_and_removals_never_go_below_zero() {
        let hashing = hashing();
        let counts = TenantCounts::new(1, hashing);
        counts.loaded(hashing.tenant(b"a"));
        counts.loaded(hashing.tenant(b"a"));
        assert!(counts.admit(&key("a", "3")).is_err());
        for k in ["1", "2", "2"] {
            counts.removed(&key("a", k));
        }
        assert_eq!(counts.live("a"), 0);
        counts.admit(&key("a", "3")).unwrap();
    }
}
