//! idemdb: an embedded, crash-safe idempotency-key store.
//!
//! A client that times out cannot tell "never happened" from "happened, response lost". It
//! retries with the same idempotency key, and idemdb makes that retry safe: the key is
//! **claimed** durably before the side effect runs, the whole response is **completed** into the
//! store, and every later attempt **replays** it byte for byte. A concurrent duplicate learns
//! the key is in progress (HTTP 409); a reused key with a different request is a mismatch
//! (HTTP 422). Keys are scoped by (tenant, endpoint, key), expire after a TTL (24 h by default),
//! and claims abandoned by a crash are handed to a reaper.
//!
//! ```
//! use idemdb::{Claim, Fingerprint, Response, Scope, Store};
//! let dir = tempfile::tempdir()?;
//! let store = Store::open(dir.path().join("payments.idem"))?;
//! let scope = Scope::new("tenant_42", "POST /v1/payments");
//! let body = br#"{"amount":5000,"currency":"usd"}"#;
//! let response = match store.claim(&scope, "7c9e6679-7425-40de-944b", Fingerprint::of(body))? {
//!     Claim::Acquired(ticket) => {
//!         let response = Response::new(201, r#"{"id":"pay_1"}"#)
//!             .with_header("content-type", "application/json");
//!         store.complete(ticket, response.clone())?; // durable before it returns
//!         response
//!     }
//!     Claim::Replay(stored) => stored,                 // byte for byte
//!     Claim::InProgress { retry_after, .. } => todo!("409, Retry-After: {retry_after:?}"),
//!     Claim::Mismatch { .. } => todo!("422"),
//! };
//! assert_eq!(response.status(), 201);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`IdempotentFn`] does that bookkeeping around a closure: it runs at most once per key, and
//! every later call gets what it returned (`docs/functions.md`).
//!
//! One process owns one store file. Services that run many replicas use the same `Store` on a
//! PostgreSQL database they share: feature `postgres`, `Store::connect(url)`
//! (`docs/postgres.md`).
//!
//! See `docs/design.md` for the architecture and the crash-recovery argument, and
//! `docs/format.md` for the on-disk format.

// A library does not write to its host's terminal: it returns errors and counters.
#![warn(clippy::print_stdout, clippy::print_stderr)]

pub mod agent;
mod builder;
mod clock;
mod config;
mod engine;
mod error;
mod file;
#[cfg(feature = "http")]
pub mod http;
mod idempotent;
mod model;
mod observe;
#[cfg(feature = "postgres")]
mod postgres;
mod replay_cache;
#[cfg(any(test, fuzzing, feature = "simulation"))]
#[doc(hidden)]
pub mod simulation;
mod stats;
mod store;
mod sync;
mod timer;

#[cfg(feature = "postgres")]
pub use builder::validate_schema;
pub use builder::StoreBuilder;
pub use clock::{Clock, ManualClock, SystemClock};
pub use config::{PageCheck, StalePolicy};
pub use error::{Damaged, Error, InputProblem, Result, StorageError};
pub use idempotent::{Attempt, CallOutcome, Failure, IdempotentFn, IdempotentFnBuilder};
pub use model::census::{Census, OldestClaim};
pub use model::claim::{Claim, Entry, EntryState, Resolution, StaleClaim, Takeover};
pub use model::fingerprint::{Fingerprint, FingerprintBuilder};
pub use model::listing::{ListedRecord, Query, RecordStatus};
pub use model::response::{Response, MAX_RESPONSE_LIMIT};
pub use model::scope::{validate_key, Scope, MAX_ENDPOINT_LEN, MAX_KEY_LEN, MAX_TENANT_LEN};
pub use model::ticket::Ticket;
#[cfg(feature = "postgres")]
pub use postgres::pooler::PoolMode;
#[cfg(feature = "postgres")]
pub use postgres::tls::SslMode;
pub use stats::Stats;
pub use store::Store;

#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/agents.md")]
struct AgentsDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/operations.md")]
struct OperationsDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/functions.md")]
struct FunctionsDoctests;
