//! The results: one row per cell, printed as a fixed-width table, written as CSV, and
//! summarised as ratios.

use crate::measure;
use crate::runner::{Callers, Outcome, Spec};
use std::fmt::Write;

/// One cell's figures.
#[derive(Debug, Clone)]
pub struct Row {
    /// System name.
    pub system: &'static str,
    /// Keys preloaded before the system's first cell.
    pub keys: u64,
    /// Workload name.
    pub workload: &'static str,
    /// Caller threads, or processes x threads (`64`, `4x16`).
    pub callers: Callers,
    /// Requests completed in the window.
    pub ops: u64,
    /// Requests per second.
    pub throughput: f64,
    /// Claim latency p50, p99, p99.9, in microseconds.
    pub claim_us: Option<[f64; 3]>,
    /// Claim+complete latency p50, p99, p99.9, in microseconds (cycle workload only).
    pub cycle_us: Option<[f64; 3]>,
    /// Bytes the device wrote per request.
    pub bytes_per_op: Option<f64>,
    /// Device flushes per request.
    pub flushes_per_op: Option<f64>,
    /// Busy CPU time per request, machine-wide, in microseconds.
    pub cpu_us_per_op: Option<f64>,
    /// CPU time per request of the harness and server processes only, in microseconds.
    pub own_cpu_us_per_op: Option<f64>,
    /// Share of the machine's CPU capacity busy with anything else during the window, in %.
    pub others_pct: f64,
    /// The system's own fsync (commit) count per request.
    pub fsyncs_per_op: Option<f64>,
}

fn to_us(ns: Option<[u64; 3]>) -> Option<[f64; 3]> {
    ns.map(|v| v.map(|x| x as f64 / 1000.0))
}

impl Row {
    /// The row for one cell's outcome.
    pub fn new(
        system: &'static str,
        keys: u64,
        spec: &Spec,
        mut out: Outcome,
        tps: u64,
        cpus: usize,
    ) -> Row {
        let ops = out.ops;
        let capacity = out.window.as_secs_f64() * tps as f64 * cpus.max(1) as f64;
        let others = out.busy_ticks.saturating_sub(out.own_ticks) as f64;
        let per_op = |x: f64| (ops > 0).then(|| x / ops as f64);
        Row {
            system,
            keys,
            workload: spec.workload.name(),
            callers: spec.callers,
            ops,
            throughput: ops as f64 / out.window.as_secs_f64(),
            claim_us: to_us(measure::summarize(&mut out.claim_ns)),
            cycle_us: to_us(measure::summarize(&mut out.cycle_ns)),
            bytes_per_op: out
                .disk
                .and_then(|d| per_op(d.sectors_written as f64 * 512.0)),
            flushes_per_op: out
                .disk
                .and_then(|d| d.flushes)
                .and_then(|f| per_op(f as f64)),
            cpu_us_per_op: per_op(out.busy_ticks as f64 * 1e6 / tps as f64),
            own_cpu_us_per_op: per_op(out.own_ticks as f64 * 1e6 / tps as f64),
            others_pct: 100.0 * others / capacity,
            fsyncs_per_op: out.fsyncs.and_then(|f| per_op(f as f64)),
        }
    }
}

/// A latency or per-op figure with as many decimals as it deserves.
fn num(x: Option<f64>) -> String {
    match x {
        None => "-".into(),
        Some(x) if x >= 100.0 => format!("{x:.0}"),
        Some(x) if x >= 10.0 => format!("{x:.1}"),
        Some(x) => format!("{x:.2}"),
    }
}

const COLUMNS: [(&str, usize); 18] = [
    ("system", 11),
    ("keys", 9),
    ("work", 5),
    ("callers", 7),
    ("ops/s", 9),
    ("claim50", 8),
    ("claim99", 8),
    ("claim999", 8),
    ("cycle50", 8),
    ("cycle99", 8),
    ("cycle999", 8),
    ("B/op", 8),
    ("flush/op", 8),
    ("cpu_us/op", 9),
    ("own_us/op", 9),
    ("other%", 6),
    ("fsync/op", 8),
    ("ops", 8),
];

fn line(cells: &[String]) -> String {
    let mut out = String::new();
    for (i, (cell, (_, width))) in cells.iter().zip(COLUMNS).enumerate() {
        if i == 0 {
            let _ = write!(out, "{cell:<width$}");
        } else {
            let _ = write!(out, " {cell:>width$}");
        }
    }
    out
}

/// The table's header lines.
pub fn header() -> String {
    let names: Vec<String> = COLUMNS.iter().map(|(n, _)| (*n).to_string()).collect();
    let head = line(&names);
    format!("{head}\n{}", "-".repeat(head.len()))
}

fn cells(r: &Row) -> Vec<String> {
    let lat = |v: Option<[f64; 3]>, i: usize| num(v.map(|v| v[i]));
    vec![
        r.system.to_string(),
        r.keys.to_string(),
        r.workload.to_string(),
        r.callers.to_string(),
        format!("{:.0}", r.throughput),
        lat(r.claim_us, 0),
        lat(r.claim_us, 1),
        lat(r.claim_us, 2),
        lat(r.cycle_us, 0),
        lat(r.cycle_us, 1),
        lat(r.cycle_us, 2),
        r.bytes_per_op.map_or("-".into(), |b| format!("{b:.0}")),
        num(r.flushes_per_op),
        num(r.cpu_us_per_op),
        num(r.own_cpu_us_per_op),
        format!("{:.0}", r.others_pct),
        num(r.fsyncs_per_op),
        r.ops.to_string(),
    ]
}

/// One row of the table.
pub fn table_row(r: &Row) -> String {
    line(&cells(r))
}

/// What the table's columns mean.
pub const LEGEND: &str = "\
ops/s: requests per second (a request is a claim, or a claim then a complete for `cycle`).
claim50/99/999, cycle50/99/999: latency percentiles in microseconds (cycle = claim + complete).
B/op: bytes written to the data directory's block device per request (/proc/diskstats).
flush/op: device flush (cache barrier) requests per request, same source.
cpu_us/op: busy CPU time of the whole machine per request (/proc/stat): the harness's clients
  plus any server process, since everything runs on this one box; anything else running counts too.
own_us/op: CPU time per request of the harness process (and its child processes in a PxC
  cell) and the postgres/redis processes only (/proc/PID/stat); kernel threads doing their I/O
  are not in it.
callers: N caller threads in the harness process (blocking API); Nt: N tokio tasks on a
  multi-thread runtime in the harness process (idemdb's async API); or PxC: P harness processes
  of C caller threads each, measuring the one shared server at once.
work: claim, cycle (claim + complete), charge (cycle with 1-4 KB JSON charges as responses).
other%: share of the machine's CPU busy with anything else (machine-wide minus own) during the
  window; a row with a high figure was measured next to other work and is suspect.
fsync/op: the system's own commit count per request (idemdb's commit_batches), where it has one.";

/// Quotes a CSV field if it needs it (RFC 4180).
pub fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// The rows as CSV, with a header line.
pub fn csv(rows: &[Row]) -> String {
    let mut out = String::from(
        "system,keys,workload,callers,ops,ops_per_s,claim_p50_us,claim_p99_us,claim_p999_us,\
         cycle_p50_us,cycle_p99_us,cycle_p999_us,bytes_per_op,flushes_per_op,cpu_us_per_op,\
         own_cpu_us_per_op,others_cpu_pct,fsyncs_per_op\n",
    );
    let opt = |x: Option<f64>| x.map_or(String::new(), |x| format!("{x:.3}"));
    for r in rows {
        let lat = |v: Option<[f64; 3]>, i: usize| opt(v.map(|v| v[i]));
        let fields = [
            csv_field(r.system),
            r.keys.to_string(),
            csv_field(r.workload),
            csv_field(&r.callers.to_string()),
            r.ops.to_string(),
            format!("{:.1}", r.throughput),
            lat(r.claim_us, 0),
            lat(r.claim_us, 1),
            lat(r.claim_us, 2),
            lat(r.cycle_us, 0),
            lat(r.cycle_us, 1),
            lat(r.cycle_us, 2),
            opt(r.bytes_per_op),
            opt(r.flushes_per_op),
            opt(r.cpu_us_per_op),
            opt(r.own_cpu_us_per_op),
            format!("{:.1}", r.others_pct),
            opt(r.fsyncs_per_op),
        ];
        out.push_str(&fields.join(","));
        out.push('\n');
    }
    out
}

fn find<'a>(
    rows: &'a [Row],
    system: &str,
    keys: u64,
    workload: &str,
    callers: Callers,
) -> Option<&'a Row> {
    rows.iter().find(|r| {
        r.system == system && r.keys == keys && r.workload == workload && r.callers == callers
    })
}

/// idemdb's throughput over each peer's, per key count, workload and caller count; idemdb's
/// 1-caller claim p50 over the fsync floor's and SQLite's; each idemdb system's tokio tasks
/// (`Nt`) over its threads (`N`).
pub fn ratios(rows: &[Row], peers: &[&str]) -> String {
    let mut out = String::new();
    let mut keys: Vec<u64> = rows.iter().map(|r| r.keys).collect();
    keys.dedup();
    let mut callers: Vec<Callers> = rows.iter().map(|r| r.callers).collect();
    callers.sort_unstable();
    callers.dedup();
    let mut workloads: Vec<&str> = Vec::new();
    for r in rows {
        if !workloads.contains(&r.workload) {
            workloads.push(r.workload);
        }
    }
    for &k in &keys {
        for (&w, &c) in workloads
            .iter()
            .flat_map(|w| callers.iter().map(move |c| (w, c)))
        {
            let Some(idem) = find(rows, "idemdb", k, w, c) else {
                continue;
            };
            let parts: Vec<String> = peers
                .iter()
                .filter_map(|p| {
                    let peer = find(rows, p, k, w, c)?;
                    (peer.throughput > 0.0)
                        .then(|| format!("/{p} {:.2}x", idem.throughput / peer.throughput))
                })
                .collect();
            if !parts.is_empty() {
                let _ = writeln!(
                    out,
                    "keys {k}, {c} callers, {w} throughput: idemdb {}",
                    parts.join(", ")
                );
            }
        }
        for tasks in rows.iter().filter(|r| r.keys == k) {
            let Callers::Tasks(n) = tasks.callers else {
                continue;
            };
            let Some(threads) = find(rows, tasks.system, k, tasks.workload, Callers::Threads(n))
            else {
                continue;
            };
            let p50 = |r: &Row| r.cycle_us.or(r.claim_us).map(|v| v[0]);
            let latency = match (p50(tasks), p50(threads)) {
                (Some(a), Some(b)) if b > 0.0 => format!(", p50 {a:.0} us / {b:.0} us"),
                _ => String::new(),
            };
            if threads.throughput > 0.0 {
                let _ = writeln!(
                    out,
                    "keys {k}, {} {}: {n} tokio tasks / {n} threads: throughput {:.2}x{latency}",
                    tasks.system,
                    tasks.workload,
                    tasks.throughput / threads.throughput
                );
            }
        }
        let p50 = |s: &str| {
            find(rows, s, k, "claim", Callers::Threads(1))
                .and_then(|r| r.claim_us)
                .map(|v| v[0])
        };
        if let Some(idem) = p50("idemdb") {
            for peer in ["fsync-floor", "sqlite"] {
                if let Some(other) = p50(peer) {
                    let _ = writeln!(
                        out,
                        "keys {k}, 1 caller, claim p50: idemdb {idem:.0} us / {peer} {other:.0} us = {:.2}x",
                        idem / other
                    );
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(system: &'static str, callers: usize, throughput: f64, p50: f64) -> Row {
        Row {
            system,
            keys: 10,
            workload: "claim",
            callers: Callers::Threads(callers),
            ops: 100,
            throughput,
            claim_us: Some([p50, p50 * 2.0, p50 * 3.0]),
            cycle_us: None,
            bytes_per_op: Some(4096.0),
            flushes_per_op: Some(1.0),
            cpu_us_per_op: Some(12.5),
            own_cpu_us_per_op: Some(10.0),
            others_pct: 1.0,
            fsyncs_per_op: None,
        }
    }

    #[test]
    fn csv_fields_are_quoted_only_when_needed() {
        assert_eq!(csv_field("idemdb"), "idemdb");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_field("two\nlines"), "\"two\nlines\"");
    }

    #[test]
    fn csv_has_one_line_per_row_and_empty_missing_fields() {
        let text = csv(&[row("idemdb", 1, 1000.0, 400.0)]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].split(',').count(), lines[1].split(',').count());
        assert!(lines[1].starts_with("idemdb,10,claim,1,100,1000.0,400.000,800.000,1200.000,,,,"));
    }

    #[test]
    fn ratios_compare_idemdb_with_each_peer() {
        let rows = [
            row("idemdb", 1, 1000.0, 400.0),
            row("sqlite", 1, 500.0, 800.0),
            row("fsync-floor", 1, 2000.0, 200.0),
        ];
        let text = ratios(&rows, &["sqlite", "postgres"]);
        assert!(text.contains("keys 10, 1 callers, claim throughput: idemdb /sqlite 2.00x\n"));
        assert!(text.contains("/ fsync-floor 200 us = 2.00x"));
        assert!(text.contains("/ sqlite 800 us = 0.50x"));
    }

    fn multi(system: &'static str, processes: usize, each: usize, throughput: f64) -> Row {
        Row {
            callers: Callers::Processes { processes, each },
            ..row(system, 0, throughput, 500.0)
        }
    }

    #[test]
    fn multi_process_cells_show_processes_by_callers() {
        let r = multi("postgres", 4, 16, 7000.0);
        let text = csv(std::slice::from_ref(&r));
        assert!(text
            .lines()
            .nth(1)
            .unwrap()
            .starts_with("postgres,10,claim,4x16,100,"));
        let line = table_row(&r);
        assert_eq!(line.len(), header().lines().next().unwrap().len());
        assert!(line.contains("    4x16 "), "{line}");
    }

    #[test]
    fn ratios_pair_cells_of_the_same_layout_only() {
        let rows = [
            row("idemdb", 64, 4000.0, 400.0),
            row("postgres", 64, 2000.0, 800.0),
            multi("postgres", 4, 16, 1000.0),
            multi("redis", 4, 16, 1000.0),
            multi("idemdb", 4, 16, 8000.0),
        ];
        let text = ratios(&rows, &["postgres", "redis"]);
        assert!(text.contains("keys 10, 64 callers, claim throughput: idemdb /postgres 2.00x\n"));
        assert!(text.contains(
            "keys 10, 4x16 callers, claim throughput: idemdb /postgres 8.00x, /redis 8.00x\n"
        ));
        // Without idemdb in a layout, no line for it.
        let text = ratios(&rows[1..4], &["postgres", "redis"]);
        assert!(text.is_empty(), "{text}");
    }

    #[test]
    fn tasks_are_compared_with_threads_of_the_same_system_and_workload() {
        let tasks = Row {
            callers: Callers::Tasks(64),
            workload: "cycle",
            cycle_us: Some([600.0, 900.0, 1000.0]),
            ..row("idemdb-postgres", 0, 3000.0, 300.0)
        };
        let threads = Row {
            workload: "cycle",
            cycle_us: Some([800.0, 900.0, 1000.0]),
            ..row("idemdb-postgres", 64, 2000.0, 400.0)
        };
        let redis = Row {
            workload: "cycle",
            ..row("redis", 64, 1000.0, 400.0)
        };
        let idem = Row {
            workload: "cycle",
            ..row("idemdb", 64, 2500.0, 400.0)
        };
        let text = ratios(&[tasks.clone(), threads, redis, idem], &["redis"]);
        assert!(
            text.contains(
                "keys 10, idemdb-postgres cycle: 64 tokio tasks / 64 threads: throughput 1.50x, \
                 p50 600 us / 800 us\n"
            ),
            "{text}"
        );
        assert!(text.contains("keys 10, 64 callers, cycle throughput: idemdb /redis 2.50x\n"));
        // Without the threads' row, no line for the tasks.
        assert!(ratios(&[tasks], &["redis"]).is_empty());
        assert_eq!(
            table_row(&Row {
                callers: Callers::Tasks(256),
                ..row("idemdb", 0, 1.0, 1.0)
            })
            .len(),
            header().lines().next().unwrap().len()
        );
    }

    #[test]
    fn table_rows_line_up_with_the_header() {
        let head = header();
        let first = head.lines().next().unwrap();
        assert_eq!(
            table_row(&row("idemdb", 64, 44056.0, 1234.5)).len(),
            first.len()
        );
    }
}
