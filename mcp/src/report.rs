//! What the gateway reports of its tool calls: one count per `tools/call` by its outcome, and
//! the keyed calls that waited for a duplicate in flight. Feature `metrics` counts them for
//! Prometheus (`report/prometheus.rs`, served by `report/scrape.rs`); feature `tracing` writes
//! one event per call to stderr (`report/events.rs`). Without either, counting compiles to
//! nothing.

#[cfg(feature = "tracing")]
mod events;
#[cfg(feature = "metrics")]
mod prometheus;
#[cfg(feature = "metrics")]
mod scrape;

use std::net::SocketAddr;
use std::time::Duration;

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
    /// Every outcome, in the order the metrics list them.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) const ALL: [Counted; 9] = [
        Counted::Executed,
        Counted::Replayed,
        Counted::InProgress,
        Counted::Unknown,
        Counted::Released,
        Counted::Refused,
        Counted::Failed,
        Counted::Unkeyed,
        Counted::ReadOnly,
    ];

    /// The outcome's label, as the metrics and events show it.
    #[cfg_attr(not(any(feature = "metrics", feature = "tracing")), allow(dead_code))]
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

/// A keyed call that did not execute and was answered after this long waited for a duplicate
/// in flight. Answering a replay or an in-progress without waiting is one claim: a replay
/// through the gateway took 0.3 ms at p99 on a file store and on a local PostgreSQL alike
/// (`benches/latency.rs`, 2,000 calls on 2 busy CPUs), and a database a few hops away adds a
/// few ms; a real wait lasts until a tool call in flight ends. A wait shorter than this (a
/// duplicate that raced a tool of a few ms) goes uncounted. The library does not say whether
/// a call waited; until it does, this bound tells one from the other.
pub(crate) const WAITED: Duration = Duration::from_millis(10);

/// Whether a keyed call answered `outcome` after `elapsed` (from its start) waited for a
/// duplicate in flight, and how long.
fn waited(outcome: Counted, elapsed: Option<Duration>) -> Option<Duration> {
    elapsed.filter(|elapsed| {
        matches!(outcome, Counted::Replayed | Counted::InProgress) && *elapsed >= WAITED
    })
}

/// Counts one `tools/call` of `tool` (for `tenant`) that had no key: passed through, or refused
/// before it had one. It never waited (only keyed calls do): `elapsed` is not read.
pub(crate) fn count(outcome: Counted, tenant: &str, tool: &str, elapsed: Option<Duration>) {
    let _ = elapsed;
    record(outcome, tenant, tool, None, None);
}

/// Counts one keyed `tools/call` of `key` (for `tenant`); `elapsed` is the time from the call's
/// start to its answer, given for calls that did not execute (see [`WAITED`]).
pub(crate) fn count_keyed(
    outcome: Counted,
    tenant: &str,
    key: &idemdb::agent::ToolCallKey,
    elapsed: Option<Duration>,
) {
    record(
        outcome,
        tenant,
        key.tool(),
        Some(key.as_str()),
        waited(outcome, elapsed),
    );
}

#[allow(unused_variables)]
fn record(outcome: Counted, tenant: &str, tool: &str, key: Option<&str>, waited: Option<Duration>) {
    #[cfg(feature = "metrics")]
    prometheus::record(outcome, waited);
    #[cfg(feature = "tracing")]
    events::record(outcome, tenant, tool, key, waited);
}

/// Reporting as it was started: the Prometheus endpoint to serve, if `--metrics` asked for one.
pub(crate) struct Reporting {
    #[cfg(feature = "metrics")]
    endpoint: Option<scrape::Endpoint>,
}

/// Starts reporting, before the store opens (a store registers its own metrics with the
/// recorder installed as it opens): the tracing subscriber on stderr (feature `tracing`), and
/// for `--metrics ADDRESS` the Prometheus recorder and the bound listener (feature `metrics`;
/// without it, an error naming the feature to build with).
#[allow(unused_variables)]
pub(crate) fn start(metrics: Option<SocketAddr>) -> Result<Reporting, String> {
    #[cfg(feature = "tracing")]
    events::start();
    #[cfg(feature = "metrics")]
    {
        let endpoint = match metrics {
            Some(address) => Some(scrape::Endpoint::bind(address, prometheus::install()?)?),
            None => None,
        };
        Ok(Reporting { endpoint })
    }
    #[cfg(not(feature = "metrics"))]
    match metrics {
        Some(address) => Err(format!(
            "--metrics {address}: this idemdb-mcp was built without the `metrics` feature \
             (cargo install --path mcp --features metrics)"
        )),
        None => Ok(Reporting {}),
    }
}

impl Reporting {
    /// Serves `/metrics` (if asked for) on the current tokio runtime, until the process ends;
    /// says where on stderr.
    pub(crate) fn serve(self) -> Result<(), String> {
        #[cfg(feature = "metrics")]
        if let Some(endpoint) = self.endpoint {
            endpoint.serve()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_replay_or_in_progress_answered_late_waited() {
        let late = Some(WAITED);
        assert_eq!(waited(Counted::Replayed, late), late);
        assert_eq!(waited(Counted::InProgress, late), late);
        assert_eq!(
            waited(Counted::Replayed, Some(WAITED / 2)),
            None,
            "a replay answered at once"
        );
        for outcome in Counted::ALL {
            if !matches!(outcome, Counted::Replayed | Counted::InProgress) {
                assert_eq!(waited(outcome, late), None, "{outcome:?}");
            }
        }
        assert_eq!(waited(Counted::Replayed, None), None);
    }

    #[test]
    fn labels_are_distinct_prometheus_label_values() {
        let labels: std::collections::HashSet<_> = Counted::ALL.map(Counted::label).into();
        assert_eq!(labels.len(), Counted::ALL.len());
        for (index, outcome) in Counted::ALL.into_iter().enumerate() {
            assert_eq!(outcome as usize, index, "ALL is in declaration order");
        }
        assert!(labels
            .iter()
            .all(|l| l.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')));
    }
}
