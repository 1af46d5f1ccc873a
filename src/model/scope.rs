//! Scopes, key validation, and the unambiguous encoding of (tenant, endpoint, key) into the
//! bytes that name a record on disk and in the index.

use crate::error::{Error, InputProblem, Result};

/// The largest tenant, in bytes.
pub const MAX_TENANT_LEN: usize = 255;
/// The largest endpoint, in bytes.
pub const MAX_ENDPOINT_LEN: usize = 1024;
/// The largest idempotency key, in bytes.
pub const MAX_KEY_LEN: usize = 255;

/// The caller and operation an idempotency key belongs to: `(tenant, endpoint)`.
///
/// Two requests share a record only when tenant, endpoint and key are all equal, so one tenant
/// can never receive another's stored response, whatever keys clients choose. The encoding is
/// length-prefixed: `("ab", "c")` and `("a", "bc")` are different scopes.
///
/// `new` never fails; the tenant (1..=255 bytes) and endpoint (1..=1024 bytes of UTF-8) are
/// checked by every operation that takes the scope, which then returns
/// [`Error::InvalidScope`]. Use [`Scope::validate`] to check early.
///
/// ```
/// let scope = idemdb::Scope::new("tenant_42", "POST /v1/payments");
/// assert_eq!(scope.tenant(), "tenant_42");
/// assert!(scope.validate().is_ok());
/// assert!(idemdb::Scope::new("", "POST /x").validate().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Scope {
    tenant: Box<str>,
    endpoint: Box<str>,
}

impl Scope {
    /// A scope for `tenant` (an account, API key id or agent id) and `endpoint` (for HTTP, the
    /// method and route, such as `"POST /v1/payments"`).
    pub fn new(tenant: impl Into<String>, endpoint: impl Into<String>) -> Scope {
        Scope {
            tenant: tenant.into().into_boxed_str(),
            endpoint: endpoint.into().into_boxed_str(),
        }
    }

    /// The tenant.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// The endpoint.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Checks the tenant and endpoint bounds.
    ///
    /// # Errors
    /// [`Error::InvalidScope`] naming the part that is empty or too long.
    pub fn validate(&self) -> Result<()> {
        check_len("tenant", self.tenant.len(), MAX_TENANT_LEN)?;
        check_len("endpoint", self.endpoint.len(), MAX_ENDPOINT_LEN)
    }
}

fn check_len(part: &'static str, len: usize, max: usize) -> Result<()> {
    let reason = if len == 0 {
        InputProblem::Empty
    } else if len > max {
        InputProblem::TooLong { len, max }
    } else {
        return Ok(());
    };
    Err(Error::InvalidScope { part, reason })
}

/// Checks an idempotency key: 1..=255 bytes, each visible ASCII (0x21..=0x7E).
///
/// # Errors
/// [`Error::InvalidKey`] saying what is wrong.
pub fn validate_key(key: &str) -> Result<()> {
    let bytes = key.as_bytes();
    let reason = if bytes.is_empty() {
        InputProblem::Empty
    } else if bytes.len() > MAX_KEY_LEN {
        InputProblem::TooLong {
            len: bytes.len(),
            max: MAX_KEY_LEN,
        }
    } else if let Some(at) = bytes.iter().position(|b| !(0x21..=0x7E).contains(b)) {
        InputProblem::BadByte {
            byte: bytes[at],
            at,
        }
    } else {
        return Ok(());
    };
    Err(Error::InvalidKey { reason })
}

/// Encodes a validated scope and key: `tenant_len: u8, tenant, endpoint_len: u16 BE, endpoint,
/// key`. The key runs to the end; every other part carries its length, so no two distinct
/// triples encode alike.
///
/// # Errors
/// [`Error::InvalidScope`] or [`Error::InvalidKey`]; nothing is allocated for bad input.
pub(crate) fn scoped_key(scope: &Scope, key: &str) -> Result<Box<[u8]>> {
    scope.validate()?;
    validate_key(key)?;
    let (t, e, k) = (
        scope.tenant.as_bytes(),
        scope.endpoint.as_bytes(),
        key.as_bytes(),
    );
    let mut out = Vec::with_capacity(3 + t.len() + e.len() + k.len());
    out.push(u8::try_from(t.len()).expect("tenant length validated"));
    out.extend_from_slice(t);
    out.extend_from_slice(
        &u16::try_from(e.len())
            .expect("endpoint length validated")
            .to_be_bytes(),
    );
    out.extend_from_slice(e);
    out.extend_from_slice(k);
    Ok(out.into_boxed_slice())
}

/// The tenant's bytes of an encoded scoped key (empty if the bytes are not an encoding).
pub(crate) fn tenant_of(bytes: &[u8]) -> &[u8] {
    let len = bytes.first().map_or(0, |&len| usize::from(len));
    bytes.get(1..1 + len).unwrap_or_default()
}

/// Splits an encoded scoped key back into its scope and key, or `None` if the bytes are not a
/// valid encoding (a damaged file).
pub(crate) fn split_scoped_key(bytes: &[u8]) -> Option<(Scope, String)> {
    let (tenant, endpoint, key) = scoped_key_parts(bytes)?;
    Some((Scope::new(tenant, endpoint), key.to_owned()))
}

/// The (tenant, endpoint, key) of an encoded scoped key, if it is one [`scoped_key`] could have
/// made; allocates nothing (the open checks every record's key with it).
pub(crate) fn scoped_key_parts(bytes: &[u8]) -> Option<(&str, &str, &str)> {
    let (&tlen, rest) = bytes.split_first()?;
    let tlen = usize::from(tlen);
    let tenant = rest.get(..tlen)?;
    let rest = &rest[tlen..];
    let elen = usize::from(u16::from_be_bytes([*rest.first()?, *rest.get(1)?]));
    let rest = &rest[2..];
    let endpoint = rest.get(..elen)?;
    let key = std::str::from_utf8(&rest[elen..]).ok()?;
    let (tenant, endpoint) = (
        std::str::from_utf8(tenant).ok()?,
        std::str::from_utf8(endpoint).ok()?,
    );
    check_len("tenant", tenant.len(), MAX_TENANT_LEN).ok()?;
    check_len("endpoint", endpoint.len(), MAX_ENDPOINT_LEN).ok()?;
    validate_key(key).ok()?;
    Some((tenant, endpoint, key))
}

/// Renders an encoded scoped key for error messages: printable ASCII as is, the rest escaped.
pub(crate) fn display_scoped_key(bytes: &[u8]) -> String {
    match split_scoped_key(bytes) {
        Some((scope, key)) => format!("{:?}/{:?}/{}", scope.tenant(), scope.endpoint(), key),
        None => bytes.escape_ascii().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_encoding_is_unambiguous() {
        let a = scoped_key(&Scope::new("ab", "c"), "k").unwrap();
        let b = scoped_key(&Scope::new("a", "bc"), "k").unwrap();
        assert_ne!(a, b);
        let c = scoped_key(&Scope::new("a", "b"), "ck").unwrap();
        let d = scoped_key(&Scope::new("a", "bc"), "k").unwrap();
        assert_ne!(c, d);
    }

    #[test]
    fn scoped_key_round_trips() {
        let scope = Scope::new("tenant é", "POST /v1/payments");
        let bytes = scoped_key(&scope, "7c9e6679-7425").unwrap();
        let (s, k) = split_scoped_key(&bytes).unwrap();
        assert_eq!(s, scope);
        assert_eq!(k, "7c9e6679-7425");
        assert!(split_scoped_key(&bytes[..bytes.len() - 13]).is_none());
        assert!(split_scoped_key(&[]).is_none());
        assert!(split_scoped_key(&[200, 1, 2]).is_none());
    }

    #[test]
    fn keys_are_checked() {
        assert!(validate_key("a").is_ok());
        assert!(validate_key(&"x".repeat(255)).is_ok());
        assert!(matches!(
            validate_key(""),
            Err(Error::InvalidKey {
                reason: InputProblem::Empty
            })
        ));
        assert!(matches!(
            validate_key(&"x".repeat(256)),
            Err(Error::InvalidKey {
                reason: InputProblem::TooLong { len: 256, max: 255 }
            })
        ));
        for bad in ["a b", "a\tb", "é", "a\u{7f}", "\0"] {
            assert!(
                matches!(validate_key(bad), Err(Error::InvalidKey { .. })),
                "{bad:?}"
            );
        }
        assert!(validate_key("!~").is_ok());
    }

    #[test]
    fn scope_bounds() {
        assert!(Scope::new("t".repeat(255), "e".repeat(1024))
            .validate()
            .is_ok());
        assert!(matches!(
            Scope::new("t".repeat(256), "e").validate(),
            Err(Error::InvalidScope { part: "tenant", .. })
        ));
        assert!(matches!(
            Scope::new("t", "").validate(),
            Err(Error::InvalidScope {
                part: "endpoint",
                ..
            })
        ));
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn distinct_triples_never_share_an_encoding(
            a in ("[a-c]{1,3}", "[a-c]{1,3}", "[a-c]{1,3}"),
            b in ("[a-c]{1,3}", "[a-c]{1,3}", "[a-c]{1,3}"),
        ) {
            let ea = scoped_key(&Scope::new(a.0.clone(), a.1.clone()), &a.2).unwrap();
            let eb = scoped_key(&Scope::new(b.0.clone(), b.1.clone()), &b.2).unwrap();
            prop_assert_eq!(ea == eb, a == b);
        }

        #[test]
        fn arbitrary_bytes_never_panic_the_splitter(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Some((scope, key)) = split_scoped_key(&bytes) {
                prop_assert_eq!(&*scoped_key(&scope, &key).unwrap(), &bytes[..]);
            }
            let _ = display_scoped_key(&bytes);
        }

        #[test]
        fn any_string_key_is_accepted_or_refused_without_panic(key in ".{0,300}") {
            let ok = validate_key(&key).is_ok();
            let expect = (1..=255).contains(&key.len()) && key.bytes().all(|b| (0x21..=0x7E).contains(&b));
            prop_assert_eq!(ok, expect);
        }
    }
}
