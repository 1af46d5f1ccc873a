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
            E::InvalidKey { .. }
            | E::InvalidScope { .. }
            | E::InvalidSchema { .. }
            | E::InvalidImport { .. } => Exit::Usage,
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

/// A time as RFC 3339 in UTC, to the millisecond. Stored times are any u64 of milliseconds,
/// but humantime formats only 1970 to 9999 (it panics outside), so a time beyond is shown as
/// the nearest end of that range.
pub(crate) fn timestamp(t: SystemTime) -> String {
    let last = UNIX_EPOCH + Duration::from_millis(253_402_300_799_999); // 9999-12-31T23:59:59.999Z
    humantime::format_rfc3339_millis(t.clamp(UNIX_EPOCH, last)).to_string()
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

/// Parses `250ms`, `90s`, `15m`, `2h`, `1d`, or a sum of them (`1h30m`, `1h 30m`), and the
/// other units humantime knows.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration like 90s, 15m, 2h, 1d or 1h30m ({e})"))
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
        // Times humantime cannot format are shown as the nearest end of its range, not a panic.
        assert_eq!(at(u64::MAX), "9999-12-31T23:59:59.999Z");
        assert_eq!(
            timestamp(UNIX_EPOCH - Duration::from_secs(1)),
            "1970-01-01T00:00:00.000Z"
        );
    }

    #[test]
    fn durations_parse_and_bad_ones_are_refused() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(172_800)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        for bad in [
            "",
            " ",
            "15",
            "m",
            "1x",
            "-1s",
            "1.5.0s",
            "99999999999999999999d",
        ] {
            let e = parse_duration(bad).expect_err(bad);
            assert!(e.contains("is not a duration like 90s"), "{bad:?}: {e}");
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
