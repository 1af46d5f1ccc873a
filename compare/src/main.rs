//! `idemdb-compare`: idemdb next to naive redb, SQLite, PostgreSQL, Redis and the disk's fsync
//! floor, on one durable-claim workload, on one machine, in one run. See `compare/README.md`.

mod cli;
mod executor;
mod machine;
mod measure;
mod plot;
mod processes;
mod report;
mod runner;
mod systems;
mod tasks;
mod workload;

use clap::Parser as _;
use cli::Args;
use machine::Machine;
use measure::Device;
use processes::Launch;
use report::Row;
use runner::{Callers, Spec, Workload};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use systems::{Kind, Setup};
use workload::Payload;

fn main() {
    // Prints help (exit 0) or the error and usage (exit 2) itself.
    let args = Args::parse();
    // A child process of a multi-process cell (started by the harness itself, see
    // processes.rs): it writes nothing but its protocol on stdout and its errors on stderr.
    let result = match args.child {
        Some(index) => processes::child(&args, index),
        None => run(&args),
    };
    if let Err(e) = result {
        eprintln!("error: {}", systems::describe(&*e));
        std::process::exit(1);
    }
}

/// Where the embedded systems' files go by default, one `run-<time>-<pid>` directory per run (on
/// the build's disk: never `/tmp`, which may be tmpfs).
const DEFAULT_DATA_ROOT: &str = "target/compare/data";

/// Lets the preload's writes reach the disk before the first cell: `sync`, then a second's
/// pause, so no system's first cell pays for the writeback of its own (or another's) bulk load.
fn settle() {
    let _ = std::process::Command::new("sync").status();
    std::thread::sleep(Duration::from_secs(1));
}

/// What every cell of one system shares.
struct CellContext<'a> {
    system: &'a dyn systems::System,
    name: &'static str,
    keys: u64,
    args: &'a Args,
    cpus: usize,
    ticks: u64,
    device: Option<&'a Device>,
    /// What the child processes of a multi-process cell need to reach the system.
    launch: &'a Launch,
}

/// Runs one cell, and again (with new keys, after waiting for quiet) while other work used more
/// than `--max-other` % of the CPUs, up to `--retries` times; keeps the least disturbed attempt.
fn measure_cell(
    ctx: &CellContext<'_>,
    spec: Spec,
    workload_index: usize,
    label: &str,
    notes: &mut Vec<String>,
) -> Option<Row> {
    let args = ctx.args;
    let mut best: Option<Row> = None;
    let mut last_other = 0.0;
    for attempt in 0..=args.retries {
        if attempt > 0 {
            eprintln!(
                "{label}: other work used {last_other:.0}% of the CPUs; \
                 waiting for quiet, then retry {attempt}/{}",
                args.retries
            );
            wait_for_quiet(args.max_other, ctx.cpus, ctx.ticks);
        }
        // Every attempt draws its own keys: the earlier ones are in the store.
        let cell =
            (attempt as u64 * 4 + workload_index as u64 + 1) * 1_000_000 + spec.callers.tag();
        let outcome = match spec.callers {
            Callers::Threads(_) => runner::run(ctx.system, spec, cell, ctx.device),
            Callers::Tasks(_) => tasks::run(ctx.system, spec, cell, ctx.device),
            Callers::Processes { .. } => {
                processes::run(ctx.system, ctx.launch, spec, cell, ctx.device)
            }
        };
        match outcome {
            Ok(outcome) => {
                let row = Row::new(ctx.name, ctx.keys, &spec, outcome, ctx.ticks, ctx.cpus);
                eprintln!("{}", report::table_row(&row));
                last_other = row.others_pct;
                if best.as_ref().is_none_or(|b| row.others_pct < b.others_pct) {
                    best = Some(row);
                }
            }
            Err(e) => {
                let note = format!("{label}: cell aborted: {}", systems::describe(&*e));
                eprintln!("{note}");
                notes.push(note);
                break;
            }
        }
        if best
            .as_ref()
            .is_some_and(|b| b.others_pct <= args.max_other)
        {
            break;
        }
    }
    if let Some(row) = &best {
        if row.others_pct > args.max_other {
            notes.push(format!(
                "{label}: other work used {:.0}% of the CPUs in the best of {} attempts",
                row.others_pct,
                args.retries + 1
            ));
        }
    }
    best
}

/// Waits (at most two minutes) until other processes use at most half of `max_other` % of the
/// CPUs for three seconds in a row.
fn wait_for_quiet(max_other: f64, cpus: usize, tps: u64) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut quiet = 0;
    while quiet < 3 && Instant::now() < deadline {
        let others =
            100.0 * measure::others_busy(Duration::from_secs(1), &runner::SERVERS, tps, cpus);
        quiet = if others <= max_other / 2.0 {
            quiet + 1
        } else {
            0
        };
    }
}

/// The idemdb source measured: its git commit, and whether `src/` had uncommitted changes.
fn idemdb_revision() -> String {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(root)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        None => "idemdb (no git revision)".into(),
        Some(rev) => match git(&["status", "--porcelain", "--", "src", "Cargo.toml"]) {
            Some(changes) if !changes.is_empty() => {
                format!("idemdb {rev} + uncommitted changes in src/")
            }
            _ => format!("idemdb {rev}"),
        },
    }
}

/// Preload time of one (system, keys) pair.
struct Preload {
    system: &'static str,
    keys: u64,
    took: Duration,
}

fn run(args: &Args) -> systems::Result<()> {
    let started = Instant::now();
    std::fs::create_dir_all(&args.out)?;
    let (data_root, owned) = match &args.data_dir {
        Some(dir) => (dir.clone(), false),
        None => {
            let stamp = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            (
                PathBuf::from(DEFAULT_DATA_ROOT)
                    .join(format!("run-{stamp}-{}", std::process::id())),
                true,
            )
        }
    };
    std::fs::create_dir_all(&data_root)?;
    let machine = Machine::describe(&data_root);
    let device = Device::of(&data_root);
    let ticks = measure::ticks_per_second();

    let mut head = String::new();
    let _ = writeln!(
        head,
        "machine: {} CPUs ({}), {} RAM, Linux {}",
        machine.cpus, machine.cpu_model, machine.memory, machine.kernel
    );
    let _ = writeln!(
        head,
        "data dir: {} on {}, device {}",
        data_root.display(),
        machine.filesystem,
        device.as_ref().map_or_else(
            |e| format!("unknown ({e}): no bytes/flush figures"),
            |d| { format!("{} ({}:{})", d.name, d.major, d.minor) }
        )
    );
    let _ = writeln!(
        head,
        "run: {} s per cell after {} s warm-up; callers [{}]; keys {:?}; response {} bytes; seed {}; \
         cells retried up to {} times while other work uses > {}% of the CPUs",
        args.seconds,
        args.warmup,
        args.callers
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        args.keys,
        args.response_bytes,
        args.seed,
        args.retries,
        args.max_other
    );
    let _ = writeln!(
        head,
        "load average at start: {} (anything else running skews every figure)",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let _ = writeln!(
        head,
        "cpu_us/op counts the whole machine (harness clients + server processes + anything else)."
    );
    let _ = writeln!(
        head,
        "servers, if any, must keep their data on the same device for B/op and flush/op to count them."
    );
    std::fs::write(args.out.join("machine.txt"), &head)?;
    if machine.on_memory() {
        eprintln!(
            "warning: the data dir is on {}: fsync costs nothing there, the figures mean nothing",
            machine.filesystem
        );
    }
    eprint!("{head}");

    let payload = Payload::new(args.seed, args.response_bytes);
    let mut notes: Vec<String> = Vec::new();
    let mut rows: Vec<Row> = Vec::new();
    let mut preloads: Vec<Preload> = Vec::new();
    let mut versions: Vec<String> = vec![format!("sqlite {}", rusqlite::version())];

    for &keys in &args.keys {
        for &kind in &args.systems {
            let callers: Vec<Callers> = if kind.single_caller() {
                vec![Callers::Threads(1)]
            } else {
                let mut skipped: Vec<(&str, Vec<String>)> = Vec::new();
                let mut runs = Vec::new();
                for &c in &args.callers {
                    match kind.runs(c) {
                        Ok(()) => runs.push(c),
                        Err(why) => match skipped.iter_mut().find(|(w, _)| *w == why) {
                            Some((_, layouts)) => layouts.push(c.to_string()),
                            None => skipped.push((why, vec![c.to_string()])),
                        },
                    }
                }
                for (why, layouts) in skipped {
                    let note = format!(
                        "{}: {} callers skipped: {why}",
                        kind.name(),
                        layouts.join(", ")
                    );
                    eprintln!("{note}");
                    if !notes.contains(&note) {
                        notes.push(note);
                    }
                }
                runs
            };
            if callers.is_empty() {
                continue;
            }
            let setup = Setup {
                dir: data_root.join(format!("{}-{keys}", kind.name())),
                seed: args.seed,
                payload: payload.clone(),
                postgres: args.postgres.clone(),
                redis: args.redis.clone(),
                preload_limit: Duration::from_secs_f64(args.max_preload),
            };
            match systems::probe(kind, &setup) {
                Ok(Some(version)) if !versions.contains(&version) => versions.push(version),
                Ok(_) => {}
                Err(e) => {
                    let note = format!("{}: skipped ({e})", kind.name());
                    eprintln!("{note}");
                    if !notes.contains(&note) {
                        notes.push(note);
                    }
                    continue;
                }
            }
            let (preload_keys, what) = if kind == Kind::FsyncFloor {
                (0, "setting up".to_string())
            } else {
                (keys, format!("preloading {keys} keys"))
            };
            eprintln!("{}: {what} ...", kind.name());
            let t = Instant::now();
            let system = match systems::open(kind, &setup, preload_keys) {
                Ok(s) => s,
                Err(e) => {
                    let note = format!("{} keys {keys}: open/preload failed: {e}", kind.name());
                    eprintln!("{note}");
                    notes.push(note);
                    let _ = std::fs::remove_dir_all(&setup.dir);
                    continue;
                }
            };
            let took = t.elapsed();
            if preload_keys > 0 {
                eprintln!(
                    "{}: preloaded {keys} keys in {:.1} s ({:.0} keys/s)",
                    kind.name(),
                    took.as_secs_f64(),
                    keys as f64 / took.as_secs_f64()
                );
                preloads.push(Preload {
                    system: kind.name(),
                    keys,
                    took,
                });
            }
            settle();
            let dev = device.as_ref().ok();
            let launch = Launch {
                kind,
                postgres: args.postgres.clone(),
                redis: args.redis.clone(),
                schema: system.shared_schema().map(str::to_owned),
                response_bytes: args.response_bytes,
            };
            for (w, &workload) in args.workloads.iter().enumerate() {
                for &c in &callers {
                    let spec = Spec {
                        workload,
                        callers: c,
                        warmup: Duration::from_secs_f64(args.warmup),
                        window: Duration::from_secs_f64(args.seconds),
                        seed: args.seed,
                    };
                    let label = format!(
                        "{} keys {keys} {} {c} callers",
                        kind.name(),
                        workload.name()
                    );
                    let ctx = CellContext {
                        system: &*system,
                        name: kind.name(),
                        keys,
                        args,
                        cpus: machine.cpus,
                        ticks,
                        device: dev,
                        launch: &launch,
                    };
                    if let Some(row) = measure_cell(&ctx, spec, w, &label, &mut notes) {
                        rows.push(row);
                    }
                }
            }
            if let Err(e) = system.destroy() {
                notes.push(format!("{}: cleanup failed: {e}", kind.name()));
            }
        }
    }
    if owned {
        let _ = std::fs::remove_dir_all(&data_root);
    }

    let finished = Finished {
        head,
        versions,
        notes,
        rows,
        preloads,
    };
    finished.write(args, started)
}

/// Everything a run gathered, for the outputs.
struct Finished {
    head: String,
    versions: Vec<String>,
    notes: Vec<String>,
    rows: Vec<Row>,
    preloads: Vec<Preload>,
}

impl Finished {
    /// Prints the summary (machine, notes, table, preloads, ratios) and writes it with the CSVs
    /// and the plots into the out directory.
    fn write(self, args: &Args, started: Instant) -> systems::Result<()> {
        let Finished {
            head,
            versions,
            notes,
            rows,
            preloads,
        } = self;
        let mut text = head.clone();
        let _ = writeln!(
            text,
            "versions: {}, redb 4, {}",
            idemdb_revision(),
            versions.join(", ")
        );
        for note in &notes {
            let _ = writeln!(text, "note: {note}");
        }
        let _ = writeln!(text, "\n{}", report::header());
        for row in &rows {
            let _ = writeln!(text, "{}", report::table_row(row));
        }
        let _ = writeln!(text, "\n{}", report::LEGEND);
        if !preloads.is_empty() {
            let _ = writeln!(
                text,
                "\npreload (completed records, fastest bulk path of each system):"
            );
            for p in &preloads {
                let _ = writeln!(
                    text,
                    "  {:<11} {:>9} keys {:>8.1} s {:>10.0} keys/s",
                    p.system,
                    p.keys,
                    p.took.as_secs_f64(),
                    p.keys as f64 / p.took.as_secs_f64()
                );
            }
            let _ = writeln!(
                text,
                "  (each preloaded database is reused for all of its cells: every cell adds new keys)"
            );
        }
        let peers: Vec<&str> = ["naive-redb", "sqlite", "postgres", "redis"].to_vec();
        let ratios = report::ratios(&rows, &peers);
        if !ratios.is_empty() {
            let _ = writeln!(text, "\nratios:\n{ratios}");
        }

        std::fs::write(args.out.join("results.csv"), report::csv(&rows))?;
        std::fs::write(args.out.join("preload.csv"), preload_csv(&preloads))?;
        let mut plots = Vec::new();
        for &keys in &args.keys {
            for &workload in &args.workloads {
                let group: Vec<Row> = rows
                    .iter()
                    .filter(|r| r.keys == keys && r.workload == workload.name())
                    .cloned()
                    .collect();
                if group.is_empty() {
                    continue;
                }
                let cycle = workload.completes();
                let (title, y_label) = if cycle {
                    let responses = match workload {
                        Workload::Charge => "1-4 KB JSON charges",
                        _ => "fixed responses",
                    };
                    (
                        format!(
                            "claim + complete ({responses}): latency vs throughput, \
                             {keys} preloaded keys"
                        ),
                        "claim+complete latency, p50 (log scale)",
                    )
                } else {
                    (
                        format!("new-key claim: latency vs throughput, {keys} preloaded keys"),
                        "claim latency, p50 (log scale)",
                    )
                };
                let path = args.out.join(format!(
                    "latency-vs-throughput-{}-{keys}.svg",
                    workload.name()
                ));
                std::fs::write(&path, plot::svg(&title, y_label, &group, cycle))?;
                plots.push(path);
            }
        }
        let _ = writeln!(
            text,
            "outputs: {}, {}, {}, {}{}",
            args.out.join("summary.txt").display(),
            args.out.join("results.csv").display(),
            args.out.join("preload.csv").display(),
            args.out.join("machine.txt").display(),
            plots
                .iter()
                .map(|p| format!(", {}", p.display()))
                .collect::<String>()
        );
        let _ = writeln!(text, "total time: {:.0} s", started.elapsed().as_secs_f64());
        std::fs::write(args.out.join("summary.txt"), &text)?;
        print!("{text}");
        Ok(())
    }
}

/// The preload times as CSV.
fn preload_csv(preloads: &[Preload]) -> String {
    let mut out = String::from("system,keys,seconds,keys_per_s\n");
    for p in preloads {
        let secs = p.took.as_secs_f64();
        let _ = writeln!(
            out,
            "{},{},{secs:.3},{:.1}",
            report::csv_field(p.system),
            p.keys,
            p.keys as f64 / secs
        );
    }
    out
}
