//! The `/mcp` endpoint: POST (one JSON-RPC message), GET (the session's standalone stream),
//! DELETE (the session ends), as MCP's Streamable HTTP transport has them.

use super::checks::{self, Origins, SESSION_ID};
use super::refusal::{self, Refusal};
use super::session::Session;
use super::sessions::{NotMade, Sessions};
use super::{sse, StartUpstream};
use crate::keyed::Keying;
use crate::message::{self, Kind};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use std::sync::Arc;

/// What every request of the endpoint shares.
pub(crate) struct Endpoint {
    pub(crate) sessions: Arc<Sessions>,
    pub(crate) origins: Origins,
    pub(crate) tenant_header: String,
    pub(crate) keying: Arc<Keying>,
    pub(crate) start: StartUpstream,
}

/// Answers one request to `/mcp`.
pub(crate) async fn answer(
    State(endpoint): State<Arc<Endpoint>>,
    method: Method,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let answered = match method {
        Method::POST => endpoint.post(&headers, &body).await,
        Method::GET => endpoint.get(&headers),
        Method::DELETE => endpoint.delete(&headers),
        _ => Ok((
            StatusCode::METHOD_NOT_ALLOWED,
            [(header::ALLOW, "GET, POST, DELETE")],
        )
            .into_response()),
    };
    answered.unwrap_or_else(IntoResponse::into_response)
}

impl Endpoint {
    /// The origin and the tenant, checked first for every request.
    fn admitted(&self, headers: &HeaderMap) -> Result<String, Refusal> {
        self.origins.check(headers)?;
        checks::tenant(headers, &self.tenant_header)
    }

    /// The live session the request names, if it is the tenant's.
    fn session(&self, headers: &HeaderMap, tenant: &str) -> Result<Arc<Session>, Refusal> {
        let id = checks::session_id(headers)?;
        let session = self.sessions.get(id).ok_or_else(|| {
            Refusal::new(
                StatusCode::NOT_FOUND,
                refusal::INVALID_REQUEST,
                "no such session (it ended, or never was): initialize a new one",
            )
        })?;
        if session.tenant != tenant {
            return Err(Refusal::new(
                StatusCode::FORBIDDEN,
                refusal::INVALID_REQUEST,
                "this session belongs to another tenant",
            ));
        }
        Ok(session)
    }

    async fn post(&self, headers: &HeaderMap, body: &[u8]) -> Result<Response, Refusal> {
        let tenant = self.admitted(headers)?;
        let message: Value = serde_json::from_slice(body).map_err(|e| {
            Refusal::new(
                StatusCode::BAD_REQUEST,
                refusal::PARSE_ERROR,
                format!("parse error: {e}"),
            )
        })?;
        let kind = well_formed(&message)?;
        if let Kind::Request { id, method } = &kind {
            if method == "server/discover" {
                // The 2026-07-28 revision's first request: this gateway speaks the revisions
                // reached through `initialize`, which clients fall back to on this answer.
                return Err(Refusal::new(
                    StatusCode::NOT_FOUND,
                    refusal::METHOD_NOT_FOUND,
                    "server/discover is not offered: use initialize",
                )
                .to(id));
            }
        }
        checks::protocol_version(headers)?;
        let (json, streamed) = checks::accepts(headers);
        if let (Kind::Request { id, .. }, false, false) = (&kind, json, streamed) {
            return Err(Refusal::new(
                StatusCode::NOT_ACCEPTABLE,
                refusal::INVALID_REQUEST,
                "the client must accept text/event-stream or application/json",
            )
            .to(id));
        }
        let session = match (&kind, headers.contains_key(SESSION_ID)) {
            (Kind::Request { method, .. }, false) if method == "initialize" => self.make(tenant)?,
            _ => self.session(headers, &tenant)?,
        };
        let Kind::Request { id, .. } = kind else {
            session.send(message).map_err(|_| gone())?;
            return Ok(with_session(StatusCode::ACCEPTED.into_response(), &session));
        };
        let token = &message["params"]["_meta"]["progressToken"];
        let token = (token.is_string() || token.is_number()).then(|| token.to_string());
        let from = session
            .streams()
            .open_request(id.to_string(), token, streamed)
            .map_err(|_| {
                Refusal::bad("a request with this id is still in flight in this session").to(&id)
            })?;
        let open = session.opened();
        session.send(message).map_err(|_| gone().to(&id))?;
        let response = if streamed {
            sse::events(from, open, false)
        } else {
            json_answer(from, &id).await
        };
        Ok(with_session(response, &session))
    }

    /// Makes a session for an `initialize`.
    fn make(&self, tenant: String) -> Result<Arc<Session>, Refusal> {
        self.sessions
            .make(tenant, &self.start, &self.keying)
            .map_err(|e| match e {
                NotMade::Full => Refusal::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    refusal::UNAVAILABLE,
                    "too many sessions (--max-sessions): retry later",
                ),
                NotMade::Upstream(e) => Refusal::new(
                    StatusCode::BAD_GATEWAY,
                    refusal::UNAVAILABLE,
                    format!("the upstream server did not start: {e}"),
                ),
                NotMade::NoRandomness => Refusal::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    refusal::UNAVAILABLE,
                    "no random bytes for a session id",
                ),
            })
    }

    fn get(&self, headers: &HeaderMap) -> Result<Response, Refusal> {
        let tenant = self.admitted(headers)?;
        checks::protocol_version(headers)?;
        if !checks::accepts(headers).1 {
            return Err(Refusal::new(
                StatusCode::NOT_ACCEPTABLE,
                refusal::INVALID_REQUEST,
                "the standalone stream is text/event-stream: accept it",
            ));
        }
        let session = self.session(headers, &tenant)?;
        session.touch();
        // A `Last-Event-ID` is not honoured: no stream is resumed (no event ids are sent).
        let from = session.streams().open_standalone().ok_or_else(|| {
            Refusal::new(
                StatusCode::CONFLICT,
                refusal::INVALID_REQUEST,
                "this session's standalone stream is open already",
            )
        })?;
        let open = session.opened();
        Ok(with_session(sse::events(from, open, true), &session))
    }

    fn delete(&self, headers: &HeaderMap) -> Result<Response, Refusal> {
        let tenant = self.admitted(headers)?;
        checks::protocol_version(headers)?;
        let session = self.session(headers, &tenant)?;
        // Keyed calls in flight still finish and are stored; the upstream is let go after.
        self.sessions
            .end(&session.id, "the client ended the session");
        Ok(StatusCode::OK.into_response())
    }
}

/// The message's kind, if it is one message the gateway can route: not a batch, with an id (if
/// any) that is a string or a number.
fn well_formed(message: &Value) -> Result<Kind, Refusal> {
    if message.is_array() {
        return Err(Refusal::bad(
            "JSON-RPC batches are not supported: send one message per POST",
        ));
    }
    let kind = message::kind(message);
    match &kind {
        Kind::Request { id, .. } | Kind::Response { id } if !(id.is_string() || id.is_number()) => {
            Err(Refusal::bad("a message's id must be a string or a number"))
        }
        Kind::Other => Err(Refusal::bad(
            "not a JSON-RPC request, notification or response",
        )),
        _ => Ok(kind),
    }
}

/// A request answered with its response alone, as JSON (for a client that does not accept an
/// event stream).
async fn json_answer(
    mut from: tokio::sync::mpsc::UnboundedReceiver<Value>,
    id: &Value,
) -> Response {
    while let Some(message) = from.recv().await {
        if matches!(message::kind(&message), Kind::Response { .. }) {
            return json(&message);
        }
    }
    json(&message::lost(
        id,
        "the session ended before this request was answered",
    ))
}

fn json(message: &Value) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        message.to_string(),
    )
        .into_response()
}

fn gone() -> Refusal {
    Refusal::new(
        StatusCode::NOT_FOUND,
        refusal::INVALID_REQUEST,
        "the session ended: initialize a new one",
    )
}

fn with_session(mut response: Response, session: &Session) -> Response {
    if let Ok(id) = HeaderValue::from_str(&session.id) {
        response.headers_mut().insert(SESSION_ID, id);
    }
    response
}
