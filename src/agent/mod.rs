//! Agent tool calls made effectively-once: keys the harness mints from identifiers it owns, and
//! a gateway that claims before a tool's side effect runs and replays its result on a retry.
//!
//! A model is itself a retry layer: after a timeout it calls the tool again, often with
//! reworded arguments, and an agent resumed from a checkpoint replays its steps. Keys derived
//! from (task, step, tool), never from the arguments and never from the model, make all of
//! those retries land on the same record. See `docs/agents.md`.
//!
//! The gateway speaks [`crate::IdempotentFn`]'s vocabulary: a tool gets the claim as an
//! [`crate::Attempt`], fails with a [`crate::Failure`], and abandoned calls are resolved with
//! the store's [`crate::StaleClaim`] and [`crate::Resolution`].

mod gateway;
mod key;

pub use gateway::{ArgumentPolicy, Gateway, GatewayBuilder, Outcome, ToolResult};
pub use key::ToolCallKey;
