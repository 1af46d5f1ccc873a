//! The store's keyed hashes: of scoped keys (the index's identity of a key), of fingerprints
//! (the index's tag) and of tenants (the per-tenant counts). All are SipHash-1-3 under keys
//! derived from one random 128-bit secret that the store file keeps in `meta`, so the hashes
//! the `heads` table holds stay valid across restarts, and an open rebuilds the index from
//! those 48-byte heads without reading a single record (`heads.rs`).
//!
//! Clients choose keys, fingerprints and tenants; without the secret they cannot choose ones
//! that collide, nor target a stripe. The secret is as private as the records beside it.

use std::hash::{BuildHasher, Hasher};

/// A 128-bit SipHash key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SipKey {
    pub(crate) k0: u64,
    pub(crate) k1: u64,
}

impl SipKey {
    /// A fresh random key (std's randomly keyed hasher over the time and the process id).
    pub(crate) fn random() -> SipKey {
        let seed = || {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            h.write_u128(now);
            h.write_u32(std::process::id());
            h.finish()
        };
        SipKey {
            k0: seed(),
            k1: seed(),
        }
    }
}

/// The keys of every hash a store takes, derived from its secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hashing {
    secret: SipKey,
    key_lo: SipKey,
    key_hi: SipKey,
    tag: SipKey,
    tenant: SipKey,
}

impl Hashing {
    pub(crate) fn new(secret: SipKey) -> Hashing {
        let derive = |purpose: u64| SipKey {
            k0: siphash13(
                secret,
                &[purpose.to_le_bytes(), 0u64.to_le_bytes()].concat(),
            ),
            k1: siphash13(
                secret,
                &[purpose.to_le_bytes(), 1u64.to_le_bytes()].concat(),
            ),
        };
        Hashing {
            secret,
            key_lo: derive(1),
            key_hi: derive(2),
            tag: derive(3),
            tenant: derive(4),
        }
    }

    pub(crate) fn secret(&self) -> SipKey {
        self.secret
    }

    /// Two independent 64-bit hashes of a scoped key.
    pub(crate) fn key(&self, bytes: &[u8]) -> (u64, u64) {
        (siphash13(self.key_lo, bytes), siphash13(self.key_hi, bytes))
    }

    pub(crate) fn tag(&self, fingerprint: &[u8; 32]) -> u64 {
        siphash13(self.tag, fingerprint)
    }

    pub(crate) fn tenant(&self, tenant: &[u8]) -> u64 {
        siphash13(self.tenant, tenant)
    }
}

/// SipHash-1-3 (one compression round, three finalisation rounds), as std's `HashMap` uses.
pub(crate) fn siphash13(key: SipKey, bytes: &[u8]) -> u64 {
    siphash::<1, 3>(key, bytes)
}

/// SipHash-c-d over `bytes` (Aumasson and Bernstein, 2012).
fn siphash<const C: usize, const D: usize>(key: SipKey, bytes: &[u8]) -> u64 {
    let mut v = [
        key.k0 ^ 0x736f_6d65_7073_6575,
        key.k1 ^ 0x646f_7261_6e64_6f6d,
        key.k0 ^ 0x6c79_6765_6e65_7261,
        key.k1 ^ 0x7465_6462_7974_6573,
    ];
    let compress = |v: &mut [u64; 4], m: u64, rounds: usize| {
        v[3] ^= m;
        for _ in 0..rounds {
            sip_round(v);
        }
        v[0] ^= m;
    };
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        let m = u64::from_le_bytes(word.try_into().expect("eight bytes"));
        compress(&mut v, m, C);
    }
    // The length's low byte goes in the last word's top byte, as the reference does.
    let mut last = (bytes.len() as u64 & 0xff) << 56;
    for (i, b) in words.remainder().iter().enumerate() {
        last |= u64::from(*b) << (8 * i);
    }
    compress(&mut v, last, C);
    v[2] ^= 0xff;
    for _ in 0..D {
        sip_round(&mut v);
    }
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

fn sip_round(v: &mut [u64; 4]) {
    v[0] = v[0].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(13) ^ v[0];
    v[0] = v[0].rotate_left(32);
    v[2] = v[2].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(16) ^ v[2];
    v[0] = v[0].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(21) ^ v[0];
    v[2] = v[2].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(17) ^ v[2];
    v[2] = v[2].rotate_left(32);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference_key() -> SipKey {
        let b: Vec<u8> = (0..16).collect();
        SipKey {
            k0: u64::from_le_bytes(b[..8].try_into().unwrap()),
            k1: u64::from_le_bytes(b[8..].try_into().unwrap()),
        }
    }

    /// The SipHash paper's test vector (appendix A): SipHash-2-4, key 00..0f, message 00..0e.
    /// The rounds are the same code for 1-3, so this pins the implementation.
    #[test]
    fn siphash24_matches_the_papers_test_vector() {
        let message: Vec<u8> = (0..15).collect();
        assert_eq!(
            siphash::<2, 4>(reference_key(), &message),
            0xa129_ca61_49be_45e5
        );
    }

    /// The reference implementation's first and last 64-bit vectors (messages 00, 00..3e).
    #[test]
    fn siphash24_matches_the_reference_vectors_at_both_ends() {
        assert_eq!(siphash::<2, 4>(reference_key(), &[]), 0x726f_db47_dd0e_0e31);
        let message: Vec<u8> = (0..63).collect();
        assert_eq!(
            siphash::<2, 4>(reference_key(), &message),
            0x958a_324c_eb06_4572
        );
    }

    #[test]
    fn a_secret_gives_the_same_hashes_every_time_and_another_secret_others() {
        let secret = SipKey::random();
        let (a, b) = (Hashing::new(secret), Hashing::new(secret));
        assert_eq!(a.key(b"t/e/k"), b.key(b"t/e/k"));
        assert_eq!(a.tag(&[7; 32]), b.tag(&[7; 32]));
        assert_eq!(a.tenant(b"t"), b.tenant(b"t"));
        let other = Hashing::new(SipKey::random());
        assert_ne!(a.key(b"t/e/k"), other.key(b"t/e/k"));
        let (lo, hi) = a.key(b"t/e/k");
        assert_ne!(lo, hi, "the two halves are independent hashes");
        assert_ne!(a.tenant(b"t"), a.tenant(b"u"));
    }
}
