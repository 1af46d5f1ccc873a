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
