//! Upstream servers: where the gateway forwards what the client asks.

pub(crate) mod child;
