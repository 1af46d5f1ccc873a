//! Restart after a crash: how soon a store killed with SIGKILL under load serves its first
//! claim, and whether every answer is right from that first one on. Prints one table.
//!
//! `cargo bench --bench restart` (1 million records), or `IDEMDB_RESTART_KEYS=10000000 cargo
//! bench --bench restart` (about 5 minutes to build the store, 7 GB of disk). Run as root, the
//! page cache is dropped (`/proc/sys/vm/drop_caches`) before each cold open; otherwise only warm
//! rows are printed.
//!
//! 1. **make** (once; the file is kept in `IDEMDB_BENCH_DIR` or `CARGO_TARGET_TMPDIR` as
//!    `restart-<N>.idem` and reused): N claim + complete cycles with 256-byte responses, through
//!    the async API, then a clean close.
//! 2. **killed under load**: a child opens the store and runs claim + complete cycles of new keys
//!    from 64 threads, printing each acknowledgement; after 3 s it is sent SIGKILL.
//! 3. **crash open**: a child opens the store (cold, and again after another kill, warm), claims
//!    one of the N keys (the first claim: it must replay), then claims every one of the N keys
//!    and every key acknowledged before the kill, and counts wrong answers: a completed key must
//!    replay its response byte for byte, an acknowledged claim must be in progress.
//! 4. **clean open**: the same after the check child closed the store cleanly.
//!
//! `IDEMDB_RESTART_PAGE_CHECK=verify` opens with redb's page verification.

use idemdb::{Claim, Fingerprint, PageCheck, Response, Scope, Store};
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[allow(dead_code)] // shared with the other benches, which use all of it
mod common;
use common::SplitMix64;

const CHILD_ENV: &str = "IDEMDB_RESTART_CHILD";
const RESPONSE_LEN: usize = 256;
const IN_FLIGHT: usize = 8192;
const LOAD_THREADS: usize = 64;
const LOAD_SECONDS: u64 = 3;

fn main() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        child(&spec);
        return;
    }
    let n: u64 = std::env::var("IDEMDB_RESTART_KEYS").map_or(1_000_000, |s| {
        s.parse().expect("IDEMDB_RESTART_KEYS: a number")
    });
    let dir = std::env::var_os("IDEMDB_BENCH_DIR")
        .or_else(|| std::env::var_os("CARGO_TARGET_TMPDIR"))
        .map_or_else(std::env::temp_dir, PathBuf::from);
    let path = dir.join(format!("restart-{n}.idem"));
    if !path.exists() {
        let started = Instant::now();
        run("make", &path, n, 0);
        eprintln!(
            "made {} in {:.0} s",
            path.display(),
            started.elapsed().as_secs_f64()
        );
    }
    let can_drop = std::fs::OpenOptions::new()
        .write(true)
        .open("/proc/sys/vm/drop_caches")
        .is_ok();
    println!(
        "restart of a store of {n} completed records (256-byte responses), {}",
        check_name()
    );
    println!("| state | page cache | open | first claim answered | keys checked | wrong |");
    println!("| --- | --- | ---: | ---: | ---: | ---: |");
    let caches: &[bool] = if can_drop { &[true, false] } else { &[false] };
    for &cold in caches {
        // Load keys are new in every round, whatever earlier runs left in the file.
        let round = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| u64::try_from(d.as_micros()).unwrap_or(1));
        let acked = kill_under_load(&path, round);
        report("after SIGKILL under load", cold, &path, n, round, &acked);
    }
    for &cold in caches {
        report("after a clean close", cold, &path, n, 0, &HashMap::new());
    }
    println!(
        "file: {} bytes store + journal, {:.0} bytes per record",
        file_bytes(&path),
        file_bytes(&path) as f64 / n as f64
    );
}

fn check_name() -> &'static str {
    if verify_pages() {
        "pages verified (PageCheck::Verify)"
    } else {
        "pages trusted (PageCheck::Trust, idemdb's own checks)"
    }
}

fn verify_pages() -> bool {
    std::env::var("IDEMDB_RESTART_PAGE_CHECK").as_deref() == Ok("verify")
}

fn file_bytes(path: &Path) -> u64 {
    let journal = format!("{}-journal", path.display());
    [path, Path::new(&journal)]
        .iter()
        .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
        .sum()
}

/// Opens (after dropping the page cache if `cold`), checks, and prints one row.
fn report(state: &str, cold: bool, path: &Path, n: u64, round: u64, acked: &HashMap<String, bool>) {
    if cold {
        drop_caches();
    }
    let out = run("check", path, n, round);
    let first_line = out.lines().next().unwrap_or_default();
    let fields: Vec<&str> = first_line.split_whitespace().collect();
    let [open, first, checked, wrong] = fields[..] else {
        panic!("a check child printed {first_line:?}")
    };
    let seconds = |x: &str| -> f64 { x.parse().expect("seconds") };
    let count = |x: &str| -> u64 { x.parse().expect("a count") };
    let (open, first, checked, wrong) =
        (seconds(open), seconds(first), count(checked), count(wrong));
    let acked_wrong = check_acked(&out, acked);
    println!(
        "| {state} | {} | {:.3} s | {:.3} s | {} | {} |",
        if cold { "dropped" } else { "warm" },
        open,
        first,
        checked + acked.len() as u64,
        wrong + acked_wrong
    );
}

/// Lines after the first in a check child's output: `<key> <c|d|->`, what the store answered
/// for each load key it was asked about (`d` replayed, `c` in progress, `-` absent).
fn check_acked(out: &str, acked: &HashMap<String, bool>) -> u64 {
    let found: HashMap<&str, &str> = out
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(' '))
        .collect();
    acked
        .iter()
        .filter(|(key, &completed)| {
            let got = found.get(key.as_str()).copied();
            !matches!(
                (completed, got),
                (true, Some("d")) | (false, Some("c" | "d"))
            )
        })
        .count() as u64
}

fn drop_caches() {
    let _ = Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3").expect("drop the page cache");
}

/// Runs a load child, SIGKILLs it after `LOAD_SECONDS`, and returns the keys it acknowledged
/// (true: completed).
fn kill_under_load(path: &Path, round: u64) -> HashMap<String, bool> {
    let mut child = Command::new(std::env::current_exe().expect("current exe"))
        .env(CHILD_ENV, format!("load:0:{round}:{}", path.display()))
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the load child");
    let stdout = child.stdout.take().expect("piped");
    let (ready_tx, ready) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut acked = HashMap::new();
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            match line.split_once(' ') {
                Some(("c", key)) => {
                    acked.insert(key.to_owned(), false);
                }
                Some(("d", key)) => {
                    acked.insert(key.to_owned(), true);
                }
                _ if line == "ready" => {
                    let _ = ready_tx.send(());
                }
                _ => {}
            }
        }
        acked
    });
    // The load runs from its open on (a verifying open takes seconds of its own).
    ready.recv().expect("the load child opened the store");
    std::thread::sleep(Duration::from_secs(LOAD_SECONDS));
    child.kill().expect("SIGKILL the load child");
    child.wait().expect("reap the child");
    let acked = reader.join().expect("reader");
    assert!(!acked.is_empty(), "the load child acknowledged nothing");
    acked
}

/// Runs this binary as a child; returns its standard output.
fn run(what: &str, path: &Path, n: u64, round: u64) -> String {
    let out = Command::new(std::env::current_exe().expect("current exe"))
        .env(CHILD_ENV, format!("{what}:{n}:{round}:{}", path.display()))
        .stderr(Stdio::inherit())
        .output()
        .expect("run the child");
    assert!(out.status.success(), "child {what} failed");
    String::from_utf8(out.stdout).expect("utf-8")
}

fn scope(i: u64) -> Scope {
    Scope::new(format!("tenant_{:02}", i % 4), "POST /v1/payments")
}

fn key(i: u64) -> String {
    format!(
        "{:016x}-{}",
        SplitMix64::derive(0x7e57a27, i, 0).next_u64(),
        i
    )
}

fn fingerprint(i: u64) -> Fingerprint {
    Fingerprint::of(format!("amount={}", i % 10_000).as_bytes())
}

fn body(i: u64) -> Vec<u8> {
    let mut b = SplitMix64::new(0xb0d7).ascii(RESPONSE_LEN).into_bytes();
    b[..8].copy_from_slice(&i.to_le_bytes());
    b
}

fn open(path: &Path) -> Store {
    // Leases outlast the run: the check child reaches the load's orphaned claims minutes after
    // the kill at 10M records, and a claim whose lease ran out is taken over, not in progress.
    let builder = Store::builder().lease(Duration::from_secs(3600));
    let builder = if verify_pages() {
        builder.page_check(PageCheck::Verify)
    } else {
        builder.page_check(PageCheck::Trust)
    };
    builder.open(path).expect("open")
}

fn child(spec: &str) {
    let mut parts = spec.splitn(4, ':');
    let what = parts.next().expect("what");
    let n: u64 = parts.next().and_then(|s| s.parse().ok()).expect("n");
    let round: u64 = parts.next().and_then(|s| s.parse().ok()).expect("round");
    let path = Path::new(parts.next().expect("path"));
    match what {
        "make" => make(path, n),
        "load" => load(path, round),
        "check" => check(path, n, round),
        _ => panic!("unknown child mode {what}"),
    }
}

fn make(path: &Path, n: u64) {
    let store = open(path);
    common::claim_and_complete(&store, 0..n, IN_FLIGHT, |i| {
        (scope(i), key(i), fingerprint(i), body(i))
    });
}

/// Claim + complete cycles of new keys from `LOAD_THREADS` threads until killed.
fn load(path: &Path, round: u64) {
    use std::io::Write;
    let store = open(path);
    writeln!(std::io::stdout().lock(), "ready").expect("stdout");
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..LOAD_THREADS {
            let (store, stop) = (&store, &stop);
            s.spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("load-{round}-{t}-{i}");
                    let id = u64::MAX - i;
                    let Ok(Claim::Acquired(ticket)) =
                        store.claim(&scope(id), &key, fingerprint(id))
                    else {
                        panic!("a new load key is acquired")
                    };
                    writeln!(std::io::stdout().lock(), "c {key}").expect("stdout");
                    if i % 4 != 3 {
                        store
                            .complete(ticket, Response::new(201, body(id)))
                            .expect("complete");
                        writeln!(std::io::stdout().lock(), "d {key}").expect("stdout");
                    } else {
                        std::mem::forget(ticket); // left in progress, as a crash leaves it
                    }
                    i += 1;
                }
            });
        }
        std::thread::sleep(Duration::from_secs(3600));
        stop.store(true, Ordering::Relaxed);
    });
}

/// Times the open and the first claim, then checks every preloaded key and every load key of
/// `round` (none for 0).
fn check(path: &Path, n: u64, round: u64) {
    let started = Instant::now();
    let store = open(path);
    let opened = started.elapsed().as_secs_f64();
    let first = store
        .claim(&scope(0), &key(0), fingerprint(0))
        .expect("the first claim");
    let first_answered = started.elapsed().as_secs_f64();
    let mut wrong = u64::from(!matches!(&first, Claim::Replay(r) if r.body() == body(0)));
    for i in 0..n {
        match store.claim(&scope(i), &key(i), fingerprint(i)) {
            Ok(Claim::Replay(r)) if r.body() == body(i) => {}
            _ => wrong += 1,
        }
    }
    println!("{opened} {first_answered} {n} {wrong}");
    if round == 0 {
        return;
    }
    // Every load key of the round, by what it answers now; each thread's keys in order, up to
    // the first absent one (a thread claims its next key only after the last was acknowledged).
    {
        for t in 0..LOAD_THREADS {
            for i in 0.. {
                let key = format!("load-{round}-{t}-{i}");
                let id = u64::MAX - i;
                let got = match store.claim(&scope(id), &key, fingerprint(id)) {
                    Ok(Claim::Replay(r)) if r.body() == body(id) => "d",
                    Ok(Claim::InProgress { .. }) => "c",
                    Ok(Claim::Acquired(ticket)) if ticket.takeover().is_some() => {
                        std::mem::forget(ticket);
                        "c" // an orphan whose lease ran out: there, in progress
                    }
                    Ok(Claim::Acquired(ticket)) => {
                        // Absent: give the key back, and stop this thread's sequence.
                        store.release(ticket).expect("release");
                        break;
                    }
                    _ => "wrong",
                };
                println!("{key} {got}");
            }
        }
    }
}
