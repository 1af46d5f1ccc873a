//! What every HTTP request must carry before it reaches a session: an allowed `Origin` (or
//! none), the tenant header, a protocol version the gateway speaks (or none), and for a
//! session's requests its id.

use super::refusal::Refusal;
use axum::http::{HeaderMap, StatusCode};
use std::net::SocketAddr;

/// The header that names a session.
pub(crate) const SESSION_ID: &str = "mcp-session-id";
const PROTOCOL_VERSION: &str = "mcp-protocol-version";

/// The revisions reached through `initialize` that the gateway speaks (the upstream negotiates
/// which one within them). A client that sent no header is taken to speak 2025-03-26.
const VERSIONS: [&str; 4] = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

/// The origins a browser may send requests from: the listener's own, and those given with
/// `--allow-origin` (DNS rebinding protection, as the transport's specification asks).
#[derive(Debug)]
pub(crate) struct Origins(Vec<String>);

impl Origins {
    pub(crate) fn new(listening: SocketAddr, allowed: &[String]) -> Origins {
        let port = listening.port();
        let mut origins = vec![format!("http://{listening}")];
        if listening.ip().is_loopback() {
            for host in ["localhost", "127.0.0.1", "[::1]"] {
                origins.push(format!("http://{host}:{port}"));
            }
        }
        origins.extend(allowed.iter().map(|o| o.trim_end_matches('/').to_owned()));
        Origins(origins)
    }

    /// A request without `Origin` (not from a browser) passes; one with another origin is
    /// refused (403).
    pub(crate) fn check(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        let Some(origin) = headers.get("origin") else {
            return Ok(());
        };
        let allowed = origin
            .to_str()
            .is_ok_and(|o| self.0.iter().any(|a| a.eq_ignore_ascii_case(o)));
        if allowed {
            Ok(())
        } else {
            Err(Refusal::new(
                StatusCode::FORBIDDEN,
                super::refusal::INVALID_REQUEST,
                "this Origin is not allowed (see --allow-origin)",
            ))
        }
    }
}

/// The tenant the request acts for: the value of the header `name`, which must be a valid
/// idemdb tenant (1 to 255 bytes of UTF-8).
pub(crate) fn tenant(headers: &HeaderMap, name: &str) -> Result<String, Refusal> {
    let value = headers
        .get(name)
        .ok_or_else(|| Refusal::bad(format!("the {name} header (the tenant) is required")))?;
    let tenant = std::str::from_utf8(value.as_bytes())
        .map_err(|_| Refusal::bad(format!("the {name} header is not UTF-8")))?;
    idemdb::Scope::new(tenant, "mcp")
        .validate()
        .map_err(|e| Refusal::bad(format!("the {name} header: {e}")))?;
    Ok(tenant.to_owned())
}

/// A `MCP-Protocol-Version` the gateway does not speak is refused (400); none is fine.
pub(crate) fn protocol_version(headers: &HeaderMap) -> Result<(), Refusal> {
    match headers.get(PROTOCOL_VERSION) {
        None => Ok(()),
        Some(v) if v.to_str().is_ok_and(|v| VERSIONS.contains(&v)) => Ok(()),
        Some(_) => Err(Refusal::bad(format!(
            "unsupported MCP-Protocol-Version: this gateway speaks {}",
            VERSIONS.join(", ")
        ))),
    }
}

/// The session a request names: missing is refused (400). An id that is not one the gateway
/// could have made is returned as it is: it will be unknown (404).
pub(crate) fn session_id(headers: &HeaderMap) -> Result<&str, Refusal> {
    let id = headers
        .get(SESSION_ID)
        .ok_or_else(|| Refusal::bad("the Mcp-Session-Id header is required (initialize first)"))?;
    Ok(id.to_str().unwrap_or(""))
}

/// What the client's `Accept` allows: (JSON, an event stream). No header allows both.
pub(crate) fn accepts(headers: &HeaderMap) -> (bool, bool) {
    let Some(accept) = headers.get("accept") else {
        return (true, true);
    };
    let types: Vec<String> = String::from_utf8_lossy(accept.as_bytes())
        .split(',')
        .map(|t| {
            t.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .collect();
    let any = types.iter().any(|t| t == "*/*");
    let json = any
        || types
            .iter()
            .any(|t| t == "application/json" || t == "application/*");
    let sse = any
        || types
            .iter()
            .any(|t| t == "text/event-stream" || t == "text/*");
    (json, sse)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn only_the_listeners_own_origins_and_the_allowed_ones_pass() {
        let origins = Origins::new(
            "127.0.0.1:8080".parse().unwrap(),
            &["https://app.example/".into()],
        );
        for ok in [
            None,
            Some("http://127.0.0.1:8080"),
            Some("http://localhost:8080"),
            Some("HTTP://LOCALHOST:8080"),
            Some("https://app.example"),
        ] {
            let h = ok.map_or_else(HeaderMap::new, |o| headers(&[("origin", o)]));
            assert!(origins.check(&h).is_ok(), "{ok:?}");
        }
        for bad in [
            "http://evil.example",
            "http://localhost:8081",
            "null",
            "http://127.0.0.1",
        ] {
            let refused = origins.check(&headers(&[("origin", bad)])).unwrap_err();
            assert_eq!(refused.status, StatusCode::FORBIDDEN, "{bad}");
        }
        let public = Origins::new("10.0.0.1:80".parse().unwrap(), &[]);
        assert!(public
            .check(&headers(&[("origin", "http://10.0.0.1:80")]))
            .is_ok());
        assert!(public
            .check(&headers(&[("origin", "http://localhost:80")]))
            .is_err());
    }

    #[test]
    fn a_tenant_is_required_and_must_be_a_valid_idemdb_tenant() {
        let name = "x-idemdb-tenant";
        assert_eq!(tenant(&headers(&[(name, "acme")]), name).unwrap(), "acme");
        let mut utf8 = HeaderMap::new();
        utf8.insert(name, HeaderValue::from_bytes("é".as_bytes()).unwrap());
        assert_eq!(tenant(&utf8, name).unwrap(), "é");
        let long = "t".repeat(256);
        for bad in [
            headers(&[]),
            headers(&[(name, "")]),
            headers(&[(name, &long)]),
        ] {
            assert_eq!(
                tenant(&bad, name).unwrap_err().status,
                StatusCode::BAD_REQUEST
            );
        }
        let mut latin1 = HeaderMap::new();
        latin1.insert(name, HeaderValue::from_bytes(&[0xE9]).unwrap());
        assert!(tenant(&latin1, name).is_err());
    }

    #[test]
    fn protocol_versions_and_accept() {
        assert!(protocol_version(&headers(&[])).is_ok());
        assert!(protocol_version(&headers(&[(PROTOCOL_VERSION, "2025-06-18")])).is_ok());
        for bad in ["2026-07-28", "1999-01-01", ""] {
            assert!(protocol_version(&headers(&[(PROTOCOL_VERSION, bad)])).is_err());
        }
        assert_eq!(accepts(&headers(&[])), (true, true));
        let both = "application/json, text/event-stream";
        assert_eq!(accepts(&headers(&[("accept", both)])), (true, true));
        assert_eq!(
            accepts(&headers(&[("accept", "application/json;q=1")])),
            (true, false)
        );
        assert_eq!(accepts(&headers(&[("accept", "text/*")])), (false, true));
        assert_eq!(accepts(&headers(&[("accept", "*/*")])), (true, true));
        assert_eq!(
            accepts(&headers(&[("accept", "image/png")])),
            (false, false)
        );
    }
}
