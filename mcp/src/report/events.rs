//! One event per `tools/call`, through `tracing`, written to stderr (stdout is the MCP channel
//! on stdio) and filtered by `RUST_LOG` (default `info`).
//!
//! An event names the outcome, the tool, the tenant and, for a keyed call, its key: the key is
//! what an operator needs to look an unknown outcome up (`idemdb list`) and settle it
//! (`idemdb resolve`). Keys are the harness's task and step ids, not secrets; arguments and
//! results are never in an event.

use super::Counted;
use std::time::Duration;
use tracing_subscriber::filter::{EnvFilter, LevelFilter};

/// A call's event, under the target `idemdb_mcp` (`RUST_LOG=idemdb_mcp=warn` keeps only the
/// unknown and failed calls).
macro_rules! call_event {
    ($level:ident, $outcome:expr, $tenant:expr, $tool:expr, $key:expr, $waited:expr) => {
        tracing::$level!(
            target: "idemdb_mcp",
            outcome = $outcome.label(),
            tool = $tool,
            tenant = $tenant,
            key = $key,
            waited_ms = $waited,
            "tools/call"
        )
    };
}

/// Installs the subscriber: events to stderr, filtered by `RUST_LOG` (`info` when unset; a
/// directive it cannot read is skipped).
pub(super) fn start() {
    let filter = EnvFilter::builder()
        .with_default_directive(LevelFilter::INFO.into())
        .from_env_lossy();
    // Fails only if a subscriber is installed already: that one is kept.
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .try_init();
}

/// The event of one call. An unknown outcome waits for an operator, so it is a warning; a
/// store that failed is an error.
pub(super) fn record(
    outcome: Counted,
    tenant: &str,
    tool: &str,
    key: Option<&str>,
    waited: Option<Duration>,
) {
    let waited = waited.map(|w| w.as_millis() as u64);
    match outcome {
        Counted::Unknown => call_event!(warn, outcome, tenant, tool, key, waited),
        Counted::Failed => call_event!(error, outcome, tenant, tool, key, waited),
        _ => call_event!(info, outcome, tenant, tool, key, waited),
    }
}
