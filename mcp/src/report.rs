//! What the gateway reports of its tool calls: one count per `tools/call` by its outcome.
//! Without the `metrics` and `tracing` features, counting compiles to nothing.

/// What became of one `tools/call`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counted {
    /// Keyed, and forwarded: the tool ran in this call, its result stored.
    Executed,
    /// Keyed, and answered with the stored result of an earlier call.
    Replayed,
    /// Keyed, and another call of the step was still running after the wait.
    InProgress,
    /// Keyed, and the step's outcome is unknown (its upstream or gateway was lost mid-call).
    Unknown,
    /// Keyed, and the upstream answered a JSON-RPC error: the key was released.
    Released,
    /// Refused by the gateway (a key given badly, strict mode, changed arguments).
    Refused,
    /// Keyed, and the gateway's store failed.
    Failed,
    /// A tool that is keyed, called without a key: passed through.
    Unkeyed,
    /// A read-only tool: passed through, never keyed.
    ReadOnly,
}

impl Counted {
    /// The outcome's label, as the metrics and events show it.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Counted::Executed => "executed",
            Counted::Replayed => "replayed",
            Counted::InProgress => "in_progress",
            Counted::Unknown => "unknown",
            Counted::Released => "released",
            Counted::Refused => "refused",
            Counted::Failed => "failed",
            Counted::Unkeyed => "unkeyed",
            Counted::ReadOnly => "read_only",
        }
    }
}

/// Counts one `tools/call` of `tool` (for `tenant`), how long the gateway held it (`waited`:
/// how long a duplicate waited for the call in flight, when it did).
pub(crate) fn count(
    outcome: Counted,
    tenant: &str,
    tool: &str,
    waited: Option<std::time::Duration>,
) {
    let _ = (outcome, tenant, tool, waited);
}
