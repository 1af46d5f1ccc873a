//! One cell: N caller threads, each with its own client, started together, running a workload
//! for a warm-up and then a measured window; the disk, CPU and fsync counters are sampled at
//! the window's edges. The callers' loop ([`drive`]) is also what each child process of a
//! multi-process cell runs (`processes.rs`).

use crate::measure::{self, Device, DiskStats};
use crate::systems::{fail, Result, System};
use crate::workload::{Request, Requests, Rng};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, OnceLock};
use std::time::{Duration, Instant};

/// What each request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// Claim a new key; the key stays claimed (in progress).
    Claim,
    /// Claim a new key, then complete it with the response.
    Cycle,
    /// As `Cycle`, each response a charge of 1-4 KB of JSON of its own, as payment APIs answer
    /// (`idemdb::simulation::charge`), drawn outside the timed part.
    Charge,
}

impl Workload {
    /// Every workload, in the order they run.
    pub const ALL: [Workload; 3] = [Workload::Claim, Workload::Cycle, Workload::Charge];

    /// The name used on the command line and in the outputs.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Claim => "claim",
            Workload::Cycle => "cycle",
            Workload::Charge => "charge",
        }
    }

    /// Whether each request completes its claim (and so has a whole-request latency).
    pub fn completes(self) -> bool {
        matches!(self, Workload::Cycle | Workload::Charge)
    }

    /// The next request of this workload from `requests`.
    pub fn next_request(self, requests: &mut Requests) -> Request {
        match self {
            Workload::Claim | Workload::Cycle => requests.next_request(),
            Workload::Charge => requests.next_request_with_charge(),
        }
    }

    /// The workload named `name`.
    pub fn parse(name: &str) -> Option<Workload> {
        Workload::ALL.into_iter().find(|w| w.name() == name)
    }
}

/// How a cell's callers are laid out: threads of the harness process, tokio tasks on the async
/// API, or several processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Callers {
    /// `N`: N caller threads in the harness process, on the blocking API.
    Threads(usize),
    /// `Nt`: N tokio tasks on a multi-thread runtime in the harness process, on the async API
    /// (idemdb and idemdb-postgres only; see `tasks.rs`).
    Tasks(usize),
    /// `PxC`: P child processes of the harness, C caller threads each, all on one server.
    Processes {
        /// Child processes.
        processes: usize,
        /// Caller threads per child.
        each: usize,
    },
}

impl Callers {
    /// `64`, `64t` or `4x16`; every number 1 or more.
    pub fn parse(s: &str) -> Option<Callers> {
        let count = |s: &str| {
            s.bytes()
                .all(|b| b.is_ascii_digit())
                .then(|| s.parse::<usize>().ok())
                .flatten()
                .filter(|&n| n > 0)
        };
        if let Some(tasks) = s.strip_suffix('t') {
            return count(tasks).map(Callers::Tasks);
        }
        match s.split_once('x') {
            None => count(s).map(Callers::Threads),
            Some((p, c)) => Some(Callers::Processes {
                processes: count(p)?,
                each: count(c)?,
            }),
        }
    }

    /// Caller threads in all, over every process.
    pub fn total(self) -> usize {
        match self {
            Callers::Threads(n) | Callers::Tasks(n) => n,
            Callers::Processes { processes, each } => processes * each,
        }
    }

    /// The part of a cell's number that tells the layouts apart (so that `64`, `64t` and
    /// `4x16`, or `16` and `1x16`, draw different keys).
    pub fn tag(self) -> u64 {
        match self {
            Callers::Threads(n) => n as u64,
            Callers::Tasks(n) => (1 << 61) | n as u64,
            Callers::Processes { processes, each } => {
                (1 << 62) | ((processes as u64) << 31) | each as u64
            }
        }
    }

    /// How layouts sort (in the ratios and along a plot's line): by callers in all, threads
    /// of one process, then tasks, then the same number spread over processes.
    fn order(self) -> (usize, usize, usize) {
        match self {
            Callers::Threads(n) => (n, 0, 0),
            Callers::Tasks(n) => (n, 1, 0),
            Callers::Processes { processes, each } => (processes * each, 2, processes),
        }
    }
}

impl std::fmt::Display for Callers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = match self {
            Callers::Threads(n) => n.to_string(),
            Callers::Tasks(n) => format!("{n}t"),
            Callers::Processes { processes, each } => format!("{processes}x{each}"),
        };
        // Padded, so that table columns line up.
        f.pad(&text)
    }
}

impl Ord for Callers {
    fn cmp(&self, other: &Callers) -> std::cmp::Ordering {
        self.order()
            .cmp(&other.order())
            .then_with(|| self.tag().cmp(&other.tag()))
    }
}

impl PartialOrd for Callers {
    fn partial_cmp(&self, other: &Callers) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// What to run.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// The workload.
    pub workload: Workload,
    /// Caller threads (and processes), each with its own client.
    pub callers: Callers,
    /// Time run before the measured window.
    pub warmup: Duration,
    /// Length of the measured window.
    pub window: Duration,
    /// The seed keys are drawn from; the cell's callers each get their own stream.
    pub seed: u64,
}

/// What a cell measured, over its window.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Requests (claims, or claim+complete cycles) that ended in the window.
    pub ops: u64,
    /// The window's length.
    pub window: Duration,
    /// Claim latencies, nanoseconds, unsorted.
    pub claim_ns: Vec<u64>,
    /// Whole-request latencies (claim then complete), nanoseconds; empty for `Claim`.
    pub cycle_ns: Vec<u64>,
    /// Device counters' growth over the window, if the device is known.
    pub disk: Option<DiskStats>,
    /// Busy CPU ticks over the window, machine-wide.
    pub busy_ticks: u64,
    /// CPU ticks over the window of the harness process and the server processes.
    pub own_ticks: u64,
    /// The system's own fsync count's growth over the window, where it keeps one.
    pub fsyncs: Option<u64>,
}

/// Server processes whose CPU counts as the measured systems' own.
pub const SERVERS: [&str; 2] = ["postgres", "redis"];

/// Counters sampled at one edge of the window.
pub struct Sample {
    disk: Option<DiskStats>,
    ticks: u64,
    own_ticks: u64,
    fsyncs: Option<u64>,
}

/// The counters now. `children`: PIDs of the cell's child processes, whose CPU counts as the
/// harness's own (see [`measure::own_ticks`]).
pub fn sample(system: &dyn System, device: Option<&Device>, children: &[u32]) -> Result<Sample> {
    Ok(Sample {
        disk: device.map(Device::stats).transpose()?,
        ticks: measure::busy_ticks()?,
        own_ticks: measure::own_ticks(&SERVERS, children),
        fsyncs: system.fsyncs(),
    })
}

/// Sleeps until `t` (not at all if it has passed).
pub fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

/// The latencies some callers recorded in the window, nanoseconds, unsorted.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// Claim latencies.
    pub claim_ns: Vec<u64>,
    /// Whole-request latencies (`cycle` only).
    pub cycle_ns: Vec<u64>,
}

impl Recorded {
    /// Empty, with room for one of `spec`'s callers at a generous rate (100 000 requests/s
    /// over all of the cell's callers), so that pushes rarely reallocate inside the window.
    pub fn for_caller(spec: &Spec) -> Recorded {
        let per_caller =
            (spec.window.as_secs_f64() * 100_000.0 / spec.callers.total() as f64) as usize + 1024;
        let completes = if spec.workload.completes() {
            per_caller
        } else {
            0
        };
        Recorded {
            claim_ns: Vec::with_capacity(per_caller),
            cycle_ns: Vec::with_capacity(completes),
        }
    }

    /// Records one request that began at `began`, whose claim returned at `claimed` and which
    /// ended at `done`, if it ended inside the window (`warm_end`, `end`]: counted by
    /// completion time, so that slow requests straddling the window's start are not lost (that
    /// would bias slow cells down). `completes`: whether the request completed its claim.
    pub fn record(
        &mut self,
        (began, claimed, done): (Instant, Instant, Instant),
        (warm_end, end): (Instant, Instant),
        completes: bool,
    ) {
        if done > warm_end && done <= end {
            self.claim_ns.push((claimed - began).as_nanos() as u64);
            if completes {
                self.cycle_ns.push((done - began).as_nanos() as u64);
            }
        }
    }

    /// Adds `other`'s latencies to these.
    pub fn merge(&mut self, other: &Recorded) {
        self.claim_ns.extend_from_slice(&other.claim_ns);
        self.cycle_ns.extend_from_slice(&other.cycle_ns);
    }
}

/// Which of a cell's callers one process runs.
#[derive(Debug, Clone, Copy)]
pub struct Share {
    /// Caller threads in this process.
    pub threads: usize,
    /// The key stream of its first caller: caller `t` draws from stream `first_stream + t`, so
    /// that no two callers of a cell, in whatever process, draw the same keys (every request
    /// must claim a new key).
    pub first_stream: u64,
}

/// The loop of every cell, whether its callers are threads of the harness ([`run`]) or of
/// child processes (`processes::child`): `share.threads` callers each open a client; once all
/// have, `start` (on this thread) says when the warm-up and the window end, and the callers
/// loop (draw a new request outside the timed part, time the operation(s), record it if it
/// ended in the window) until the window's end, while `watch` runs on this thread with those two
/// instants (to sample counters at the window's edges). Returns the callers' latencies and what
/// `watch` returned.
///
/// The first error of any caller (a connection refused, a claim that did not acquire) stops
/// every caller and is returned; if a client could not be opened, neither `start` nor `watch`
/// is called. An error of `start` stops the callers before they begin.
pub fn drive<W>(
    system: &dyn System,
    spec: &Spec,
    cell: u64,
    share: Share,
    start: impl FnOnce() -> Result<(Instant, Instant)>,
    watch: impl FnOnce(Instant, Instant) -> W,
) -> Result<(Recorded, W)> {
    let ready = Barrier::new(share.threads + 1);
    let go = Barrier::new(share.threads + 1);
    let times: OnceLock<(Instant, Instant)> = OnceLock::new();
    let abort = AtomicBool::new(false);
    let workload = spec.workload;

    std::thread::scope(|s| {
        let handles: Vec<_> = (0..share.threads)
            .map(|t| {
                let (ready, go, times, abort) = (&ready, &go, &times, &abort);
                s.spawn(move || -> Result<Recorded> {
                    let client = system.client();
                    if client.is_err() {
                        abort.store(true, Ordering::Relaxed);
                    }
                    ready.wait();
                    go.wait();
                    let mut client = client?;
                    let (warm_end, end) = *times.get().expect("set before go");
                    let stream = share.first_stream + t as u64;
                    let mut requests = Requests::new(Rng::derive(spec.seed, cell, stream));
                    let mut rec = Recorded::for_caller(spec);
                    while !abort.load(Ordering::Relaxed) {
                        let req = workload.next_request(&mut requests);
                        let began = Instant::now();
                        if began >= end {
                            break;
                        }
                        let result = client.claim(&req).and_then(|()| {
                            let claimed = Instant::now();
                            if workload.completes() {
                                client.complete(&req)?;
                            }
                            Ok(claimed)
                        });
                        let claimed = match result {
                            Ok(claimed) => claimed,
                            Err(e) => {
                                abort.store(true, Ordering::Relaxed);
                                return Err(e);
                            }
                        };
                        let done = Instant::now();
                        rec.record(
                            (began, claimed, done),
                            (warm_end, end),
                            workload.completes(),
                        );
                    }
                    Ok(rec)
                })
            })
            .collect();
        ready.wait();
        // Every client is open, unless one failed (its error is returned below).
        let started = (!abort.load(Ordering::Relaxed)).then(start);
        let (warm_end, end) = match &started {
            Some(Ok(times)) => *times,
            _ => {
                abort.store(true, Ordering::Relaxed);
                let now = Instant::now();
                (now, now)
            }
        };
        times.set((warm_end, end)).expect("set once");
        go.wait();
        let watched = matches!(started, Some(Ok(_))).then(|| watch(warm_end, end));
        let results: Vec<Result<Recorded>> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| fail("a caller panicked")))
            .collect();
        let mut all = Recorded::default();
        for r in results {
            all.merge(&r?);
        }
        match (started, watched) {
            (Some(Ok(_)), Some(watched)) => Ok((all, watched)),
            (Some(Err(e)), _) => Err(e),
            _ => fail("a caller's client failed without an error"),
        }
    })
}

impl Outcome {
    /// A cell's outcome from its callers' latencies and the counters at the window's edges.
    pub fn new(window: Duration, rec: Recorded, before: Sample, after: Sample) -> Outcome {
        let disk = match (before.disk, after.disk) {
            (Some(b), Some(a)) => Some(DiskStats {
                sectors_written: a.sectors_written - b.sectors_written,
                flushes: a.flushes.zip(b.flushes).map(|(a, b)| a - b),
            }),
            _ => None,
        };
        Outcome {
            ops: rec.claim_ns.len() as u64,
            window,
            claim_ns: rec.claim_ns,
            cycle_ns: rec.cycle_ns,
            disk,
            busy_ticks: after.ticks - before.ticks,
            own_ticks: after.own_ticks.saturating_sub(before.own_ticks),
            fsyncs: after.fsyncs.zip(before.fsyncs).map(|(a, b)| a - b),
        }
    }
}

/// Runs one cell whose callers are threads of this process (`--callers N`).
pub fn run(system: &dyn System, spec: Spec, cell: u64, device: Option<&Device>) -> Result<Outcome> {
    let share = Share {
        threads: spec.callers.total(),
        first_stream: 0,
    };
    let start = || {
        let warm_end = Instant::now() + spec.warmup;
        Ok((warm_end, warm_end + spec.window))
    };
    let watch = |warm_end, end| {
        sleep_until(warm_end);
        let before = sample(system, device, &[]);
        sleep_until(end);
        (before, sample(system, device, &[]))
    };
    let (rec, (before, after)) = drive(system, &spec, cell, share, start, watch)?;
    Ok(Outcome::new(spec.window, rec, before?, after?))
}

#[cfg(test)]
mod tests {
    use super::Callers;

    #[test]
    fn caller_layouts_parse() {
        assert_eq!(Callers::parse("64"), Some(Callers::Threads(64)));
        assert_eq!(
            Callers::parse("4x16"),
            Some(Callers::Processes {
                processes: 4,
                each: 16
            })
        );
        assert_eq!(
            Callers::parse("1x1"),
            Some(Callers::Processes {
                processes: 1,
                each: 1
            })
        );
        assert_eq!(Callers::parse("64t"), Some(Callers::Tasks(64)));
        assert_eq!(Callers::parse("1t"), Some(Callers::Tasks(1)));
        for bad in [
            "0", "0x16", "4x0", "x16", "4x", "x", "", "4x16x2", "4X16", "-4x16", "+4", "4 x16",
            "4x+16", "1.5", "0t", "t", "t64", "64tt", "4x16t", "64T",
        ] {
            assert_eq!(Callers::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn caller_layouts_print_count_and_sort() {
        let multi = Callers::Processes {
            processes: 4,
            each: 16,
        };
        assert_eq!(multi.to_string(), "4x16");
        assert_eq!(Callers::Threads(64).to_string(), "64");
        assert_eq!(format!("{multi:>6}"), "  4x16");
        assert_eq!(multi.total(), 64);
        assert_ne!(multi.tag(), Callers::Threads(64).tag());
        assert_ne!(
            Callers::Processes {
                processes: 1,
                each: 16
            }
            .tag(),
            Callers::Threads(16).tag()
        );
        assert_eq!(Callers::Tasks(64).to_string(), "64t");
        assert_eq!(Callers::Tasks(64).total(), 64);
        assert_ne!(Callers::Tasks(64).tag(), Callers::Threads(64).tag());
        assert_ne!(Callers::Tasks(64).tag(), multi.tag());
        let mut v = [
            multi,
            Callers::Tasks(64),
            Callers::Threads(64),
            Callers::Threads(1),
            Callers::Processes {
                processes: 2,
                each: 32,
            },
        ];
        v.sort();
        let names: Vec<String> = v.iter().map(ToString::to_string).collect();
        assert_eq!(names, ["1", "64", "64t", "2x32", "4x16"]);
    }
}
