//! A store counted: records by tenant and status, the bytes of the stored bodies, the highest
//! fence, the oldest claim not finished ([`crate::Store::census`]).

use crate::model::claim::EntryState;
use crate::model::listing::{ListedRecord, RecordStatus};
use crate::model::scope::Scope;
use std::collections::BTreeMap;
use std::time::SystemTime;

/// What a store holds, counted ([`crate::Store::census`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Census {
    /// Records of each tenant, by status in [`RecordStatus::ALL`]'s order.
    pub by_tenant: BTreeMap<String, [u64; 5]>,
    /// The bytes of the stored response bodies (completed records, expired ones included).
    pub response_bytes: u64,
    /// The highest fence any record holds (0 for none).
    pub highest_fence: u64,
    /// The claim not finished that was made first.
    pub oldest_claim: Option<OldestClaim>,
}

/// The claim not finished that was made first.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OldestClaim {
    /// Its scope.
    pub scope: Scope,
    /// Its key.
    pub key: String,
    /// Its fence.
    pub fence: u64,
    /// When it was claimed.
    pub claimed_at: SystemTime,
}

impl Census {
    /// Records by status, over every tenant, in [`RecordStatus::ALL`]'s order.
    pub fn by_status(&self) -> [u64; 5] {
        let mut total = [0; 5];
        for counts in self.by_tenant.values() {
            for (t, n) in total.iter_mut().zip(counts) {
                *t += n;
            }
        }
        total
    }

    /// Records in all.
    pub fn records(&self) -> u64 {
        self.by_status().iter().sum()
    }

    /// Counts `n` records of `tenant` with `status`.
    pub(crate) fn count(&mut self, tenant: &str, status: RecordStatus, n: u64) {
        let at = RecordStatus::ALL
            .iter()
            .position(|s| *s == status)
            .unwrap_or(0);
        match self.by_tenant.get_mut(tenant) {
            Some(counts) => counts[at] += n,
            None => {
                let mut counts = [0; 5];
                counts[at] = n;
                self.by_tenant.insert(tenant.to_owned(), counts);
            }
        }
    }

    /// Counts one record as a scan hands it over.
    pub(crate) fn add(&mut self, r: &ListedRecord) {
        self.count(r.scope.tenant(), r.status, 1);
        self.highest_fence = self.highest_fence.max(r.entry.fence);
        if let EntryState::Completed { response, .. } = &r.entry.state {
            self.response_bytes += u64::try_from(response.body().len()).unwrap_or(u64::MAX);
        }
        let older = self
            .oldest_claim
            .as_ref()
            .is_none_or(|o| r.entry.claimed_at < o.claimed_at);
        if r.status.is_claim() && older {
            self.oldest_claim = Some(OldestClaim {
                scope: r.scope.clone(),
                key: r.key.clone(),
                fence: r.entry.fence,
                claimed_at: r.entry.claimed_at,
            });
        }
    }
}
