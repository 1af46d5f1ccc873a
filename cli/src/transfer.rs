//! `idemdb export` and `idemdb import`.

use crate::open::Target;
use crate::output::{span, Exit, Failure, Out, Outcome};
use idemdb::Store;
use serde_json::json;
use std::io::{BufReader, BufWriter, Read, Write};
use std::time::Instant;

#[derive(Debug, clap::Args)]
pub(crate) struct ExportArgs {
    /// A store file, or a postgres:// URL.
    store: String,
    /// Read a damaged store past its damage: export every record that can be read, name each
    /// that cannot on standard error, and exit 5 if any could not. What `idemdb verify`
    /// suggests after it found damage.
    #[arg(long)]
    past_damage: bool,
}

impl ExportArgs {
    pub(crate) fn store(&self) -> &str {
        &self.store
    }
}

pub(crate) fn export(target: &Target, args: &ExportArgs, out: &Out) -> Outcome {
    let started = Instant::now();
    let store = if args.past_damage {
        target.open_past_damage(out)?
    } else {
        target.open(out)?
    };
    // A count for the progress bar; on PostgreSQL a count of the table, done once.
    let total = store.record_count().ok().filter(|&n| n > 0);
    let bar = out.progress("exporting", total);
    let lines = Lines {
        inner: BufWriter::with_capacity(1 << 20, std::io::stdout().lock()),
        bar: &bar,
    };
    let mut damaged = 0u64;
    let exported = if args.past_damage {
        store.export_past_damage(lines, |e| {
            damaged += 1;
            eprintln!("left out: {e}");
        })?
    } else {
        store.export(lines)?
    };
    bar.finish_and_clear();
    summary(out, "exported", exported, started);
    if damaged > 0 {
        return Err(Failure::new(
            Exit::Damaged,
            format!("{damaged} damaged records could not be read and were left out"),
        ));
    }
    Ok(())
}

pub(crate) fn import(target: &Target, out: &Out) -> Outcome {
    let started = Instant::now();
    let bar = out.progress("reading", None);
    let input = BufReader::with_capacity(
        1 << 20,
        Counted {
            inner: std::io::stdin().lock(),
            bar: &bar,
        },
    );
    let imported = match target.path() {
        Some(path) => {
            if path
                .try_exists()
                .map_err(|e| Failure::from(idemdb::Error::Io(e)))?
            {
                return Err(Failure::new(
                    Exit::Refused,
                    format!(
                        "{} exists: a file store imports only into a new file; choose a new \
                         path (nothing was changed)",
                        path.display()
                    ),
                ));
            }
            Store::builder().heal_after(None).import_new(path, input)?.1
        }
        None => import_shared(target, input)?,
    };
    bar.finish_and_clear();
    summary(out, "imported", imported, started);
    Ok(())
}

/// Imports into a PostgreSQL store, which must be empty.
#[cfg(feature = "postgres")]
fn import_shared(target: &Target, input: impl std::io::BufRead) -> Result<u64, Failure> {
    Ok(target.connect()?.import(input)?)
}

/// Without PostgreSQL there is no shared store to import into: connecting says why.
#[cfg(not(feature = "postgres"))]
fn import_shared(target: &Target, _: impl std::io::BufRead) -> Result<u64, Failure> {
    target.connect().map(|_| 0)
}

/// The summary goes to standard error for an export (standard output is the data).
fn summary(out: &Out, what: &str, n: u64, started: Instant) {
    let took = started.elapsed();
    if out.json {
        let line = json!({ what: n, "seconds": took.as_secs_f64() });
        if what == "exported" {
            eprintln!("{line}");
        } else {
            out.json(&line);
        }
    } else {
        eprintln!("{what} {n} records in {}", span(took));
    }
}

/// Counts lines written, for the progress bar.
struct Lines<'a, W: Write> {
    inner: W,
    bar: &'a indicatif::ProgressBar,
}

impl<W: Write> Write for Lines<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        let lines = buf[..n].iter().filter(|&&b| b == b'\n').count();
        self.bar.inc(lines as u64);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Counts bytes read, for the spinner.
struct Counted<'a, R: Read> {
    inner: R,
    bar: &'a indicatif::ProgressBar,
}

impl<R: Read> Read for Counted<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bar.inc(n as u64);
        Ok(n)
    }
}
