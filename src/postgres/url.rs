//! The connection string: libpq's two forms (a `postgres://` URL, or `key=value` pairs), with
//! the parameters tokio-postgres does not know taken out and read here: TLS (`sslmode`,
//! `sslrootcert`, `sslcert`, `sslkey`; see `tls.rs`) and `pool_mode` (see `pooler.rs`).

use super::pooler::PoolMode;
use super::tls::{Settings, SslMode};
use crate::error::{Error, Result};
use std::path::PathBuf;

/// What idemdb reads from a connection string beside the driver's settings.
#[derive(Debug, Default)]
pub(crate) struct Parameters {
    pub(crate) tls: Settings,
    pub(crate) pool_mode: Option<PoolMode>,
}

pub(crate) fn invalid(reason: String) -> Error {
    Error::Database {
        sqlstate: None,
        reason: format!("invalid connection string: {reason}"),
        driver: None,
    }
}

/// Takes idemdb's parameters out of `url` (a `postgres://` URL or `key=value` pairs), leaving
/// a string tokio-postgres accepts.
///
/// # Errors
/// `Error::Database` (invalid connection string) for an unknown `sslmode` or `pool_mode`, or a
/// parameter given without a value.
pub(crate) fn split(url: &str) -> Result<(String, Parameters)> {
    let mut settings = Settings::default();
    let mut pool_mode = None;
    let (mut cert, mut key) = (None, None);
    let mut take = |key_name: &str, value: &str| -> Result<bool> {
        match key_name {
            "pool_mode" => pool_mode = Some(PoolMode::parse(value)?),
            "sslmode" => settings.mode = Some(SslMode::parse(value)?),
            "sslrootcert" => settings.root_cert = Some(PathBuf::from(value)),
            "sslcert" => cert = Some(PathBuf::from(value)),
            "sslkey" => key = Some(PathBuf::from(value)),
            _ => return Ok(false),
        }
        Ok(true)
    };
    let rest = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        match url.split_once('?') {
            None => url.to_owned(),
            Some((base, query)) => {
                let mut kept = Vec::new();
                for pair in query.split('&').filter(|p| !p.is_empty()) {
                    let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                    if !take(&percent_decode(k)?, &percent_decode(v)?)? {
                        kept.push(pair);
                    }
                }
                if kept.is_empty() {
                    base.to_owned()
                } else {
                    format!("{base}?{}", kept.join("&"))
                }
            }
        }
    } else {
        let mut kept = Vec::new();
        for (k, v) in key_values(url)? {
            if !take(&k, &v)? {
                kept.push(format!(
                    "{k}='{}'",
                    v.replace('\\', "\\\\").replace('\'', "\\'")
                ));
            }
        }
        kept.join(" ")
    };
    settings.client_cert = match (cert, key) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        _ => {
            return Err(invalid(
                "sslcert and sslkey go together: give both, or neither".into(),
            ))
        }
    };
    Ok((
        rest,
        Parameters {
            tls: settings,
            pool_mode,
        },
    ))
}

fn percent_decode(s: &str) -> Result<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| invalid(format!("a bad percent escape in {s:?}")))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| invalid(format!("{s:?} is not UTF-8 once decoded")))
}

/// libpq's `key = value` pairs: values bare or in single quotes, with backslash escapes.
fn key_values(s: &str) -> Result<Vec<(String, String)>> {
    let mut pairs = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return Ok(pairs);
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            return Err(invalid(format!("{key:?} has no value")));
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    None => return Err(invalid(format!("the value of {key:?} is not closed"))),
                    Some('\'') => break,
                    Some('\\') => value.extend(chars.next()),
                    Some(c) => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.extend(chars.next());
                } else {
                    value.push(c);
                }
            }
        }
        pairs.push((key, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// Both forms of a connection string: the TLS parameters are taken out, decoded, and the
    /// rest is kept as tokio-postgres reads it.
    #[test]
    fn tls_parameters_are_taken_out_and_the_rest_is_kept() {
        let client = Some((PathBuf::from("/c.pem"), PathBuf::from("/k.pem")));
        for (input, kept, mode, root, client) in [
            (
                "postgres://u@db.example:5432/idem?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&application_name=x",
                "postgres://u@db.example:5432/idem?application_name=x",
                SslMode::VerifyFull,
                Some("/etc/ca.pem"),
                None,
            ),
            ("postgresql://h/d?sslmode=disable", "postgresql://h/d", SslMode::Disable, None, None),
            (
                "host=127.0.0.1 port = 5 sslmode=verify-ca sslrootcert='/a b/c\\'s.pem' sslcert=/c.pem sslkey=/k.pem user=postgres",
                "host='127.0.0.1' port='5' user='postgres'",
                SslMode::VerifyCa,
                Some("/a b/c's.pem"),
                client,
            ),
        ] {
            let (rest, Parameters { tls: s, .. }) = split(input).unwrap();
            assert_eq!(rest, kept, "{input}");
            assert_eq!(s.mode, Some(mode), "{input}");
            assert_eq!(s.root_cert.as_deref(), root.map(Path::new), "{input}");
            assert_eq!(s.client_cert, client, "{input}");
            let _: tokio_postgres::Config = rest.parse().unwrap();
        }
        let parsed: tokio_postgres::Config =
            "host='127.0.0.1' port='5' user='postgres'".parse().unwrap();
        assert_eq!(parsed.get_user(), Some("postgres"));
    }

    #[test]
    fn bad_tls_parameters_are_refused_with_what_is_wrong() {
        for (url, says) in [
            ("host=h sslmode=allow", "allow is not offered"),
            ("host=h sslmode=verify", "expected disable"),
            ("host=h sslcert=/c.pem", "sslcert and sslkey go together"),
            ("postgres://h/d?sslmode=%ZZ", "bad percent escape"),
            ("host='h", "not closed"),
        ] {
            match split(url) {
                Err(Error::Database { reason, .. }) => {
                    assert!(reason.contains(says), "{url}: {reason}")
                }
                other => panic!("{url}: {other:?}"),
            }
        }
    }

    #[test]
    fn the_pool_mode_is_taken_out_of_either_form() {
        for (input, kept, mode) in [
            (
                "postgres://u@bouncer:6432/idem?pool_mode=transaction&application_name=x",
                "postgres://u@bouncer:6432/idem?application_name=x",
                Some(PoolMode::Transaction),
            ),
            (
                "host=h pool_mode=session",
                "host='h'",
                Some(PoolMode::Session),
            ),
            ("host=h", "host='h'", None),
        ] {
            let (rest, parameters) = split(input).unwrap();
            assert_eq!(rest, kept, "{input}");
            assert_eq!(parameters.pool_mode, mode, "{input}");
        }
        match split("host=h pool_mode=statement") {
            Err(Error::Database { reason, .. }) => {
                assert!(reason.contains("session or transaction"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }
}
