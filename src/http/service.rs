//! The service: the request's path through the layer.

use super::config::Config;
use super::key::{self, KeyProblem};
use super::policy::OutcomePolicy;
use super::problem::{types, Problem};
use crate::sync::{Arc, Ordering};
use crate::timer::{far_future, sleep};
use crate::{Claim, Error, Fingerprint, Scope, Store, Ticket};
use ::http::request::Parts;
use ::http::{header, HeaderName, HeaderValue, Request, Response, StatusCode};
use bytes::Bytes;
use futures_util::FutureExt as _;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// `Retry-After` of a 429 for a tenant at its record limit: records free up as claims end and
/// expired ones are purged, not within a second.
const TENANT_FULL_RETRY_AFTER: Duration = Duration::from_secs(60);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What the layer tells the handler about the claim it runs under, in the request's
/// extensions (axum: `Extension<Claimed>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// The request's idempotency key.
    pub key: String,
    /// The claim's fencing token: pass it downstream if the downstream can refuse stale
    /// writers.
    pub fence: u64,
    /// `Some` when an earlier attempt with this key was abandoned (its handler was cancelled or
    /// crashed, or its response could not be stored) and may already have performed the side
    /// effect: look the effect up downstream (by the key) before performing it again.
    pub takeover: Option<crate::Takeover>,
}

/// The service [`super::IdempotencyLayer`] wraps around an inner service.
#[derive(Clone)]
pub struct IdempotencyService<S> {
    pub(crate) inner: S,
    pub(crate) config: Arc<Config>,
}

impl<S> std::fmt::Debug for IdempotencyService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyService").finish_non_exhaustive()
    }
}

impl<S, ReqB, ResB> tower::Service<Request<ReqB>> for IdempotencyService<S>
where
    S: tower::Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: http_body::Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ReqB::Error: Into<BoxError> + Send,
    ResB: http_body::Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ResB::Error: Into<BoxError> + Send,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ResB>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        // The clone that was driven to readiness serves this request.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(handle(Arc::clone(&self.config), inner, req))
    }
}

async fn handle<S, ReqB, ResB>(
    config: Arc<Config>,
    mut inner: S,
    req: Request<ReqB>,
) -> Result<Response<ResB>, S::Error>
where
    S: tower::Service<Request<ReqB>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: http_body::Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ReqB::Error: Into<BoxError> + Send,
    ResB: http_body::Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ResB::Error: Into<BoxError> + Send,
{
    if !config.methods.contains(req.method()) {
        return inner.call(req).await;
    }
    let key = match key::parse(req.headers(), &config.key_header) {
        Ok(Some(key)) => key,
        Ok(None) if !config.key_required => return inner.call(req).await,
        Ok(None) => {
            return Ok(Problem::new(StatusCode::BAD_REQUEST, types::MISSING_KEY, "Idempotency-Key missing")
                .detail("this endpoint requires an Idempotency-Key header: mint one per logical operation and send it with every retry")
                .into_response())
        }
        Err(KeyProblem::Repeated) => {
            return Ok(Problem::new(StatusCode::BAD_REQUEST, types::REPEATED_KEY, "more than one Idempotency-Key")
                .detail("send exactly one Idempotency-Key field")
                .into_response())
        }
        Err(KeyProblem::Malformed(why)) => {
            return Ok(Problem::new(StatusCode::BAD_REQUEST, types::MALFORMED_KEY, "malformed Idempotency-Key")
                .detail(format!("{why}: send 1 to 255 visible ASCII characters, optionally as a quoted string"))
                .into_response())
        }
    };
    let (mut parts, body) = req.into_parts();
    let Some(tenant) = (config.tenant)(&parts) else {
        return Ok(Problem::new(StatusCode::UNAUTHORIZED, types::NO_TENANT, "unknown tenant")
            .detail("the request carries no credentials this service can scope its Idempotency-Key to")
            .into_response());
    };
    let bytes = match read_body(body, &parts, config.max_body_bytes).await {
        Ok(bytes) => bytes,
        Err(problem) => return Ok(problem.into_response()),
    };
    let scope = Scope::new(tenant, (config.endpoint)(&parts));
    let fingerprint = match &config.fingerprint {
        Some(f) => f(&parts, &bytes),
        None => default_fingerprint(&parts, &bytes),
    };
    let store = &config.store;
    let deadline = Instant::now()
        .checked_add(config.wait)
        .unwrap_or_else(far_future);
    let ticket = loop {
        match store.claim_async(&scope, &key, fingerprint).await {
            Ok(Claim::Acquired(ticket)) => break ticket,
            Ok(Claim::Replay(stored)) => return Ok(replay(&config, stored)),
            Ok(Claim::Mismatch { .. }) => {
                return Ok(Problem::new(StatusCode::UNPROCESSABLE_ENTITY, types::MISMATCH, "Idempotency-Key reused")
                    .detail("this Idempotency-Key was used for a different request: mint a new key for a new operation")
                    .into_response())
            }
            Ok(Claim::InProgress { retry_after, .. }) => {
                let now = Instant::now();
                if now < deadline {
                    if let Some(_waiting) = Waiting::join(&config) {
                        // Woken when the holder finishes (or its lease ends); an error here
                        // shows again in the next claim, which answers it.
                        let _ = store.wait_async(&scope, &key, deadline - now).await;
                        continue;
                    }
                }
                return Ok(Problem::new(StatusCode::CONFLICT, types::IN_PROGRESS, "request in progress")
                    .detail("a request with this Idempotency-Key is being processed: retry later with the same key")
                    .retry_after(retry_after)
                    .into_response());
            }
            Err(Error::InvalidScope { part, reason }) => {
                return Ok(Problem::new(StatusCode::BAD_REQUEST, types::NO_TENANT, "invalid scope")
                    .detail(format!("the request's {part} cannot scope a key: {reason}"))
                    .into_response())
            }
            Err(Error::InvalidKey { reason }) => {
                return Ok(Problem::new(StatusCode::BAD_REQUEST, types::MALFORMED_KEY, "malformed Idempotency-Key")
                    .detail(reason.to_string())
                    .into_response())
            }
            Err(e @ Error::TenantFull { .. }) => {
                return Ok(Problem::new(StatusCode::TOO_MANY_REQUESTS, types::TENANT_FULL, "too many live idempotency records")
                    .detail(e.to_string())
                    .retry_after(TENANT_FULL_RETRY_AFTER)
                    .into_response())
            }
            // Never run the handler without a durable claim.
            Err(e) => {
                return Ok(Problem::new(StatusCode::SERVICE_UNAVAILABLE, types::STORE_UNAVAILABLE, "idempotency store unavailable")
                    .detail(e.to_string())
                    .retry_after(Duration::from_secs(1))
                    .into_response())
            }
        }
    };
    parts.extensions.insert(Claimed {
        key: key.clone(),
        fence: ticket.fence(),
        takeover: ticket.takeover().cloned(),
    });
    let req = Request::from_parts(parts, ReqB::from(bytes));
    let work = execute(Arc::clone(&config), inner, req, ticket);
    let Some(spawn) = &config.spawner else {
        return work.await;
    };
    // Detached: the handler runs to completion, and its outcome is stored, even if this request
    // future is dropped because the client went away (the seed's "response lost" case).
    let (tx, rx) = futures_channel::oneshot::channel();
    spawn(Box::pin(async move {
        // The request future may be gone (the client left): then nobody needs the response.
        let _ = tx.send(work.await);
    }));
    match rx.await {
        Ok(result) => result,
        Err(futures_channel::oneshot::Canceled) => Ok(Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            types::HANDLER_PANICKED,
            "internal error",
        )
        .detail("the handler task was dropped before it finished")
        .into_response()),
    }
}

/// Runs the handler for an acquired claim and stores or releases its outcome.
async fn execute<S, ReqB, ResB>(
    config: Arc<Config>,
    mut inner: S,
    req: Request<ReqB>,
    ticket: Ticket,
) -> Result<Response<ResB>, S::Error>
where
    S: tower::Service<Request<ReqB>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: http_body::Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ReqB::Error: Into<BoxError> + Send,
    ResB: http_body::Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ResB::Error: Into<BoxError> + Send,
{
    let store = &config.store;
    let mut held = Held {
        store: store.clone(),
        ticket: Some(ticket),
    };
    let run = Box::pin(AssertUnwindSafe(inner.call(req)).catch_unwind());
    let outcome = match config.heartbeat {
        Some(every) => with_heartbeat(run, &held, every).await,
        None => run.await,
    };
    let response = match outcome {
        Err(_panic) => {
            held.release().await;
            return Ok(Problem::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                types::HANDLER_PANICKED,
                "internal error",
            )
            .detail(
                "the handler failed; the Idempotency-Key was released, so a retry runs it again",
            )
            .into_response());
        }
        Ok(Err(e)) => {
            held.release().await;
            return Err(e);
        }
        Ok(Ok(response)) => response,
    };
    let (rparts, rbody) = response.into_parts();
    let limit = config.max_response_bytes;
    if rbody.size_hint().lower() > u64::try_from(limit).unwrap_or(u64::MAX) {
        // Too large to store, and known before any of it is read: it goes to the client as it
        // is. The side effect happened, so the claim is kept in progress (the ticket is
        // dropped: an orphan) rather than released.
        drop(held);
        return Ok(Response::from_parts(rparts, rbody));
    }
    let body = match Limited::new(rbody, limit).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<LengthLimitError>() => {
            drop(held);
            return Ok(Problem::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                types::RESPONSE_TOO_LARGE,
                "response too large to store",
            )
            .detail(format!(
                "the handler ran, but its response streamed past {limit} bytes, more than this \
                 service stores for replay; the Idempotency-Key stays in progress until its \
                 lease ends, then a retry runs as a takeover"
            ))
            .into_response());
        }
        Err(_) => {
            held.release().await;
            return Ok(Problem::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                types::HANDLER_PANICKED,
                "internal error",
            )
            .detail("the handler's response body failed; the Idempotency-Key was released")
            .into_response());
        }
    };
    match (config.policy)(rparts.status) {
        OutcomePolicy::Release => held.release().await,
        OutcomePolicy::Store => {
            let mut stored = crate::Response::new(rparts.status.as_u16(), body.to_vec());
            for (name, value) in &rparts.headers {
                if (config.stored_header)(name) {
                    stored = stored.with_header(name.as_str(), value.as_bytes());
                }
            }
            let ticket = held.ticket.take().expect("held until here");
            // If the response cannot be stored (too large, or the store failed), the claim stays
            // in progress: a retry gets 409 until the lease runs out, then runs with a takeover,
            // never silently twice.
            let _ = store.complete_async(ticket, stored).await;
        }
    }
    Ok(Response::from_parts(rparts, ResB::from(body)))
}

async fn read_body<B>(body: B, parts: &Parts, max: usize) -> Result<Bytes, Problem>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let too_large = || {
        Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            types::BODY_TOO_LARGE,
            "request body too large",
        )
        .detail(format!("the body exceeds {max} bytes; nothing was claimed"))
    };
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(too_large());
    }
    match Limited::new(body, max).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => Err(too_large()),
        Err(e) => Err(Problem::new(
            StatusCode::BAD_REQUEST,
            types::BODY_UNREADABLE,
            "request body unreadable",
        )
        .detail(e.to_string())),
    }
}

/// SHA-256 over the method, the path and query, and the body; a JSON body first in RFC 8785
/// canonical form, so that reordered keys and whitespace are the same request.
pub(crate) fn default_fingerprint(parts: &Parts, body: &Bytes) -> Fingerprint {
    let path = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path(), |pq| pq.as_str());
    let canonical = is_json(parts)
        .then(|| super::canonical::canonicalize(body).ok())
        .flatten();
    Fingerprint::builder()
        .part(parts.method.as_str().as_bytes())
        .part(path.as_bytes())
        .part(canonical.as_deref().unwrap_or(body))
        .finish()
}

fn is_json(parts: &Parts) -> bool {
    let Some(ct) = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json" || essence.ends_with("+json")
}

fn replay<B: From<Bytes>>(config: &Config, stored: crate::Response) -> Response<B> {
    let status = StatusCode::from_u16(stored.status()).unwrap_or(StatusCode::OK);
    let mut response = Response::new(B::from(Bytes::from(stored.body().to_vec())));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    for (name, value) in stored.headers() {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) {
            headers.append(n, v);
        }
    }
    headers.insert(
        config.replay_header.clone(),
        HeaderValue::from_static("true"),
    );
    response
}

/// The claim while the handler runs: released if the handler fails. If the request future is
/// dropped mid-handler (the client went away, and no spawner detaches the handler), the claim is
/// left in progress: the handler may already have performed the side effect, so releasing
/// would let the retry repeat it. The retry gets 409 until the lease runs out, then runs with a
/// takeover. Configure a spawner to have the handler finish and its response stored instead.
/// One duplicate's place among those waiting for an in-flight request
/// (`IdempotencyLayerBuilder::max_waiters`); given back when dropped.
struct Waiting<'c>(&'c Config);

impl<'c> Waiting<'c> {
    fn join(config: &'c Config) -> Option<Waiting<'c>> {
        let taken = config.waiters.fetch_add(1, Ordering::AcqRel);
        let waiting = Waiting(config);
        (taken < config.max_waiters).then_some(waiting)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiters.fetch_sub(1, Ordering::AcqRel);
    }
}

struct Held {
    store: Store,
    ticket: Option<Ticket>,
}

impl Held {
    async fn release(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            // A lost lease means someone else holds the key now: nothing to release.
            let _ = self.store.release_async(ticket).await;
        }
    }
}

/// Runs `run`, renewing the held claim's lease every `every`. The handler is not polled during
/// a renewal's fsync (about a millisecond), and no thread blocks on it.
async fn with_heartbeat<F: Future + Unpin>(mut run: F, held: &Held, every: Duration) -> F::Output {
    let lease = held.store.lease_duration();
    loop {
        let mut tick = sleep(every);
        let fired = std::future::poll_fn(|cx| {
            if let Poll::Ready(out) = Pin::new(&mut run).poll(cx) {
                return Poll::Ready(Err(out));
            }
            Pin::new(&mut tick).poll(cx).map(Ok)
        })
        .await;
        match fired {
            Err(out) => return out,
            Ok(()) => {
                if let Some(ticket) = &held.ticket {
                    let _ = held.store.extend_async(ticket, lease).await;
                }
            }
        }
    }
}
