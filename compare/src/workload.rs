//! The workload every system runs: deterministic keys, request bodies and payloads.

use idemdb::simulation::charge;
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
    /// The response body its completion stores, where the workload draws one per request
    /// (`charge`); `None`: the run's fixed body ([`Payload::response_body`]).
    pub response_body: Option<Vec<u8>>,
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
    /// Draws the charges, apart from `rng`, so that a stream's keys are the same whichever
    /// workload draws them.
    charges: Rng,
}

impl Requests {
    /// The stream for one caller of one cell (or one preload), fixed by its seed.
    pub fn new(rng: Rng) -> Requests {
        let charges = Rng::derive(rng.clone().next_u64(), 0xc4a6, 0);
        Requests { rng, charges }
    }

    /// The next request: a fresh random key in a random tenant.
    pub fn next_request(&mut self) -> Request {
        let tenant = self.rng.index(TENANTS);
        let key = self.rng.ascii(KEY_LEN);
        let amount = 100 + self.rng.below(1_000_000);
        let customer = self.rng.below(100_000);
        let body = format!(r#"{{"amount":{amount},"currency":"usd","customer":"cus_{customer}"}}"#)
            .into_bytes();
        Request {
            tenant,
            key,
            body,
            response_body: None,
        }
    }

    /// The next request, with a charge of 1-4 KB of JSON of its own as its response
    /// (`idemdb::simulation::charge`).
    pub fn next_request_with_charge(&mut self) -> Request {
        let mut req = self.next_request();
        req.response_body = Some(charge(&mut self.charges).into_bytes());
        req
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

    /// The body `req`'s completion stores: its own, or the run's fixed one.
    pub fn body<'a>(&'a self, req: &'a Request) -> &'a [u8] {
        req.response_body.as_deref().unwrap_or(&self.response_body)
    }

    /// The stored response of `req`: the status (2 bytes, big-endian), then its body.
    pub fn response(&self, req: &Request) -> Vec<u8> {
        let body = self.body(req);
        let mut out = Vec::with_capacity(2 + body.len());
        out.extend_from_slice(&STATUS.to_be_bytes());
        out.extend_from_slice(body);
        out
    }

    /// The stored response of a preloaded record: the status, then the fixed body.
    pub fn fixed_response(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(2 + self.response_body.len());
        out.extend_from_slice(&STATUS.to_be_bytes());
        out.extend_from_slice(&self.response_body);
        out
    }

    /// A key-value peer's completed value: the metadata (state byte `C`), then the response.
    pub fn completed_value(&self, req: &Request, fence: u64) -> Vec<u8> {
        let mut value = self.meta(req, fence);
        value[32] = b'C';
        value.extend_from_slice(&self.response(req));
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
    fn charges_are_json_of_one_to_four_kilobytes_fixed_by_the_stream() {
        let draw = |index| {
            let mut requests = Requests::new(Rng::derive(7, 1, index));
            (0..50)
                .map(|_| requests.next_request_with_charge())
                .collect::<Vec<_>>()
        };
        let (a, b, c) = (draw(2), draw(2), draw(3));
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.key, y.key);
            assert_eq!(x.response_body, y.response_body);
        }
        assert_ne!(a[0].response_body, c[0].response_body);
        let mut sizes = Vec::new();
        for req in &a {
            let body = req.response_body.as_deref().expect("a charge");
            sizes.push(body.len());
            assert!((1024..=4096).contains(&body.len()), "{} bytes", body.len());
            let charge: serde_json::Value = serde_json::from_slice(body).expect("valid JSON");
            assert_eq!(charge["object"], "charge");
            assert!(charge["id"].as_str().unwrap().starts_with("ch_"));
            assert!(charge["amount"].as_u64().unwrap() >= 50);
            assert!(charge["created"].as_u64().unwrap() >= 1_700_000_000);
            assert_eq!(charge["payment_method_details"]["type"], "card");
            assert!(charge["payment_method_details"]["card"]["last4"].is_string());
            assert!(charge["metadata"].is_object());
            assert_eq!(charge["refunds"]["object"], "list");
        }
        assert!(sizes.iter().any(|&n| n < 2048) && sizes.iter().any(|&n| n > 3072));
        // The charge's body is the one stored; the keys are those of the fixed workload.
        let p = Payload::new(1, 256);
        assert_eq!(p.body(&a[0]), a[0].response_body.as_deref().unwrap());
        let plain = Requests::new(Rng::derive(7, 1, 2)).next_request();
        assert_eq!(plain.key, a[0].key);
        assert_eq!(p.body(&plain), p.response_body.as_slice());
        assert_eq!(
            p.response(&a[0]).len(),
            2 + a[0].response_body.as_ref().unwrap().len()
        );
    }

    #[test]
    fn meta_is_one_hundred_bytes() {
        let p = Payload::new(1, 256);
        let req = Requests::new(Rng::new(3)).next_request();
        assert_eq!(p.meta(&req, 9).len(), 100);
        assert_eq!(p.completed_value(&req, 9).len(), 100 + 2 + 256);
    }
}
