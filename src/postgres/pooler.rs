//! Behind a connection pooler in transaction mode (PgBouncer's `pool_mode = transaction`, and
//! the poolers of managed databases that work the same way): each transaction may run on
//! another server session, so nothing may be left on a session between transactions.
//!
//! What the engine does differently in [`PoolMode::Transaction`]:
//!
//! - No prepared statements: each statement goes with its text and its parameters' types in
//!   one round trip (an unnamed statement, planned for its arguments each time: the server's
//!   planning the prepared statements save, about 130 µs of its CPU per statement measured on
//!   the claim batch).
//! - No session settings: the planner settings of `plans.rs` are not given, and
//!   `synchronous_commit` is checked, not set: a session whose commits are not durable
//!   (`off`, `local`, `remote_write`) is refused with what to set for the role instead.
//! - The schema's migration already runs in one transaction under a transaction-scoped
//!   advisory lock, which a transaction pooler keeps on one server session.

use super::url::invalid;
use crate::error::Result;

/// How the store's connections reach the server: their own sessions, or a pooler's shared
/// ones. Set with `pool_mode=` in the connection string or [`crate::StoreBuilder::pool_mode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum PoolMode {
    /// Each connection is one server session from start to end: a direct connection, or a
    /// pooler in session mode. Statements are prepared once per session.
    #[default]
    Session,
    /// A pooler in transaction mode: consecutive transactions of one connection may run on
    /// different server sessions. No statement is prepared and no session setting is made.
    Transaction,
}

impl PoolMode {
    pub(super) fn parse(value: &str) -> Result<PoolMode> {
        match value {
            "session" => Ok(PoolMode::Session),
            "transaction" => Ok(PoolMode::Transaction),
            other => Err(invalid(format!(
                "pool_mode={other}: expected session or transaction (a pooler in statement \
                 mode cannot run a transaction of several statements, which the import needs)"
            ))),
        }
    }
}
