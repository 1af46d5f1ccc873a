//! A request the HTTP endpoint refuses before it reaches a session: an HTTP status with a
//! JSON-RPC error in the body, as the SDKs' clients read it (they surface the body's error
//! when there is one).

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

/// JSON-RPC's codes for what the endpoint refuses.
pub(crate) const PARSE_ERROR: i64 = -32700;
pub(crate) const INVALID_REQUEST: i64 = -32600;
pub(crate) const METHOD_NOT_FOUND: i64 = -32601;
/// A refusal that is no fault of the request (too many sessions, an upstream that would not
/// start).
pub(crate) const UNAVAILABLE: i64 = -32000;

/// An HTTP status and the JSON-RPC error that says why.
#[derive(Debug)]
pub(crate) struct Refusal {
    pub(crate) status: StatusCode,
    pub(crate) code: i64,
    pub(crate) message: String,
    /// The refused request's id, when it was read (else `null`).
    pub(crate) id: Value,
}

impl Refusal {
    pub(crate) fn new(status: StatusCode, code: i64, message: impl Into<String>) -> Refusal {
        Refusal {
            status,
            code,
            message: message.into(),
            id: Value::Null,
        }
    }

    /// A bad request (400, invalid request).
    pub(crate) fn bad(message: impl Into<String>) -> Refusal {
        Refusal::new(StatusCode::BAD_REQUEST, INVALID_REQUEST, message)
    }

    /// The same refusal, answering the request `id`.
    pub(crate) fn to(mut self, id: &Value) -> Refusal {
        self.id = id.clone();
        self
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let body = crate::message::error(&self.id, self.code, &self.message).to_string();
        (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response()
    }
}
