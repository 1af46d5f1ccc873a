//! How the command speaks: aligned tables or one JSON document on standard output, errors on
//! standard error with a documented exit code, progress bars on standard error when it is a
//! terminal.

use base64::Engine as _;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};
use std::io::Write as _;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub(crate) const EXIT_CODES: &str = "\
Exit codes:
  0  done
  1  the store or the disk failed (I/O, database)
  2  bad arguments
  3  no store at that path (nothing was created)
  4  the store is open in another process: stop it, or inspect it live with Store::scan
  5  the store is damaged, or of another format (verify says what)
  6  no such record
  7  refused, nothing changed (resolve: the claim is not that fence, or not stale)";

/// Why a command stopped, and the exit code that says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exit {
    Failed = 1,
    Usage = 2,
    NoStore = 3,
    InUse = 4,
    Damaged = 5,
    NoRecord = 6,
    Refused = 7,
}

/// A command's failure: what to print, and how to exit.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) exit: Exit,
    pub(crate) message: String,
    /// The command already printed its JSON document about it.
    reported: bool,
}

impl Failure {
    pub(crate) fn new(exit: Exit, message: impl Into<String>) -> Failure {
        Failure {
            exit,
            message: message.into(),
            reported: false,
        }
    }

    /// The failure, its JSON document already printed by the command.
    pub(crate) fn reported(self) -> Failure {
        Failure {
            reported: true,
            ..self
        }
    }

    pub(crate) fn report(self, out: &Out) -> ExitCode {
        if out.json && !self.reported {
            out.json(&json!({ "error": self.message, "exit": self.exit as u8 }));
        }
        eprintln!("idemdb: {}", self.message);
        ExitCode::from(self.exit as u8)
    }
}

impl From<idemdb::Error> for Failure {
    fn from(e: idemdb::Error) -> Failure {
        use idemdb::Error as E;
        let exit = match &e {
            E::AlreadyOpen => Exit::InUse,
            E::Corrupted { .. } | E::JournalMismatch { .. } | E::UnsupportedFormat { .. } => {
                Exit::Damaged
            }
            E::InvalidKey { .. } | E::InvalidScope { .. } | E::InvalidImport { .. } => Exit::Usage,
            _ => Exit::Failed,
        };
        let message = match &e {
            E::AlreadyOpen => "the store file is open in another process (a running service \
                               holds it). Stop that process and run the command again, or \
                               offer the same inspection from inside the service with \
                               Store::scan / Store::list"
                .to_owned(),
            other => other.to_string(),
        };
        Failure::new(exit, message)
    }
}

pub(crate) type Outcome = Result<(), Failure>;

/// Where output goes.
pub(crate) struct Out {
    pub(crate) json: bool,
}

impl Out {
    pub(crate) fn new(json: bool) -> Out {
        Out { json }
    }

    pub(crate) fn json(&self, value: &Value) {
        let mut stdout = std::io::stdout().lock();
        let _ = serde_json::to_writer_pretty(&mut stdout, value);
        let _ = writeln!(stdout);
    }

    /// A spinner with the time it has turned, drawn as [`Out::progress`] draws.
    pub(crate) fn spinner(&self, what: &str) -> ProgressBar {
        let spinner = ProgressBar::new_spinner().with_style(
            ProgressStyle::with_template("{msg:>9} {spinner} {elapsed}").expect("a valid template"),
        );
        spinner.set_message(what.to_owned());
        spinner.enable_steady_tick(Duration::from_millis(120));
        spinner
    }

    /// A progress bar over `len` items (a spinner when unknown), drawn on standard error only
    /// when it is a terminal.
    pub(crate) fn progress(&self, what: &str, len: Option<u64>) -> ProgressBar {
        let bar = match len {
            Some(n) => ProgressBar::new(n).with_style(
                ProgressStyle::with_template(
                    "{msg:>9} [{bar:40}] {human_pos}/{human_len} {per_sec} eta {eta}",
                )
                .expect("a valid template")
                .progress_chars("=> "),
            ),
            None => ProgressBar::new_spinner().with_style(
                ProgressStyle::with_template("{msg:>9} {spinner} {human_pos} {elapsed}")
                    .expect("a valid template"),
            ),
        };
        bar.set_message(what.to_owned());
        if len.is_none() {
            bar.enable_steady_tick(Duration::from_millis(120));
        }
        bar
    }
}

/// Rows printed with every column padded to its widest cell.
pub(crate) struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    pub(crate) fn new(header: &[&str]) -> Table {
        Table {
            rows: vec![header.iter().map(|h| (*h).to_owned()).collect()],
        }
    }

    /// A table of `name  value` lines, without a header.
    pub(crate) fn pairs() -> Table {
        Table { rows: Vec::new() }
    }

    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub(crate) fn print(&self) {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|c| {
                self.rows
                    .iter()
                    .filter_map(|r| r.get(c))
                    .map(|cell| cell.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut stdout = std::io::stdout().lock();
        for row in &self.rows {
            let mut line = String::new();
            for (c, cell) in row.iter().enumerate() {
                if c + 1 == row.len() {
                    line.push_str(cell);
                } else {
                    let pad = widths[c] - cell.chars().count();
                    line.push_str(cell);
                    line.push_str(&" ".repeat(pad + 2));
                }
            }
            let _ = writeln!(stdout, "{}", line.trim_end());
        }
    }
}

/// A time as RFC 3339 in UTC, to the millisecond.
pub(crate) fn timestamp(t: SystemTime) -> String {
    let ms = t
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let (days, rest) = (ms / 86_400_000, ms % 86_400_000);
    let (y, m, d) = civil_date(days);
    let (h, min, s, milli) = (
        rest / 3_600_000,
        rest / 60_000 % 60,
        rest / 1000 % 60,
        rest % 1000,
    );
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{min:02}:{s:02}.{milli:03}Z")
}

/// The proleptic Gregorian date `days` after 1970-01-01, counted in 400-year eras of 146,097
/// days from 0000-03-01 (so that the leap day ends a year).
fn civil_date(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// How far `t` is from `now`, in the largest two units: `3m 12s ago`, `in 45s`.
pub(crate) fn relative(t: SystemTime, now: SystemTime) -> String {
    match t.duration_since(now) {
        Ok(ahead) => format!("in {}", span(ahead)),
        Err(behind) => format!("{} ago", span(behind.duration())),
    }
}

pub(crate) fn span(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{}ms", d.as_millis()),
        1..60 => format!("{:.2}s", d.as_secs_f64()),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        3600..86_400 => format!("{}h {}m", s / 3600, s / 60 % 60),
        _ => format!("{}d {}h", s / 86_400, s / 3600 % 24),
    }
}

/// Parses `500ms`, `90s`, `15m`, `2h`, `1d` (or a sum of them: `1h30m`).
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?} is not a duration like 90s, 15m, 2h, 1d or 1h30m");
    let mut total = Duration::ZERO;
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let part = match &rest[..unit] {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n.checked_mul(60).ok_or_else(bad)?),
            "h" => Duration::from_secs(n.checked_mul(3600).ok_or_else(bad)?),
            "d" => Duration::from_secs(n.checked_mul(86_400).ok_or_else(bad)?),
            _ => return Err(bad()),
        };
        total = total.checked_add(part).ok_or_else(bad)?;
        rest = &rest[unit..];
    }
    Ok(total)
}

/// Bytes as text when they are UTF-8, else as base64: `(encoding, text)`.
pub(crate) fn bytes(b: &[u8]) -> (&'static str, String) {
    match std::str::from_utf8(b) {
        Ok(text) => ("utf-8", text.to_owned()),
        Err(_) => (
            "base64",
            base64::engine::general_purpose::STANDARD.encode(b),
        ),
    }
}

pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        let at = |ms: u64| timestamp(UNIX_EPOCH + Duration::from_millis(ms));
        assert_eq!(at(0), "1970-01-01T00:00:00.000Z");
        // 2000-02-29 (a leap day of a century divisible by 400), 12:34:56.789.
        assert_eq!(at(951_827_696_789), "2000-02-29T12:34:56.789Z");
        // 2026-12-04T18:00:00Z
        assert_eq!(at(1_796_407_200_000), "2026-12-04T18:00:00.000Z");
        // 2100-03-01, after a century that is not a leap year.
        assert_eq!(at(4_107_542_400_000), "2100-03-01T00:00:00.000Z");
    }

    #[test]
    fn durations_parse_and_bad_ones_are_refused() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(172_800)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        for bad in [
            "",
            "15",
            "m",
            "1x",
            "-1s",
            "99999999999999999999d",
            "1h 30m",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn spans_read_in_two_units() {
        assert_eq!(span(Duration::from_millis(12)), "12ms");
        assert_eq!(span(Duration::from_millis(3419)), "3.42s");
        assert_eq!(span(Duration::from_secs(192)), "3m 12s");
        assert_eq!(span(Duration::from_secs(90_000)), "1d 1h");
    }
}
