//! Multi-process cells (`--callers PxC`): P child processes of the harness's own executable,
//! C caller threads each, measure one preloaded server-backed system (postgres,
//! idemdb-postgres, redis) at once. The parent preloads as for any cell, then per cell:
//!
//! 1. starts P children, `idemdb-compare --child I --child-cell N --systems KIND --workloads W
//!    --callers PxC --warmup S --seconds S --seed N --response-bytes N [--postgres CONN]
//!    [--redis HOST:PORT] [--child-schema NAME]` (the hidden flags of `cli.rs`), with stdin,
//!    stdout and stderr piped;
//! 2. each child attaches to the system (`systems::attach`: no preload, nothing dropped; for
//!    idemdb-postgres a store on the parent's schema), opens its C clients and prints `ready`;
//! 3. once all P are ready, the parent writes `go WARM_END END` to each child's stdin: the
//!    warm-up's and the window's ends as wall-clock times, nanoseconds since the Unix epoch;
//!    each child turns them into its own `Instant`s and runs [`runner::drive`], the loop of
//!    every cell. Child `I`'s caller `t` draws key stream `I * C + t`, so no two callers of the
//!    cell draw the same keys;
//! 4. the parent samples the disk, CPU and fsync counters at the window's edges as
//!    [`runner::run`] does, counting the children's CPU by their PIDs, then closes the
//!    children's stdin;
//! 5. after the window each child prints its latencies, `claim NS NS ...`, `cycle NS ...`,
//!    `fsyncs N` (its store's commit count over the window, or `-`) and `done`, waits for the
//!    end of its stdin (so that it is still alive, and its CPU still counted, when the parent
//!    samples the window's end) and exits;
//! 6. the parent merges the latencies into one [`Outcome`].
//!
//! A child that fails (a connection refused, a claim that did not acquire) prints its error on
//! stderr and exits with status 1: the parent fails the cell with that message. Children never
//! outlive their cell: on any error, and whatever happens, [`Children`]'s drop kills and reaps
//! those still running. If the parent itself dies (killed), a child waiting for `go`, or one
//! already running, sees the end of its stdin before the window's end and exits at once.

use crate::cli::Args;
use crate::measure::Device;
use crate::runner::{self, Callers, Outcome, Recorded, Share, Spec};
use crate::systems::{self, fail, Error, Kind, Result, Setup, System};
use crate::workload::Payload;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long the children may take to open their clients.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long after the window's end the children may take to send their latencies.
const RESULTS_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a child that is done (or failed) may take to exit before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(5);

/// What a child needs to reach the parent's system, besides the cell itself.
#[derive(Debug, Clone)]
pub struct Launch {
    /// The system.
    pub kind: Kind,
    /// `--postgres`, as the parent got it.
    pub postgres: Option<String>,
    /// `--redis`, as the parent got it.
    pub redis: Option<String>,
    /// The schema of the parent's idemdb-postgres store ([`System::shared_schema`]).
    pub schema: Option<String>,
    /// `--response-bytes`.
    pub response_bytes: usize,
}

impl Launch {
    /// The command line of child `index`.
    fn args(&self, spec: &Spec, cell: u64, index: usize) -> Vec<String> {
        let mut args: Vec<String> = [
            "--child",
            &index.to_string(),
            "--child-cell",
            &cell.to_string(),
            "--systems",
            self.kind.name(),
            "--workloads",
            spec.workload.name(),
            "--callers",
            &spec.callers.to_string(),
            // f64's Display reads back to the same value.
            "--warmup",
            &spec.warmup.as_secs_f64().to_string(),
            "--seconds",
            &spec.window.as_secs_f64().to_string(),
            "--seed",
            &spec.seed.to_string(),
            "--response-bytes",
            &self.response_bytes.to_string(),
        ]
        .map(str::to_owned)
        .to_vec();
        for (flag, value) in [
            ("--postgres", &self.postgres),
            ("--redis", &self.redis),
            ("--child-schema", &self.schema),
        ] {
            if let Some(value) = value {
                args.extend([flag.to_owned(), value.clone()]);
            }
        }
        args
    }
}

/// Nanoseconds since the Unix epoch.
fn epoch_ns(t: SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

/// The `go` line: when the warm-up and the window end, in nanoseconds since the Unix epoch.
fn go_line(warm_end_ns: u128, end_ns: u128) -> String {
    format!("go {warm_end_ns} {end_ns}\n")
}

/// The two times of a `go` line, if it is one.
fn parse_go(line: &str) -> Option<(u128, u128)> {
    let mut words = line.split_whitespace();
    if words.next()? != "go" {
        return None;
    }
    let warm_end: u128 = words.next()?.parse().ok()?;
    let end: u128 = words.next()?.parse().ok()?;
    (words.next().is_none() && warm_end <= end).then_some((warm_end, end))
}

/// The `Instant` of wall-clock time `wall_ns`, knowing that `now` is `now_ns`.
fn instant_at(wall_ns: u128, now: Instant, now_ns: u128) -> Instant {
    let nanos = |n: u128| Duration::from_nanos(u64::try_from(n).unwrap_or(u64::MAX));
    if wall_ns >= now_ns {
        now + nanos(wall_ns - now_ns)
    } else {
        now.checked_sub(nanos(now_ns - wall_ns)).unwrap_or(now)
    }
}

/// What a child prints after the window: its callers' latencies, its system's fsync count
/// over the window, and `done`.
fn results_text(rec: &Recorded, fsyncs: Option<u64>) -> String {
    let mut out = String::with_capacity(8 * (rec.claim_ns.len() + rec.cycle_ns.len()) + 64);
    for (name, values) in [("claim", &rec.claim_ns), ("cycle", &rec.cycle_ns)] {
        out.push_str(name);
        for v in values {
            let _ = write!(out, " {v}");
        }
        out.push('\n');
    }
    match fsyncs {
        Some(n) => {
            let _ = writeln!(out, "fsyncs {n}");
        }
        None => out.push_str("fsyncs -\n"),
    }
    out.push_str("done\n");
    out
}

/// One child's results, as they are read.
#[derive(Debug, Default)]
struct Report {
    rec: Recorded,
    fsyncs: Option<u64>,
    done: bool,
}

impl Report {
    /// Reads one line of [`results_text`].
    fn read(&mut self, line: &str) -> std::result::Result<(), String> {
        let (name, rest) = line.split_once(' ').unwrap_or((line, ""));
        let numbers = |rest: &str| -> std::result::Result<Vec<u64>, String> {
            rest.split_whitespace()
                .map(|v| v.parse().map_err(|_| format!("bad latency {v:?}")))
                .collect()
        };
        match name {
            _ if self.done => return Err(format!("{name:?} after done")),
            "claim" => self.rec.claim_ns = numbers(rest)?,
            "cycle" => self.rec.cycle_ns = numbers(rest)?,
            "fsyncs" if rest == "-" => self.fsyncs = None,
            "fsyncs" => {
                self.fsyncs = Some(rest.parse().map_err(|_| format!("bad fsyncs {rest:?}"))?);
            }
            "done" => self.done = true,
            _ => return Err(format!("unexpected line {:?}", truncate(line))),
        }
        Ok(())
    }
}

fn truncate(s: &str) -> &str {
    s.char_indices().nth(80).map_or(s, |(i, _)| &s[..i])
}

/// One running child.
struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    /// Everything it wrote on stderr, once it is gone.
    stderr: Option<JoinHandle<String>>,
    status: Option<ExitStatus>,
}

impl Proc {
    /// Waits for the child to exit, at most `grace`, then kills it; its exit status.
    fn finish(&mut self, grace: Duration) -> Option<ExitStatus> {
        self.stdin = None;
        let deadline = Instant::now() + grace;
        while self.status.is_none() {
            match self.child.try_wait() {
                Ok(Some(status)) => self.status = Some(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Ok(None) => {
                    let _ = self.child.kill();
                    self.status = self.child.wait().ok();
                    break;
                }
                Err(_) => break,
            }
        }
        self.status
    }

    /// What it wrote on stderr (its last lines), once it is gone.
    fn errors(&mut self) -> String {
        let text = self
            .stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        lines[lines.len().saturating_sub(5)..].join(" / ")
    }
}

/// The children of one cell, and the lines they print, as `(child, line)`; `None` at the end
/// of a child's stdout.
struct Children {
    procs: Vec<Proc>,
    lines: Receiver<(usize, Option<String>)>,
}

/// The program the children run: this one. A rebuild that replaces the file while the harness
/// runs leaves `current_exe` naming a deleted file; `/proc/self/exe` (of the forked child,
/// which is this process's copy) is then still the code the parent runs.
fn executable() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    Ok(if exe.exists() {
        exe
    } else {
        PathBuf::from("/proc/self/exe")
    })
}

impl Children {
    /// Starts the cell's children.
    fn spawn(launch: &Launch, spec: &Spec, cell: u64, processes: usize) -> Result<Children> {
        let exe = executable()?;
        let (tx, lines) = mpsc::channel();
        let mut children = Children {
            procs: Vec::with_capacity(processes),
            lines,
        };
        for i in 0..processes {
            let mut child = Command::new(&exe)
                .args(launch.args(spec, cell, i))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
            let (stdout, mut stderr) = (child.stdout.take(), child.stderr.take());
            let tx = tx.clone();
            std::thread::spawn(move || {
                if let Some(stdout) = stdout {
                    for line in BufReader::new(stdout).lines() {
                        let Ok(line) = line else { break };
                        if tx.send((i, Some(line))).is_err() {
                            return;
                        }
                    }
                }
                let _ = tx.send((i, None));
            });
            let stderr = std::thread::spawn(move || {
                let mut text = String::new();
                if let Some(stderr) = stderr.as_mut() {
                    let _ = stderr.read_to_string(&mut text);
                }
                text
            });
            children.procs.push(Proc {
                stdin: child.stdin.take(),
                child,
                stderr: Some(stderr),
                status: None,
            });
        }
        Ok(children)
    }

    /// The next line of any child, if one comes before `deadline`; if none does, the error
    /// of the first child that `pending` says still owes one, `late` saying what it did not do.
    fn next(
        &mut self,
        deadline: Instant,
        pending: &[bool],
        late: &str,
    ) -> Result<(usize, Option<String>)> {
        let wait = deadline.saturating_duration_since(Instant::now());
        let i = pending.iter().position(|&p| p).unwrap_or(0);
        match self.lines.recv_timeout(wait) {
            Ok(message) => Ok(message),
            Err(RecvTimeoutError::Timeout) => Err(self.failed(i, late)),
            Err(RecvTimeoutError::Disconnected) => Err(self.failed(i, "stopped writing")),
        }
    }

    /// The error of a cell whose child `i` failed: what went wrong and what the child said on
    /// stderr. The other children are killed when `self` is dropped.
    fn failed(&mut self, i: usize, what: &str) -> Error {
        let total = self.procs.len();
        let proc = &mut self.procs[i];
        let status = proc.finish(EXIT_GRACE);
        let said = proc.errors();
        let mut message = format!("process {} of {total}: {what}", i + 1);
        if said.is_empty() {
            if let Some(status) = status {
                let _ = write!(message, " ({status})");
            }
        } else {
            let _ = write!(message, ": {said}");
        }
        message.into()
    }

    /// Writes `line` to every child.
    fn tell_all(&mut self, line: &str) -> Result<()> {
        for i in 0..self.procs.len() {
            let sent = match self.procs[i].stdin.as_mut() {
                Some(stdin) => stdin
                    .write_all(line.as_bytes())
                    .and_then(|()| stdin.flush()),
                None => Err(std::io::ErrorKind::BrokenPipe.into()),
            };
            if let Err(e) = sent {
                return Err(self.failed(i, &format!("could not be told to go: {e}")));
            }
        }
        Ok(())
    }

    fn pids(&self) -> Vec<u32> {
        self.procs.iter().map(|p| p.child.id()).collect()
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for proc in &mut self.procs {
            proc.stdin = None;
            if proc.status.is_none() {
                let _ = proc.child.kill();
                proc.status = proc.child.wait().ok();
            }
            if let Some(stderr) = proc.stderr.take() {
                let _ = stderr.join();
            }
        }
    }
}

/// Runs one multi-process cell (`spec.callers` is `PxC`) on `system`, which this process
/// opened and preloaded and which the children attach to.
pub fn run(
    system: &dyn System,
    launch: &Launch,
    spec: Spec,
    cell: u64,
    device: Option<&Device>,
) -> Result<Outcome> {
    let Callers::Processes { processes, .. } = spec.callers else {
        return fail(format!(
            "{} callers: not a multi-process cell",
            spec.callers
        ));
    };
    let mut children = Children::spawn(launch, &spec, cell, processes)?;

    let deadline = Instant::now() + READY_TIMEOUT;
    let mut pending = vec![true; processes];
    while pending.contains(&true) {
        let late = format!("not ready after {} s", READY_TIMEOUT.as_secs());
        match children.next(deadline, &pending, &late)? {
            (i, Some(line)) if line == "ready" && pending[i] => pending[i] = false,
            (i, Some(line)) => {
                let what = format!("said {:?} instead of ready", truncate(&line));
                return Err(children.failed(i, &what));
            }
            (i, None) => return Err(children.failed(i, "exited before it was ready")),
        }
    }

    // Every child has its clients open: the warm-up starts now, in every process.
    let (now, wall) = (Instant::now(), SystemTime::now());
    let warm_end = now + spec.warmup;
    let end = warm_end + spec.window;
    children.tell_all(&go_line(
        epoch_ns(wall + spec.warmup),
        epoch_ns(wall + spec.warmup + spec.window),
    ))?;
    let pids = children.pids();
    runner::sleep_until(warm_end);
    let before = runner::sample(system, device, &pids);
    runner::sleep_until(end);
    let after = runner::sample(system, device, &pids);
    // The window's end is sampled: the children may exit once they have sent their latencies.
    for proc in &mut children.procs {
        proc.stdin = None;
    }

    let deadline = end + RESULTS_TIMEOUT;
    let mut reports: Vec<Report> = (0..processes).map(|_| Report::default()).collect();
    let mut pending = vec![true; processes];
    while pending.contains(&true) {
        let late = format!(
            "no latencies {} s after the window",
            RESULTS_TIMEOUT.as_secs()
        );
        match children.next(deadline, &pending, &late)? {
            (i, Some(line)) => {
                if let Err(e) = reports[i].read(&line) {
                    return Err(children.failed(i, &e));
                }
                pending[i] = !reports[i].done;
            }
            (i, None) if pending[i] => {
                return Err(children.failed(i, "exited before sending its latencies"));
            }
            (_, None) => {}
        }
    }
    for i in 0..processes {
        match children.procs[i].finish(EXIT_GRACE) {
            Some(status) if status.success() => {}
            status => {
                let what = status.map_or("did not exit".into(), |s| format!("exited: {s}"));
                return Err(children.failed(i, &what));
            }
        }
    }

    let mut rec = Recorded::default();
    let mut fsyncs = Some(0);
    for report in &reports {
        rec.merge(&report.rec);
        fsyncs = fsyncs.zip(report.fsyncs).map(|(a, b)| a + b);
    }
    let mut outcome = Outcome::new(spec.window, rec, before?, after?);
    // Each child's store counts its own commits; the parent's store is idle in this cell.
    outcome.fsyncs = fsyncs;
    Ok(outcome)
}

/// The child side: runs child `index` of a multi-process cell, as the parent described it on
/// the command line; prints `ready`, waits for `go`, runs the cell's loop, prints its results.
pub fn child(args: &Args, index: usize) -> Result<()> {
    let (&[kind], &[workload], &[callers]) = (
        args.systems.as_slice(),
        args.workloads.as_slice(),
        args.callers.as_slice(),
    ) else {
        return fail("a child runs one system, one workload and one caller layout");
    };
    let Callers::Processes { processes, each } = callers else {
        return fail(format!("a child's callers are PxC, not {callers}"));
    };
    if index >= processes {
        return fail(format!("child {index} of {processes}"));
    }
    let Some(cell) = args.child_cell else {
        return fail("a child needs --child-cell");
    };
    let setup = Setup {
        dir: PathBuf::new(),
        seed: args.seed,
        payload: Payload::new(args.seed, args.response_bytes),
        postgres: args.postgres.clone(),
        redis: args.redis.clone(),
        preload_limit: Duration::ZERO,
    };
    let system = systems::attach(kind, &setup, args.child_schema.as_deref())?;
    let spec = Spec {
        workload,
        callers,
        warmup: Duration::from_secs_f64(args.warmup),
        window: Duration::from_secs_f64(args.seconds),
        seed: args.seed,
    };
    let share = Share {
        threads: each,
        first_stream: (index * each) as u64,
    };
    let mut parent_gone: Option<JoinHandle<()>> = None;
    let start = || -> Result<(Instant, Instant)> {
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(b"ready\n")?;
        stdout.flush()?;
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line)?;
        let Some((warm_end, end)) = parse_go(&line) else {
            return fail(format!("expected `go WARM_END END` on stdin, got {line:?}"));
        };
        let (now, now_ns) = (Instant::now(), epoch_ns(SystemTime::now()));
        let end = instant_at(end, now, now_ns);
        parent_gone = Some(watch_parent(end));
        Ok((instant_at(warm_end, now, now_ns), end))
    };
    let watch = |warm_end, end| {
        runner::sleep_until(warm_end);
        let before = system.fsyncs();
        runner::sleep_until(end);
        system.fsyncs().zip(before).map(|(a, b)| a - b)
    };
    let (rec, fsyncs) = runner::drive(&*system, &spec, cell, share, start, watch)?;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(results_text(&rec, fsyncs).as_bytes())?;
    stdout.flush()?;
    // Stay until the parent has sampled the window's end and closed our stdin: until then
    // this process's CPU must still be in /proc for `own_ticks`.
    if let Some(watcher) = parent_gone {
        let _ = watcher.join();
    }
    // Closes the connections; the data is the parent's.
    system.destroy()
}

/// Reads the rest of stdin on a thread of its own, which ends once the parent closes it. The
/// parent does that only after it sampled the window's end; an end of stdin before `end`
/// means that the parent is gone (killed): this process then exits at once, rather than
/// running its callers to the window's end for nobody.
fn watch_parent(end: Instant) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        // The slack covers the two processes' conversions between wall-clock and monotonic time.
        if Instant::now() + Duration::from_millis(100) < end {
            // Not `eprintln!`, which panics (this thread only) when stderr, the parent's pipe, is
            // gone with the parent.
            let _ = writeln!(
                std::io::stderr(),
                "error: the parent process closed stdin before the window's end"
            );
            std::process::exit(1);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_lines_round_trip_and_bad_ones_are_refused() {
        assert_eq!(parse_go(&go_line(5, 7)), Some((5, 7)));
        assert_eq!(
            parse_go("go 1700000000000000000 1700000003500000000\n"),
            Some((1_700_000_000_000_000_000, 1_700_000_003_500_000_000))
        );
        for bad in [
            "", "\n", "go", "go 1", "go 2 1", "go 1 2 3", "stop 1 2", "go -1 2",
        ] {
            assert_eq!(parse_go(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn wall_clock_times_become_instants() {
        let now = Instant::now();
        let now_ns = 1_000_000_000_000;
        assert_eq!(instant_at(now_ns, now, now_ns), now);
        assert_eq!(
            instant_at(now_ns + 1_500, now, now_ns),
            now + Duration::from_nanos(1_500)
        );
        // In the past (a `go` that came late): before now, never a panic.
        assert!(instant_at(now_ns - 1_000, now, now_ns) <= now);
        assert!(instant_at(0, now, now_ns) <= now);
    }

    #[test]
    fn results_round_trip() {
        let rec = Recorded {
            claim_ns: vec![300, 100, 200],
            cycle_ns: vec![900, 700],
        };
        for fsyncs in [Some(42), None] {
            let mut report = Report::default();
            for line in results_text(&rec, fsyncs).lines() {
                report.read(line).unwrap();
            }
            assert!(report.done);
            assert_eq!(report.rec, rec);
            assert_eq!(report.fsyncs, fsyncs);
        }
        let mut empty = Report::default();
        for line in results_text(&Recorded::default(), Some(0)).lines() {
            empty.read(line).unwrap();
        }
        assert_eq!(empty.rec, Recorded::default());
        assert!(Report::default().read("claim 1 x").is_err());
        assert!(Report::default().read("hello").is_err());
        let mut done = Report::default();
        done.read("done").unwrap();
        assert!(done.read("claim 1").is_err());
    }

    #[test]
    fn a_child_gets_its_cell_on_its_command_line() {
        let launch = Launch {
            kind: Kind::IdemdbPostgres,
            postgres: Some("host=127.0.0.1 port=5 user=postgres dbname=idem".into()),
            redis: None,
            schema: Some("compare_42".into()),
            response_bytes: 256,
        };
        let spec = Spec {
            workload: runner::Workload::Cycle,
            callers: Callers::Processes {
                processes: 4,
                each: 16,
            },
            warmup: Duration::from_millis(500),
            window: Duration::from_secs(3),
            seed: 7,
        };
        let args = launch.args(&spec, 1_000_123, 3);
        let parsed = <Args as clap::Parser>::try_parse_from(
            std::iter::once("idemdb-compare".to_owned()).chain(args),
        )
        .unwrap();
        assert_eq!(parsed.child, Some(3));
        assert_eq!(parsed.child_cell, Some(1_000_123));
        assert_eq!(parsed.child_schema.as_deref(), Some("compare_42"));
        assert_eq!(parsed.systems, [Kind::IdemdbPostgres]);
        assert_eq!(parsed.workloads, [runner::Workload::Cycle]);
        assert_eq!(parsed.callers, [spec.callers]);
        assert_eq!(parsed.postgres, launch.postgres);
        assert_eq!(parsed.redis, None);
        assert!((parsed.warmup - 0.5).abs() < f64::EPSILON);
        assert!((parsed.seconds - 3.0).abs() < f64::EPSILON);
        assert_eq!(parsed.seed, 7);
        assert_eq!(parsed.response_bytes, 256);
    }
}
