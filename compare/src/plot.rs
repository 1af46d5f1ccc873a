//! The latency-versus-throughput plot, written as SVG by hand: log-log axes, one line per
//! system through its caller counts, p50 as filled markers and p99 as faint ones. A
//! multi-process cell (`4x16`) is a point of its own, a square labelled with its layout, off
//! the line: the line joins one process's thread counts, and a cell of several processes is
//! not the next step along it (its total may even equal a point already on the line).

use crate::report::Row;
use crate::runner::Callers;
use std::fmt::Write;

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 600.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 170.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;
const COLOURS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#7f7f7f", "#8c564b", "#e377c2",
];

const EPS: f64 = 1e-9;

/// The largest of 1, 2, 5 times a power of ten that is at most `x` (`x > 0`).
pub fn nice_floor(x: f64) -> f64 {
    let decade = 10f64.powi(x.log10().floor() as i32);
    [5.0, 2.0, 1.0]
        .into_iter()
        .map(|m| m * decade)
        .find(|&v| v <= x * (1.0 + EPS))
        .unwrap_or(decade / 2.0)
}

/// The smallest of 1, 2, 5 times a power of ten that is at least `x` (`x > 0`).
pub fn nice_ceil(x: f64) -> f64 {
    let decade = 10f64.powi(x.log10().floor() as i32);
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * decade)
        .find(|&v| v >= x * (1.0 - EPS))
        .unwrap_or(decade * 10.0)
}

/// Axis bounds covering `min..=max` on nice values, never empty.
pub fn log_bounds(min: f64, max: f64) -> (f64, f64) {
    let lo = nice_floor(min);
    let mut hi = nice_ceil(max);
    if hi <= lo * (1.0 + EPS) {
        hi = nice_ceil(lo * 1.5);
    }
    (lo, hi)
}

/// Tick values for a log axis over `lo..=hi`: each power of ten, plus 2 and 5 times it when the
/// axis spans at most two decades.
pub fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let mantissas: &[f64] = if hi / lo <= 100.0 * (1.0 + EPS) {
        &[1.0, 2.0, 5.0]
    } else {
        &[1.0]
    };
    let first = lo.log10().floor() as i32;
    let last = hi.log10().ceil() as i32;
    let mut ticks = Vec::new();
    for k in first..=last {
        for m in mantissas {
            let v = m * 10f64.powi(k);
            if v >= lo * (1.0 - EPS) && v <= hi * (1.0 + EPS) {
                ticks.push(v);
            }
        }
    }
    ticks
}

/// A tick label: `500`, `2k`, `1M`, `0.5`.
pub fn tick_label(v: f64) -> String {
    let trim = |x: f64| {
        let s = format!("{x:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    };
    if v >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if v >= 1e3 {
        format!("{}k", trim(v / 1e3))
    } else {
        trim(v)
    }
}

/// A latency tick label from microseconds: `200µs`, `1ms`, `1.5s`.
pub fn duration_label(us: f64) -> String {
    let trim = |x: f64| {
        let s = format!("{x:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    };
    if us >= 1e6 {
        format!("{}s", trim(us / 1e6))
    } else if us >= 1e3 {
        format!("{}ms", trim(us / 1e3))
    } else {
        format!("{}µs", trim(us))
    }
}

/// A log scale from `lo..hi` onto `a..b` pixels.
struct Scale {
    lo: f64,
    hi: f64,
    a: f64,
    b: f64,
}

impl Scale {
    fn at(&self, v: f64) -> f64 {
        let t = (v.log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10());
        self.a + t * (self.b - self.a)
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// One plotted point: throughput, p50, p99, label.
struct Point {
    x: f64,
    p50: f64,
    p99: f64,
    callers: Callers,
}

impl Point {
    /// Whether the point is on its system's line (threads of one process); tokio tasks (`Nt`)
    /// and several processes (`PxC`) are squares of their own.
    fn on_line(&self) -> bool {
        matches!(self.callers, Callers::Threads(_))
    }
}

/// The SVG for `rows` (one workload, one key count): x = throughput, y = the latency the
/// workload measures (claim, or claim+complete for `cycle`), p50 with p99 above it.
pub fn svg(title: &str, y_label: &str, rows: &[Row], cycle: bool) -> String {
    let mut systems: Vec<&str> = Vec::new();
    for r in rows {
        if !systems.contains(&r.system) {
            systems.push(r.system);
        }
    }
    let series: Vec<(&str, Vec<Point>)> = systems
        .iter()
        .map(|&s| {
            let mut pts: Vec<Point> = rows
                .iter()
                .filter(|r| r.system == s && r.throughput > 0.0)
                .filter_map(|r| {
                    let lat = if cycle { r.cycle_us } else { r.claim_us }?;
                    Some(Point {
                        x: r.throughput,
                        p50: lat[0].max(0.001),
                        p99: lat[1].max(0.001),
                        callers: r.callers,
                    })
                })
                .collect();
            pts.sort_by_key(|p| p.callers);
            (s, pts)
        })
        .collect();
    let all = || series.iter().flat_map(|(_, p)| p.iter());
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{}" y="28" text-anchor="middle" font-size="16">{}</text>"#,
        (LEFT + WIDTH - RIGHT) / 2.0,
        escape(title)
    );
    if all().next().is_none() {
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" text-anchor="middle">no data</text></svg>"#,
            WIDTH / 2.0,
            HEIGHT / 2.0
        );
        return out;
    }
    let fold =
        |f: fn(f64, f64) -> f64, init: f64, get: fn(&Point) -> f64| all().map(get).fold(init, f);
    let (x_lo, x_hi) = log_bounds(
        fold(f64::min, f64::INFINITY, |p| p.x),
        fold(f64::max, 0.0, |p| p.x),
    );
    let (y_lo, y_hi) = log_bounds(
        fold(f64::min, f64::INFINITY, |p| p.p50),
        fold(f64::max, 0.0, |p| p.p99),
    );
    let (x0, x1, y0, y1) = (LEFT, WIDTH - RIGHT, HEIGHT - BOTTOM, TOP);
    let xs = Scale {
        lo: x_lo,
        hi: x_hi,
        a: x0,
        b: x1,
    };
    let ys = Scale {
        lo: y_lo,
        hi: y_hi,
        a: y0,
        b: y1,
    };

    // Grid, ticks and labels.
    for v in log_ticks(x_lo, x_hi) {
        let x = xs.at(v);
        let _ = writeln!(
            out,
            r##"<line x1="{x:.1}" y1="{y1}" x2="{x:.1}" y2="{y0}" stroke="#e4e4e4"/><text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"##,
            y0 + 18.0,
            tick_label(v)
        );
    }
    for v in log_ticks(y_lo, y_hi) {
        let y = ys.at(v);
        let _ = writeln!(
            out,
            r##"<line x1="{x0}" y1="{y:.1}" x2="{x1}" y2="{y:.1}" stroke="#e4e4e4"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            x0 - 6.0,
            y + 4.0,
            duration_label(v)
        );
    }
    let _ = writeln!(
        out,
        r#"<rect x="{x0}" y="{y1}" width="{}" height="{}" fill="none" stroke="black"/>"#,
        x1 - x0,
        y0 - y1
    );
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle">throughput (requests/s, log scale)</text>"#,
        (x0 + x1) / 2.0,
        HEIGHT - 18.0
    );
    let _ = writeln!(
        out,
        r#"<text transform="translate(22 {}) rotate(-90)" text-anchor="middle">{}</text>"#,
        (y0 + y1) / 2.0,
        escape(y_label)
    );

    // Series.
    for (i, (name, pts)) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        if pts.iter().filter(|p| p.on_line()).count() > 1 {
            let path: Vec<String> = pts
                .iter()
                .filter(|p| p.on_line())
                .map(|p| format!("{:.1},{:.1}", xs.at(p.x), ys.at(p.p50)))
                .collect();
            let _ = writeln!(
                out,
                r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"/>"#,
                path.join(" ")
            );
        }
        for p in pts {
            let (x, y50, y99) = (xs.at(p.x), ys.at(p.p50), ys.at(p.p99));
            let marker = if p.on_line() {
                format!(r#"<circle cx="{x:.1}" cy="{y50:.1}" r="4" fill="{colour}"/>"#)
            } else {
                format!(
                    r#"<rect class="multi" x="{:.1}" y="{:.1}" width="8" height="8" fill="{colour}"/>"#,
                    x - 4.0,
                    y50 - 4.0
                )
            };
            let _ = writeln!(
                out,
                r#"<line x1="{x:.1}" y1="{y50:.1}" x2="{x:.1}" y2="{y99:.1}" stroke="{colour}" stroke-opacity="0.35"/><circle cx="{x:.1}" cy="{y99:.1}" r="3" fill="white" stroke="{colour}" stroke-opacity="0.5"/>{marker}<text x="{:.1}" y="{:.1}" font-size="10" fill="{colour}">{}</text>"#,
                x + 6.0,
                y50 + 12.0,
                p.callers
            );
        }
        // Legend.
        let ly = y1 + 10.0 + 22.0 * i as f64;
        let lx = x1 + 20.0;
        let _ = writeln!(
            out,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{colour}" stroke-width="2"/><circle cx="{}" cy="{ly}" r="4" fill="{colour}"/><text x="{}" y="{}">{}</text>"#,
            lx + 24.0,
            lx + 12.0,
            lx + 32.0,
            ly + 4.0,
            escape(name)
        );
    }
    let notes_y = y1 + 22.0 * series.len() as f64 + 30.0;
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{notes_y}" font-size="10">filled: p50; hollow: p99</text><text x="{}" y="{}" font-size="10">labels: caller threads</text>"#,
        x1 + 20.0,
        x1 + 20.0,
        notes_y + 14.0
    );
    if all().any(|p| !p.on_line()) {
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" font-size="10">squares, off the lines:</text><text x="{}" y="{}" font-size="10">PxC = P processes x C callers</text><text x="{}" y="{}" font-size="10">Nt = N tokio tasks, async API</text>"#,
            x1 + 20.0,
            notes_y + 28.0,
            x1 + 20.0,
            notes_y + 42.0,
            x1 + 20.0,
            notes_y + 56.0
        );
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(x, y)| (x - y).abs() <= 1e-9 * y.abs())
    }

    #[test]
    fn bounds_snap_to_one_two_five() {
        assert_eq!(log_bounds(1234.0, 45_678.0), (1000.0, 50_000.0));
        assert_eq!(log_bounds(300.0, 300.0), (200.0, 500.0));
        assert_eq!(log_bounds(100.0, 100.0), (100.0, 200.0));
        let (lo, hi) = log_bounds(0.37, 7.0);
        assert!((lo - 0.2).abs() < 1e-12 && (hi - 10.0).abs() < 1e-12);
    }

    #[test]
    fn narrow_axes_get_two_and_five_ticks() {
        assert!(close(
            &log_ticks(200.0, 5000.0),
            &[200.0, 500.0, 1000.0, 2000.0, 5000.0]
        ));
    }

    #[test]
    fn wide_axes_get_decades_only() {
        assert!(close(
            &log_ticks(50.0, 200_000.0),
            &[100.0, 1000.0, 10_000.0, 100_000.0]
        ));
    }

    #[test]
    fn labels_use_k_and_m() {
        assert_eq!(tick_label(500.0), "500");
        assert_eq!(tick_label(2000.0), "2k");
        assert_eq!(tick_label(1_000_000.0), "1M");
        assert_eq!(tick_label(0.5), "0.5");
        assert_eq!(tick_label(20_000.0), "20k");
        assert_eq!(duration_label(200.0), "200µs");
        assert_eq!(duration_label(0.5), "0.5µs");
        assert_eq!(duration_label(2000.0), "2ms");
        assert_eq!(duration_label(1_500_000.0), "1.5s");
    }

    #[test]
    fn svg_has_a_line_per_system_and_escapes_text() {
        let row = |system, callers, throughput| Row {
            system,
            keys: 1,
            workload: "claim",
            callers: Callers::Threads(callers),
            ops: 1,
            throughput,
            claim_us: Some([100.0, 300.0, 900.0]),
            cycle_us: None,
            bytes_per_op: None,
            flushes_per_op: None,
            cpu_us_per_op: None,
            own_cpu_us_per_op: None,
            others_pct: 0.0,
            fsyncs_per_op: None,
        };
        let rows = [row("a", 1, 10.0), row("a", 4, 40.0), row("b", 1, 5.0)];
        let s = svg("x < y", "lat", &rows, false);
        assert!(s.starts_with("<svg"));
        assert!(s.trim_end().ends_with("</svg>"));
        assert_eq!(s.matches("<polyline").count(), 1);
        assert!(s.contains("x &lt; y"));
        assert!(!s.contains("class=\"multi\""));
        assert!(!s.contains("PxC"));
    }

    #[test]
    fn multi_process_cells_are_squares_off_the_line() {
        let row = |callers, throughput| Row {
            system: "postgres",
            keys: 1,
            workload: "claim",
            callers,
            ops: 1,
            throughput,
            claim_us: Some([100.0, 300.0, 900.0]),
            cycle_us: None,
            bytes_per_op: None,
            flushes_per_op: None,
            cpu_us_per_op: None,
            own_cpu_us_per_op: None,
            others_pct: 0.0,
            fsyncs_per_op: None,
        };
        let multi = Callers::Processes {
            processes: 4,
            each: 16,
        };
        let rows = [
            row(Callers::Threads(1), 10.0),
            row(multi, 50.0),
            row(Callers::Threads(64), 40.0),
            row(Callers::Tasks(64), 45.0),
        ];
        let s = svg("t", "lat", &rows, false);
        let line = s.lines().find(|l| l.starts_with("<polyline")).unwrap();
        assert_eq!(
            line.matches(',').count(),
            2,
            "two points on the line: {line}"
        );
        assert_eq!(s.matches("class=\"multi\"").count(), 2);
        assert!(s.contains(">4x16</text>"));
        assert!(s.contains(">64t</text>"));
        assert!(s.contains("Nt = N tokio tasks, async API"));
        assert!(s.contains("PxC = P processes x C callers"));
        // A system with only a multi-process cell: a square, no line.
        let s = svg("t", "lat", &rows[1..2], false);
        assert_eq!(s.matches("<polyline").count(), 0);
        assert_eq!(s.matches("class=\"multi\"").count(), 1);
    }
}
