//! RFC 9457 `application/problem+json` responses, each with a stable `type`.

use ::http::{header, HeaderValue, StatusCode};
use bytes::Bytes;
use std::time::Duration;

/// The `type` URIs of the problems the layer answers with (RFC 9457), stable across versions
/// and listed in `docs/http.md`, so that clients can match on them.
pub mod types {
    /// 400: the endpoint requires an `Idempotency-Key` and the request had none.
    pub const MISSING_KEY: &str = "https://idemdb.dev/problems/idempotency-key-missing";
    /// 400: the `Idempotency-Key` is not a valid key (1..=255 bytes of visible ASCII, as a
    /// structured-field string or token).
    pub const MALFORMED_KEY: &str = "https://idemdb.dev/problems/idempotency-key-malformed";
    /// 400: more than one `Idempotency-Key` field.
    pub const REPEATED_KEY: &str = "https://idemdb.dev/problems/idempotency-key-repeated";
    /// 401 (or 400 for an invalid scope): the request's tenant could not be found.
    pub const NO_TENANT: &str = "https://idemdb.dev/problems/tenant-unknown";
    /// 413: the body exceeds the layer's cap; nothing was claimed.
    pub const BODY_TOO_LARGE: &str = "https://idemdb.dev/problems/request-body-too-large";
    /// 400: the body could not be read.
    pub const BODY_UNREADABLE: &str = "https://idemdb.dev/problems/request-body-unreadable";
    /// 409: a request with this key is being processed; retry after `Retry-After`.
    pub const IN_PROGRESS: &str = "https://idemdb.dev/problems/idempotency-key-in-progress";
    /// 422: the key was used for a different request.
    pub const MISMATCH: &str = "https://idemdb.dev/problems/idempotency-key-reused";
    /// 503: the idempotency store could not make a claim durable; retry after `Retry-After`.
    pub const STORE_UNAVAILABLE: &str = "https://idemdb.dev/problems/idempotency-store-unavailable";
    /// 429: the tenant holds as many live idempotency records as the store allows
    /// (`max_live_records_per_tenant`); nothing was claimed, the handler did not run; retry
    /// after `Retry-After`.
    pub const TENANT_FULL: &str = "https://idemdb.dev/problems/tenant-record-limit";
    /// 500: the handler's response streamed past the layer's `max_response_bytes`, so it could
    /// be neither stored nor passed on; the side effect happened, so the key stays in progress
    /// (a retry after the lease runs as a takeover).
    pub const RESPONSE_TOO_LARGE: &str = "https://idemdb.dev/problems/response-too-large";
    /// 500: the handler panicked or failed; the key was released.
    pub const HANDLER_PANICKED: &str = "https://idemdb.dev/problems/handler-panicked";
}

/// A problem response's parts, before the body type is chosen.
pub(crate) struct Problem {
    pub(crate) status: StatusCode,
    pub(crate) kind: &'static str,
    pub(crate) title: &'static str,
    pub(crate) detail: String,
    pub(crate) retry_after: Option<Duration>,
}

impl Problem {
    pub(crate) fn new(status: StatusCode, kind: &'static str, title: &'static str) -> Problem {
        Problem {
            status,
            kind,
            title,
            detail: String::new(),
            retry_after: None,
        }
    }

    pub(crate) fn detail(mut self, detail: impl Into<String>) -> Problem {
        self.detail = detail.into();
        self
    }

    pub(crate) fn retry_after(mut self, after: Duration) -> Problem {
        self.retry_after = Some(after);
        self
    }

    pub(crate) fn into_response<B: From<Bytes>>(self) -> ::http::Response<B> {
        let mut body = serde_json::json!({
            "type": self.kind,
            "title": self.title,
            "status": self.status.as_u16(),
        });
        if !self.detail.is_empty() {
            body["detail"] = serde_json::Value::String(self.detail);
        }
        let bytes = serde_json::to_vec(&body).expect("a JSON value serializes");
        let mut response = ::http::Response::new(B::from(Bytes::from(bytes)));
        *response.status_mut() = self.status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(after) = self.retry_after {
            // Delta-seconds, rounded up so that a client never retries too early.
            let secs = after.as_millis().div_ceil(1000).max(1);
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from_str(&secs.to_string()).expect("digits are a valid value"),
            );
        }
        response
    }
}
