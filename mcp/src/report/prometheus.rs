//! The gateway's metrics, recorded through the `metrics` facade into a Prometheus recorder that
//! the store's own metrics (idemdb's `metrics` feature) share.
//!
//! No metric is labelled by tenant or tool: both come from clients, unbounded, and a label per
//! value would grow the exporter's memory and every scrape without end. The events (feature
//! `tracing`) carry them instead.

use super::Counted;
use metrics::{Counter, Histogram, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::sync::OnceLock;
use std::time::Duration;

const CALLS: &str = "idemdb_mcp_tool_calls_total";
const WAITED_CALLS: &str = "idemdb_mcp_waited_calls_total";
const WAIT_SECONDS: &str = "idemdb_mcp_wait_seconds";

/// The wait's histogram buckets, in seconds: from just above [`super::WAITED`] to past the
/// default `--wait` of 30 s.
const WAIT_BUCKETS: [f64; 12] = [
    0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// The handles every count goes to, registered once with the installed recorder.
struct Meters {
    calls: [Counter; Counted::ALL.len()],
    waited: Counter,
    wait: Histogram,
}

static METERS: OnceLock<Meters> = OnceLock::new();

/// Installs the Prometheus recorder as the process's (before the store opens, so that the
/// store's metrics land in it too) and registers the gateway's metrics, each outcome's count
/// at zero so that every series is there from the first scrape.
pub(super) fn install() -> Result<PrometheusHandle, String> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(WAIT_SECONDS.into()), &WAIT_BUCKETS)
        .and_then(PrometheusBuilder::install_recorder)
        .map_err(|e| format!("--metrics: {e}"))?;
    metrics::describe_counter!(
        CALLS,
        Unit::Count,
        "tools/call requests, by outcome: executed, replayed, in_progress, unknown, released, \
         refused, failed, unkeyed, read_only"
    );
    metrics::describe_counter!(
        WAITED_CALLS,
        Unit::Count,
        "keyed tools/call requests that waited for a duplicate in flight"
    );
    metrics::describe_histogram!(
        WAIT_SECONDS,
        Unit::Seconds,
        "how long a keyed tools/call waited for a duplicate in flight"
    );
    let meters = METERS.get_or_init(|| Meters {
        calls: Counted::ALL.map(|outcome| metrics::counter!(CALLS, "outcome" => outcome.label())),
        waited: metrics::counter!(WAITED_CALLS),
        wait: metrics::histogram!(WAIT_SECONDS),
    });
    for counter in meters.calls.iter().chain([&meters.waited]) {
        counter.increment(0);
    }
    Ok(handle)
}

/// Counts a call: its outcome, and its wait if it waited.
pub(super) fn record(outcome: Counted, waited: Option<Duration>) {
    let Some(meters) = METERS.get() else {
        return; // No `--metrics`: nothing to count for.
    };
    // `Counted::ALL` lists the outcomes in declaration order (a test in `report` checks it).
    meters.calls[outcome as usize].increment(1);
    if let Some(waited) = waited {
        meters.waited.increment(1);
        meters.wait.record(waited.as_secs_f64());
    }
}
