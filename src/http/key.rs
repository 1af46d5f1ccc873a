//! The `Idempotency-Key` request header field: the draft's Structured Field string (`"..."`)
//! and Stripe's bare token both accepted; 1..=255 visible ASCII; exactly one field.

use ::http::HeaderMap;

/// Why a request's key was refused (each a 400).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyProblem {
    Repeated,
    Malformed(&'static str),
}

/// The request's idempotency key, `None` if it has none.
pub(crate) fn parse(
    headers: &HeaderMap,
    name: &::http::HeaderName,
) -> Result<Option<String>, KeyProblem> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(KeyProblem::Repeated);
    }
    let bytes = value.as_bytes();
    let inner = match bytes {
        [b'"', rest @ ..] => match rest.split_last() {
            Some((b'"', inner)) => unescape_sf_string(inner)?,
            _ => return Err(KeyProblem::Malformed("unterminated quoted string")),
        },
        _ => bytes.to_vec(),
    };
    if inner.is_empty() {
        return Err(KeyProblem::Malformed("the key is empty"));
    }
    if inner.len() > crate::MAX_KEY_LEN {
        return Err(KeyProblem::Malformed("the key is longer than 255 bytes"));
    }
    if !inner.iter().all(|b| (0x21..=0x7E).contains(b)) {
        return Err(KeyProblem::Malformed(
            "the key holds a byte outside visible ASCII (0x21..=0x7E)",
        ));
    }
    Ok(Some(
        String::from_utf8(inner).expect("visible ASCII is UTF-8"),
    ))
}

/// RFC 8941 sf-string content: `\"` and `\\` are the only escapes; other characters are
/// printable ASCII (0x20..=0x7E) except `"`.
fn unescape_sf_string(inner: &[u8]) -> Result<Vec<u8>, KeyProblem> {
    let mut out = Vec::with_capacity(inner.len());
    let mut bytes = inner.iter();
    while let Some(&b) = bytes.next() {
        match b {
            b'\\' => match bytes.next() {
                Some(&e @ (b'"' | b'\\')) => out.push(e),
                _ => return Err(KeyProblem::Malformed("invalid escape in quoted string")),
            },
            b'"' => return Err(KeyProblem::Malformed("unescaped quote in quoted string")),
            0x20..=0x7E => out.push(b),
            _ => return Err(KeyProblem::Malformed("invalid character in quoted string")),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::http::HeaderValue;

    fn parse_one(raw: &[u8]) -> Result<Option<String>, KeyProblem> {
        let mut h = HeaderMap::new();
        h.insert("idempotency-key", HeaderValue::from_bytes(raw).unwrap());
        parse(&h, &::http::HeaderName::from_static("idempotency-key"))
    }

    #[test]
    fn accepts_sf_strings_and_bare_tokens() {
        assert_eq!(
            parse_one(b"\"8e03978e-40d5\"").unwrap().unwrap(),
            "8e03978e-40d5"
        );
        assert_eq!(
            parse_one(b"8e03978e-40d5").unwrap().unwrap(),
            "8e03978e-40d5"
        );
        assert_eq!(parse_one(br#""a\"b""#).unwrap().unwrap(), "a\"b");
        assert_eq!(parse_one(br#""a\\b""#).unwrap().unwrap(), "a\\b");
    }

    #[test]
    fn refuses_malformed_keys() {
        for raw in [
            &b"\"\""[..],
            b"\"abc",
            b"\"a b\"",
            b"a b",
            br#""a\nb""#,
            br#""a"b""#,
        ] {
            assert!(
                matches!(parse_one(raw), Err(KeyProblem::Malformed(_))),
                "{:?}",
                String::from_utf8_lossy(raw)
            );
        }
        assert!(parse_one("k".repeat(256).as_bytes()).is_err());
        assert!(parse_one("k".repeat(255).as_bytes()).is_ok());
    }

    #[test]
    fn missing_and_repeated() {
        let name = ::http::HeaderName::from_static("idempotency-key");
        let mut h = HeaderMap::new();
        assert_eq!(parse(&h, &name), Ok(None));
        h.append("idempotency-key", HeaderValue::from_static("a"));
        h.append("idempotency-key", HeaderValue::from_static("b"));
        assert_eq!(parse(&h, &name), Err(KeyProblem::Repeated));
    }
}
