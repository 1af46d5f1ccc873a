//! HTTP: a tower layer that implements the `Idempotency-Key` header field end to end
//! (draft-ietf-httpapi-idempotency-key-header, and Stripe's documented behaviour) over a
//! [`crate::Store`]. Enabled by the `http` feature. See `docs/http.md`.

mod canonical;
mod config;
mod key;
mod layer;
mod policy;
mod problem;
mod service;

pub use layer::{IdempotencyLayer, IdempotencyLayerBuilder, MatchedPath};
pub use policy::{default_outcome_policy, default_stored_header, OutcomePolicy};
pub use problem::types as problem_types;
pub use service::{Claimed, IdempotencyService};

/// The layer's parsers of untrusted bytes, for idemdb's own fuzz targets (`fuzz/`): not part of
/// the stable API, present only under `cfg(fuzzing)` or the `simulation` feature.
#[cfg(any(fuzzing, feature = "simulation"))]
#[doc(hidden)]
pub mod fuzzing {
    /// The deepest nesting of arrays and objects a request body may have.
    pub const MAX_DEPTH: usize = super::canonical::MAX_DEPTH;

    /// Parses a request's `Idempotency-Key` fields, as the layer does: `None` if a value is not
    /// a valid header value at all (`http` refuses it before the layer sees it), else the key,
    /// `Ok(None)` for no field, or why the layer answers 400.
    pub fn idempotency_key(values: &[&[u8]]) -> Option<Result<Option<String>, String>> {
        let name = ::http::HeaderName::from_static("idempotency-key");
        let mut headers = ::http::HeaderMap::new();
        for value in values {
            let value = ::http::HeaderValue::from_bytes(value).ok()?;
            headers.append(name.clone(), value);
        }
        Some(super::key::parse(&headers, &name).map_err(|problem| format!("{problem:?}")))
    }

    /// The RFC 8785 canonical form of a request body, as the layer fingerprints it, or why
    /// there is none (the layer answers 400).
    pub fn canonicalize(body: &[u8]) -> Result<Vec<u8>, String> {
        super::canonical::canonicalize(body).map_err(|e| e.to_string())
    }
}
