//! The `Idempotency-Key` header field, from the network. The input is one field value, or (when
//! its first byte is odd) two, split where that byte says. Checked, besides "no panic":
//!
//! - two fields are always refused;
//! - an accepted key is 1 to `MAX_KEY_LEN` bytes of visible ASCII;
//! - a bare token is accepted as itself, byte for byte;
//! - an accepted key, written again as an RFC 8941 string (and, when it does not start with a
//!   quote, as a bare token), parses back to the same key.

#![no_main]

use idemdb::http::fuzzing::idempotency_key;
use libfuzzer_sys::fuzz_target;

/// `key` as an RFC 8941 sf-string: quoted, with `"` and `\` escaped.
fn quoted(key: &str) -> Vec<u8> {
    let mut out = vec![b'"'];
    for b in key.bytes() {
        if b == b'"' || b == b'\\' {
            out.push(b'\\');
        }
        out.push(b);
    }
    out.push(b'"');
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let values: Vec<&[u8]> = if first & 1 == 1 {
        let at = usize::from(first >> 1).min(rest.len());
        vec![&rest[..at], &rest[at..]]
    } else {
        vec![rest]
    };
    let Some(parsed) = idempotency_key(&values) else {
        return; // not header values: `http` refuses them before any layer runs
    };
    if values.len() == 2 {
        assert!(parsed.is_err(), "two fields accepted: {parsed:?}");
        return;
    }
    let raw = values[0];
    let key = match parsed {
        Ok(Some(key)) => key,
        Ok(None) => panic!("a field that is present read as no key"),
        Err(_) => return,
    };
    assert!(
        (1..=idemdb::MAX_KEY_LEN).contains(&key.len()),
        "accepted a key of {} bytes",
        key.len()
    );
    assert!(
        key.bytes().all(|b| (0x21..=0x7e).contains(&b)),
        "accepted a key outside visible ASCII: {key:?}"
    );
    if raw.first() != Some(&b'"') {
        assert_eq!(key.as_bytes(), raw, "a bare token changed");
    }
    assert_eq!(
        idempotency_key(&[&quoted(&key)]),
        Some(Ok(Some(key.clone()))),
        "the key as an sf-string"
    );
    if !key.starts_with('"') {
        assert_eq!(
            idempotency_key(&[key.as_bytes()]),
            Some(Ok(Some(key.clone()))),
            "the key as a bare token"
        );
    }
});
