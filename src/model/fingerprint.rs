//! Request fingerprints: what makes a retry "the same request".

use sha2::{Digest, Sha256};
use std::fmt;

/// The SHA-256 digest of a request, stored with its claim. A later claim of the same key with
/// a different fingerprint is a [`crate::Claim::Mismatch`] (HTTP 422): a reused key with a
/// different request is a client bug, and silently replaying the first response would hide it.
///
/// What goes into the fingerprint is the caller's choice: typically the method, the path and
/// the canonicalised body. Hash the parts with [`Fingerprint::builder`] when there are several,
/// so that their boundaries cannot be confused.
///
/// ```
/// use idemdb::Fingerprint;
/// let a = Fingerprint::of(br#"{"amount":5000}"#);
/// assert_eq!(a, Fingerprint::of(br#"{"amount":5000}"#));
/// assert_ne!(a, Fingerprint::of(br#"{"amount":500000}"#));
/// let parts = Fingerprint::builder().part(b"POST").part(b"/v1/payments").finish();
/// assert_ne!(parts, Fingerprint::builder().part(b"POST/").part(b"v1/payments").finish());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The SHA-256 digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Fingerprint {
        Fingerprint(Sha256::digest(bytes).into())
    }

    /// A fingerprint from a digest computed elsewhere (for example by a client).
    pub const fn from_bytes(bytes: [u8; 32]) -> Fingerprint {
        Fingerprint(bytes)
    }

    /// The 32 digest bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Hashes several parts, each prefixed with its length, into one fingerprint.
    pub fn builder() -> FingerprintBuilder {
        FingerprintBuilder(Sha256::new())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint(")?;
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "…)")
    }
}

/// Builds a [`Fingerprint`] from several length-prefixed parts.
#[derive(Clone)]
pub struct FingerprintBuilder(Sha256);

impl FingerprintBuilder {
    /// Adds one part: its length as a little-endian `u64`, then its bytes.
    #[must_use]
    pub fn part(mut self, bytes: &[u8]) -> Self {
        self.0.update((bytes.len() as u64).to_le_bytes());
        self.0.update(bytes);
        self
    }

    /// The fingerprint of every part added.
    pub fn finish(self) -> Fingerprint {
        Fingerprint(self.0.finalize().into())
    }
}

impl fmt::Debug for FingerprintBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FingerprintBuilder")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_sha256() {
        // SHA-256("abc") from FIPS 180-2, appendix B.1.
        let expect = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        let got: String = Fingerprint::of(b"abc")
            .as_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(got, expect);
    }

    #[test]
    fn parts_are_length_prefixed() {
        let a = Fingerprint::builder().part(b"ab").part(b"c").finish();
        let b = Fingerprint::builder().part(b"a").part(b"bc").finish();
        assert_ne!(a, b);
    }
}
