//! The layer's settings, shared by the layer (which builds them) and the service (which reads
//! them). [`super::IdempotencyLayerBuilder`] documents each one and its default.

use super::policy::OutcomePolicy;
use crate::{Fingerprint, Store};
use ::http::request::Parts;
use ::http::{HeaderName, Method, StatusCode};
use bytes::Bytes;
use std::time::Duration;

type TenantFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;
type EndpointFn = dyn Fn(&Parts) -> String + Send + Sync;
type FingerprintFn = dyn Fn(&Parts, &Bytes) -> Fingerprint + Send + Sync;
type PolicyFn = dyn Fn(StatusCode) -> OutcomePolicy + Send + Sync;
type HeaderFn = dyn Fn(&HeaderName) -> bool + Send + Sync;
/// Runs a future to completion in the background (for example `tokio::spawn`).
pub(crate) type Spawner =
    dyn Fn(std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>) + Send + Sync;

pub(crate) struct Config {
    pub(crate) store: Store,
    pub(crate) methods: Vec<Method>,
    pub(crate) key_required: bool,
    pub(crate) key_header: HeaderName,
    pub(crate) tenant: Box<TenantFn>,
    pub(crate) endpoint: Box<EndpointFn>,
    pub(crate) fingerprint: Option<Box<FingerprintFn>>,
    pub(crate) max_body_bytes: usize,
    pub(crate) stored_header: Box<HeaderFn>,
    pub(crate) policy: Box<PolicyFn>,
    pub(crate) replay_header: HeaderName,
    pub(crate) wait: Duration,
    /// The most duplicates waiting at once (`wait > 0`); more get 409 at once.
    pub(crate) max_waiters: usize,
    /// Duplicates waiting now.
    pub(crate) waiters: crate::sync::AtomicUsize,
    /// The most bytes of a handler's response body the layer buffers to store it.
    pub(crate) max_response_bytes: usize,
    pub(crate) heartbeat: Option<Duration>,
    pub(crate) spawner: Option<Box<Spawner>>,
}
