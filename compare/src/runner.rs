//! One cell: N caller threads, each with its own client, started together, running a workload
//! for a warm-up and then a measured window; the disk, CPU and fsync counters are sampled at
//! the window's edges.

use crate::measure::{self, Device, DiskStats};
use crate::systems::{fail, Result, System};
use crate::workload::{Requests, Rng};
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
}

impl Workload {
    /// Both, in the order they run.
    pub const ALL: [Workload; 2] = [Workload::Claim, Workload::Cycle];

    /// The name used on the command line and in the outputs.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Claim => "claim",
            Workload::Cycle => "cycle",
        }
    }

    /// The workload named `name`.
    pub fn parse(name: &str) -> Option<Workload> {
        Workload::ALL.into_iter().find(|w| w.name() == name)
    }
}

/// What to run.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// The workload.
    pub workload: Workload,
    /// Caller threads, each with its own client.
    pub callers: usize,
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
struct Sample {
    disk: Option<DiskStats>,
    ticks: u64,
    own_ticks: u64,
    fsyncs: Option<u64>,
}

fn sample(system: &dyn System, device: Option<&Device>) -> Result<Sample> {
    Ok(Sample {
        disk: device.map(Device::stats).transpose()?,
        ticks: measure::busy_ticks()?,
        own_ticks: measure::own_ticks(&SERVERS),
        fsyncs: system.fsyncs(),
    })
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

/// One caller's latencies.
struct Recorded {
    claim_ns: Vec<u64>,
    cycle_ns: Vec<u64>,
}

/// Runs one cell. The first error of any caller (a connection refused, a claim that did not
/// acquire) stops every caller and is returned.
pub fn run(system: &dyn System, spec: Spec, cell: u64, device: Option<&Device>) -> Result<Outcome> {
    let ready = Barrier::new(spec.callers + 1);
    let go = Barrier::new(spec.callers + 1);
    let times: OnceLock<(Instant, Instant)> = OnceLock::new();
    let abort = AtomicBool::new(false);
    // Room for a generous rate, so that pushes rarely reallocate inside the window.
    let per_caller = (spec.window.as_secs_f64() * 100_000.0 / spec.callers as f64) as usize + 1024;

    let (results, before, after) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..spec.callers)
            .map(|t| {
                let (ready, go, times, abort) = (&ready, &go, &times, &abort);
                s.spawn(move || -> Result<Recorded> {
                    let client = system.client();
                    ready.wait();
                    go.wait();
                    let mut client = match client {
                        Ok(client) => client,
                        Err(e) => {
                            abort.store(true, Ordering::Relaxed);
                            return Err(e);
                        }
                    };
                    let (warm_end, end) = *times.get().expect("set before go");
                    let mut requests = Requests::new(Rng::derive(spec.seed, cell, t as u64));
                    let mut rec = Recorded {
                        claim_ns: Vec::with_capacity(per_caller),
                        cycle_ns: Vec::with_capacity(match spec.workload {
                            Workload::Claim => 0,
                            Workload::Cycle => per_caller,
                        }),
                    };
                    while !abort.load(Ordering::Relaxed) {
                        let req = requests.next_request();
                        let start = Instant::now();
                        if start >= end {
                            break;
                        }
                        let result = client.claim(&req).and_then(|()| {
                            let claimed = Instant::now();
                            if spec.workload == Workload::Cycle {
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
                        // Counted by completion time, so that slow requests straddling
                        // the window's start are not lost (that would bias slow cells down).
                        if done > warm_end && done <= end {
                            rec.claim_ns.push((claimed - start).as_nanos() as u64);
                            if spec.workload == Workload::Cycle {
                                rec.cycle_ns.push((done - start).as_nanos() as u64);
                            }
                        }
                    }
                    Ok(rec)
                })
            })
            .collect();
        ready.wait();
        let start = Instant::now();
        let warm_end = start + spec.warmup;
        let end = warm_end + spec.window;
        times.set((warm_end, end)).expect("set once");
        go.wait();
        sleep_until(warm_end);
        let before = sample(system, device);
        sleep_until(end);
        let after = sample(system, device);
        let results: Vec<_> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| fail("a caller panicked")))
            .collect();
        (results, before, after)
    });

    let (before, after) = (before?, after?);
    let mut claim_ns = Vec::new();
    let mut cycle_ns = Vec::new();
    for r in results {
        let r = r?;
        claim_ns.extend_from_slice(&r.claim_ns);
        cycle_ns.extend_from_slice(&r.cycle_ns);
    }
    let disk = match (before.disk, after.disk) {
        (Some(b), Some(a)) => Some(DiskStats {
            sectors_written: a.sectors_written - b.sectors_written,
            flushes: a.flushes.zip(b.flushes).map(|(a, b)| a - b),
        }),
        _ => None,
    };
    Ok(Outcome {
        ops: claim_ns.len() as u64,
        window: spec.window,
        claim_ns,
        cycle_ns,
        disk,
        busy_ticks: after.ticks - before.ticks,
        own_ticks: after.own_ticks.saturating_sub(before.own_ticks),
        fsyncs: after.fsyncs.zip(before.fsyncs).map(|(a, b)| a - b),
    })
}
