//! The workload every system runs: deterministic keys, request bodies and payloads.

use idemdb::Fingerprint;
use std::time::{SystemTime, UNIX_EPOCH};

/// Tenants the keys are spread over (`tenant_0` .. `tenant_3`).
pub const TENANTS: usize = 4;
/// The one endpoint every request goes to.
pub const ENDPOINT: &str = "POST /v1/payments";
/// Length of every idempotency key, in bytes.
pub const KEY_LEN: usize = 40;
/// Bytes of metadata the peers store next to the 32-byte digest (100 bytes in all).
pub const META_EXTRA: usize = 68;
/// What a peer stores per claim: digest and metadata.
pub const META_LEN: usize = 32 + META_EXTRA;
/// How long a record lives (24 h), in milliseconds, as idemdb's default TTL.
pub const TTL_MS: u64 = 86_400_000;
/// The status every completed request stores.
pub const STATUS: u16 = 201;

/// The seeded generator every part of idemdb's test and benchmark code draws from.
pub use idemdb::simulation::SplitMix64 as Rng;

/// One request: its scope, its key and its body (hashed into the fingerprint by each system).
#[derive(Debug, Clone)]
pub struct Request {
    /// Index into [`TENANTS`].
    pub tenant: usize,
    /// The idempotency key: [`KEY_LEN`] visible-ASCII bytes.
    pub key: String,
    /// The request body the fingerprint is taken of.
    pub body: Vec<u8>,
}

impl Request {
    /// The tenant's name.
    pub fn tenant_name(&self) -> &'static str {
        TENANT_NAMES[self.tenant]
    }

    /// `tenant:endpoint:key`, how the key-value peers (Redis, naive redb) name the record.
    pub fn flat_key(&self) -> String {
        format!("{}:{ENDPOINT}:{}", self.tenant_name(), self.key)
    }

    /// The SHA-256 digest of the body (the same function idemdb's fingerprint is).
    pub fn digest(&self) -> [u8; 32] {
        *Fingerprint::of(&self.body).as_bytes()
    }
}

const TENANT_NAMES: [&str; TENANTS] = ["tenant_0", "tenant_1", "tenant_2", "tenant_3"];

/// Draws requests from a seeded stream.
#[derive(Debug, Clone)]
pub struct Requests {
    rng: Rng,
}

impl Requests {
    /// The stream for one caller of one cell (or one preload), fixed by its seed.
    pub fn new(rng: Rng) -> Requests {
        Requests { rng }
    }

    /// The next request: a fresh random key in a random tenant.
    pub fn next_request(&mut self) -> Request {
        let tenant = self.rng.index(TENANTS);
        let key = self.rng.ascii(KEY_LEN);
        let amount = 100 + self.rng.below(1_000_000);
        let customer = self.rng.below(100_000);
        let body = format!(r#"{{"amount":{amount},"currency":"usd","customer":"cus_{customer}"}}"#)
            .into_bytes();
        Request { tenant, key, body }
    }
}

/// What is shared by every request: the response body.
#[derive(Debug, Clone)]
pub struct Payload {
    /// The response body every completion stores.
    pub response_body: Vec<u8>,
}

impl Payload {
    /// A response body of `response_bytes` bytes, fixed by `seed`.
    pub fn new(seed: u64, response_bytes: usize) -> Payload {
        Payload {
            response_body: Rng::derive(seed, 0xb0d7, 0)
                .ascii(response_bytes)
                .into_bytes(),
        }
    }

    /// The peers' claim value: the digest, then 68 bytes of metadata (a state byte, a fence,
    /// the lease deadline and the creation time, then padding), [`META_LEN`] bytes in all.
    pub fn meta(&self, req: &Request, fence: u64) -> Vec<u8> {
        let now = now_ms();
        let mut meta = Vec::with_capacity(META_LEN);
        meta.extend_from_slice(&req.digest());
        meta.push(b'P');
        meta.extend_from_slice(&fence.to_le_bytes());
        meta.extend_from_slice(&(now + 60_000).to_le_bytes());
        meta.extend_from_slice(&now.to_le_bytes());
        meta.resize(META_LEN, b'.');
        meta
    }

    /// The stored response: the status (2 bytes, big-endian), then the body.
    pub fn response(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(2 + self.response_body.len());
        out.extend_from_slice(&STATUS.to_be_bytes());
        out.extend_from_slice(&self.response_body);
        out
    }

    /// A key-value peer's completed value: the metadata (state byte `C`), then the response.
    pub fn completed_value(&self, req: &Request, fence: u64) -> Vec<u8> {
        let mut value = self.meta(req, fence);
        value[32] = b'C';
        value.extend_from_slice(&self.response());
        value
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_deterministic_and_keys_visible_ascii() {
        let a = Requests::new(Rng::derive(7, 1, 2)).next_request();
        let b = Requests::new(Rng::derive(7, 1, 2)).next_request();
        let c = Requests::new(Rng::derive(7, 1, 3)).next_request();
        assert_eq!(a.key, b.key);
        assert_ne!(a.key, c.key);
        assert_eq!(a.key.len(), KEY_LEN);
        assert!(a.key.bytes().all(|b| b.is_ascii_graphic()));
    }

    #[test]
    fn meta_is_one_hundred_bytes() {
        let p = Payload::new(1, 256);
        let req = Requests::new(Rng::new(3)).next_request();
        assert_eq!(p.meta(&req, 9).len(), 100);
        assert_eq!(p.completed_value(&req, 9).len(), 100 + 2 + 256);
    }
}
