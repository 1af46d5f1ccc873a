//! The layer and its builder: every default written down.

use super::config::Config;
use super::policy::{default_outcome_policy, default_stored_header, OutcomePolicy};
use super::service::IdempotencyService;
use crate::sync::{Arc, AtomicUsize};
use crate::{Fingerprint, Store};
use ::http::request::Parts;
use ::http::{HeaderName, Method, StatusCode};
use bytes::Bytes;
use std::time::Duration;

/// A tower layer that implements the `Idempotency-Key` header field
/// (draft-ietf-httpapi-idempotency-key-header) over a [`Store`].
///
/// ```
/// use idemdb::http::IdempotencyLayer;
/// let store = idemdb::Store::in_memory()?;
/// let layer = IdempotencyLayer::builder(store, |parts: &http::request::Parts| {
///     // The tenant: an API key header here; an auth extension in a real service.
///     parts.headers.get("x-api-key")?.to_str().ok().map(str::to_owned)
/// })
/// // Recommended: a handler whose client hung up still finishes, and its response is stored
/// // for the retry (see `IdempotencyLayerBuilder::spawner`).
/// .spawner(|handler| {
///     tokio::spawn(handler);
/// })
/// .build();
/// // axum: Router::new().route("/v1/payments", post(create)).layer(layer)
/// # let _ = layer;
/// # Ok::<(), idemdb::Error>(())
/// ```
#[derive(Clone)]
pub struct IdempotencyLayer {
    pub(crate) config: Arc<Config>,
}

impl std::fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("methods", &self.config.methods)
            .field("key_required", &self.config.key_required)
            .field("max_body_bytes", &self.config.max_body_bytes)
            .field("wait", &self.config.wait)
            .finish_non_exhaustive()
    }
}

impl IdempotencyLayer {
    /// A builder over `store`; `tenant` finds the tenant of a request from its parts (an API
    /// key header, an auth extension). A request whose tenant it cannot find is refused with
    /// 401, never stored unscoped.
    pub fn builder(
        store: Store,
        tenant: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> IdempotencyLayerBuilder {
        IdempotencyLayerBuilder {
            config: Config {
                store,
                methods: vec![Method::POST, Method::PATCH],
                key_required: true,
                key_header: HeaderName::from_static("idempotency-key"),
                tenant: Box::new(tenant),
                endpoint: Box::new(|parts: &Parts| {
                    let route = parts
                        .extensions
                        .get::<MatchedPath>()
                        .map_or_else(|| parts.uri.path().to_owned(), |m| m.0.to_string());
                    format!("{} {route}", parts.method)
                }),
                fingerprint: None,
                max_body_bytes: 1 << 20,
                stored_header: Box::new(default_stored_header),
                policy: Box::new(default_outcome_policy),
                replay_header: HeaderName::from_static("idempotent-replayed"),
                wait: Duration::ZERO,
                max_waiters: 1024,
                waiters: AtomicUsize::new(0),
                max_response_bytes: 1 << 20,
                heartbeat: None,
                spawner: None,
            },
        }
    }
}

/// A route template (such as `/v1/payments/{id}`) a router may put in the request's extensions
/// for the default endpoint to use instead of the concrete path. Insert it in a layer before
/// this one, or set [`IdempotencyLayerBuilder::endpoint`].
#[derive(Debug, Clone)]
pub struct MatchedPath(pub Arc<str>);

/// Configures an [`IdempotencyLayer`].
#[must_use]
pub struct IdempotencyLayerBuilder {
    config: Config,
}

impl std::fmt::Debug for IdempotencyLayerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyLayerBuilder")
            .finish_non_exhaustive()
    }
}

impl IdempotencyLayerBuilder {
    /// The methods the layer guards; others pass through untouched. Default: `POST`, `PATCH`.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.config.methods = methods.into_iter().collect();
        self
    }

    /// Whether a guarded request without a key is refused (400) or passed through unguarded.
    /// Default: refused.
    pub fn key_required(mut self, required: bool) -> Self {
        self.config.key_required = required;
        self
    }

    /// The endpoint part of the scope. Default: the method and the route (a [`MatchedPath`] in
    /// the extensions, else the URI path), such as `"POST /v1/payments"`.
    pub fn endpoint(mut self, f: impl Fn(&Parts) -> String + Send + Sync + 'static) -> Self {
        self.config.endpoint = Box::new(f);
        self
    }

    /// What makes two requests "the same request". Default: SHA-256 over the method, the path
    /// and the body, a JSON body (by `Content-Type`) first put in RFC 8785 canonical form so
    /// reordered keys and whitespace do not count.
    pub fn fingerprint(
        mut self,
        f: impl Fn(&Parts, &Bytes) -> Fingerprint + Send + Sync + 'static,
    ) -> Self {
        self.config.fingerprint = Some(Box::new(f));
        self
    }

    /// The largest request body the layer reads; a larger one is refused with 413 and nothing
    /// is claimed. Default: 1 MiB.
    pub fn max_body_bytes(mut self, limit: usize) -> Self {
        self.config.max_body_bytes = limit;
        self
    }

    /// Which response headers are stored and replayed. Default:
    /// [`default_stored_header`].
    pub fn stored_headers(
        mut self,
        f: impl Fn(&HeaderName) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.config.stored_header = Box::new(f);
        self
    }

    /// Whether a handler's response is stored or its key released. Default:
    /// [`default_outcome_policy`].
    pub fn outcome_policy(
        mut self,
        f: impl Fn(StatusCode) -> OutcomePolicy + Send + Sync + 'static,
    ) -> Self {
        self.config.policy = Box::new(f);
        self
    }

    /// The header a replayed response carries, with the value `true`. Default:
    /// `Idempotent-Replayed`.
    pub fn replay_header(mut self, name: HeaderName) -> Self {
        self.config.replay_header = name;
        self
    }

    /// Opt-in: a duplicate of an in-flight request waits up to `bound` for the first to finish
    /// and then gets its replay, instead of an immediate 409. Default: zero (409 at once).
    pub fn wait_for_in_flight(mut self, bound: Duration) -> Self {
        self.config.wait = bound;
        self
    }

    /// With [`IdempotencyLayerBuilder::wait_for_in_flight`], the most duplicates that wait at
    /// once (each holds a request, its connection and a timer); more get 409 with `Retry-After`
    /// at once, as without waiting. Default: 1024.
    pub fn max_waiters(mut self, limit: usize) -> Self {
        self.config.max_waiters = limit;
        self
    }

    /// The most bytes of a handler's response body the layer buffers to store it. Default:
    /// 1 MiB, the store's own default limit (`StoreBuilder::max_response_bytes`).
    ///
    /// A response over it cannot be stored for replay. The side effect has happened, so its
    /// claim is not released: it stays in progress (an orphan, which `reap` offers at once;
    /// retries get 409 until the lease ends, then run as a takeover that reconciles). A body
    /// that declares its length (`Content-Length`, an exact size hint) over the limit reaches
    /// the client whole, unbuffered; one that streams past the limit cannot (its first part is
    /// consumed), and the client gets a 500 problem `response-too-large` instead.
    pub fn max_response_bytes(mut self, limit: usize) -> Self {
        self.config.max_response_bytes = limit;
        self
    }

    /// Opt-in: while a handler runs, renew its claim's lease every `every`, so a slow request
    /// is not taken over. Choose `every` well below the store's lease. Default: off.
    pub fn heartbeat(mut self, every: Duration) -> Self {
        self.config.heartbeat = Some(every);
        self
    }

    /// Recommended: how to run a handler detached from its request, e.g.
    /// `.spawner(|f| { tokio::spawn(f); })`. With a spawner, a handler whose client went away
    /// (the response was lost) still finishes, and its response is stored for the retry to
    /// replay. Without one, such a handler is cancelled with its request, and its claim is left in
    /// progress, because it may already have performed the side effect: a retry gets 409 with
    /// `Retry-After` at the lease's end, then runs as a takeover. Default: none (the layer
    /// depends on no runtime, so it cannot spawn by itself).
    ///
    /// Either way, a client that hangs up before its claim is durable (before any handler ran)
    /// does not hold the key: the claim is withdrawn and the retry runs at once.
    pub fn spawner(
        mut self,
        spawn: impl Fn(std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>)
            + Send
            + Sync
            + 'static,
    ) -> Self {
        self.config.spawner = Some(Box::new(spawn));
        self
    }

    /// The layer.
    pub fn build(self) -> IdempotencyLayer {
        IdempotencyLayer {
            config: Arc::new(self.config),
        }
    }
}

impl<S> tower::Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> IdempotencyService<S> {
        IdempotencyService {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}
