//! What the layer stores of a handler's outcome: whether (by status) and which headers.

use ::http::{HeaderName, StatusCode};

/// What the layer does with a handler's response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OutcomePolicy {
    /// The outcome belongs to the request: store it, and replay it to every retry.
    Store,
    /// The outcome belongs to the moment: release the key, so a retry executes.
    Release,
}

/// The default outcome policy: store 2xx, 3xx and 4xx other than 408, 409, 425 and 429; release
/// 5xx and those four (they say "not now", not "not this").
pub fn default_outcome_policy(status: StatusCode) -> OutcomePolicy {
    let transient = matches!(status.as_u16(), 408 | 409 | 425 | 429);
    if status.is_server_error() || transient || status.is_informational() {
        OutcomePolicy::Release
    } else {
        OutcomePolicy::Store
    }
}

/// The default stored-header filter: everything but hop-by-hop fields (RFC 9110 §7.6.1),
/// `Date` (a replay gets its own) and `Set-Cookie` (a session must not be replayed).
pub fn default_stored_header(name: &HeaderName) -> bool {
    !matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "transfer-encoding"
            | "te"
            | "trailer"
            | "upgrade"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "date"
            | "set-cookie"
            | "content-length"
    )
}
