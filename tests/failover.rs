//! Failover to a synchronous standby, under load: worker processes claim and complete shared
//! keys on a primary whose synchronous standby has every commit; the primary is killed with
//! SIGKILL, the standby promoted, and the workers' stores find it through the multi-host URL
//! (`target_session_attrs=read-write`). Two ways: promoted by hand (`pg_ctl promote`), and by
//! Patroni once the killed node's leader key expires in etcd.
//!
//! Checked: every claim and completion a worker was told of is on the promoted server; no key
//! executed twice except through a ticket that says `takeover`; during the gap every error is
//! `Error::Database`. The gap (from the kill to each worker's first success after it) is
//! printed.
//!
//! Needs both servers: `scripts/with-postgres --standby cargo test --release --features postgres
//! --test failover -- --ignored --exact a_failover_to_a_synchronous_standby_loses_nothing_acknowledged`,
//! and for Patroni `scripts/with-postgres --patroni cargo test --release --features postgres
//! --test failover -- --ignored --exact a_patroni_failover_loses_nothing_acknowledged`.

#![cfg(feature = "postgres")]

use idemdb::{Claim, Error, Fingerprint, Response, Scope, Store};
use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const WORKERS: usize = 4;
const LEASE: Duration = Duration::from_secs(3);
const KILL_AFTER: Duration = Duration::from_secs(4);

fn scope() -> Scope {
    Scope::new("tenant", "POST /v1/transfers")
}

fn fp() -> Fingerprint {
    Fingerprint::of(b"the transfer")
}

fn wall_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

fn log(path: &Path, line: &str) {
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .unwrap();
    f.write_all(format!("{line}\n").as_bytes()).unwrap();
}

/// One worker (a child process): claims random shared keys and completes them, until `RUN`
/// has passed. It logs what it was told: `exec key fence takeover`, `done key fence`, `ok ms`
/// (a completion acknowledged: a write the database committed), `error ms`. Run alone
/// (`cargo test -- --ignored` runs every ignored test), without the variables its parent sets,
/// it says so and passes.
#[test]
#[ignore = "a child process of a_failover_to_a_synchronous_standby_loses_nothing_acknowledged"]
fn failover_worker() {
    let Ok(id) = std::env::var("IDEMDB_FAILOVER_WORKER") else {
        eprintln!(
            "failover_worker is a child process of \
             a_failover_to_a_synchronous_standby_loses_nothing_acknowledged, run by it \
             (IDEMDB_FAILOVER_WORKER is not set): nothing to do alone"
        );
        return;
    };
    let id: u64 = id.parse().unwrap();
    let log_path = PathBuf::from(std::env::var("IDEMDB_FAILOVER_LOG").unwrap());
    let run = Duration::from_millis(
        std::env::var("IDEMDB_FAILOVER_RUN_MS")
            .unwrap()
            .parse()
            .unwrap(),
    );
    let store = Store::builder()
        .schema(std::env::var("IDEMDB_FAILOVER_SCHEMA").unwrap())
        .owner(format!("worker-{id}"))
        .lease(LEASE)
        .retry_after(Duration::from_millis(10))
        .connect(&std::env::var("IDEMDB_PG_URL").unwrap())
        .unwrap();
    let mut rng = idemdb::simulation::SplitMix64::derive(0xfa11, 0, id);
    let started = Instant::now();
    while started.elapsed() < run {
        // New keys all the time (replays come from the workers' caches), shared by the
        // workers: eight new ones every 50 ms.
        let window = started.elapsed().as_millis() / 50;
        let key = format!("key-{window}-{}", rng.index(8));
        match store.claim(&scope(), &key, fp()) {
            Ok(Claim::Acquired(ticket)) => {
                let fence = ticket.fence();
                log(
                    &log_path,
                    &format!("exec {key} {fence} {}", ticket.takeover().is_some()),
                );
                match store.complete(ticket, Response::new(201, fence.to_string())) {
                    Ok(()) => {
                        log(&log_path, &format!("done {key} {fence}"));
                        log(&log_path, &format!("ok {}", wall_ms()));
                    }
                    Err(Error::Database { .. }) => log(&log_path, &format!("error {}", wall_ms())),
                    Err(other) => panic!("a complete failed with an untyped error: {other:?}"),
                }
            }
            // Replays (many from the store's cache) and duplicates in progress: no news.
            Ok(_) => {}
            Err(Error::Database { .. }) => {
                log(&log_path, &format!("error {}", wall_ms()));
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(other) => panic!("a claim failed with an untyped error: {other:?}"),
        }
    }
}

#[test]
#[ignore = "needs a primary and a synchronous standby: scripts/with-postgres --standby"]
fn a_failover_to_a_synchronous_standby_loses_nothing_acknowledged() {
    std::env::var("IDEMDB_PG_URL").expect(
        "this test needs a primary and a synchronous standby: run it as \
         `scripts/with-postgres --standby cargo test --release --features postgres --test failover \
         -- --ignored --exact a_failover_to_a_synchronous_standby_loses_nothing_acknowledged`",
    );
    let primary: u32 = std::env::var("IDEMDB_PG_PRIMARY_PID")
        .expect("run under scripts/with-postgres --standby")
        .parse()
        .unwrap();
    let standby_dir = std::env::var("IDEMDB_PG_STANDBY_DIR").unwrap();
    let bin = PathBuf::from(std::env::var("IDEMDB_PG_BIN").unwrap());
    under_load("standby promoted by hand", Duration::from_secs(14), || {
        let killed_at = wall_ms();
        kill(primary);
        let promote = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(bin.join("pg_ctl"))
            .args(["promote", "-w", "-D", &standby_dir])
            .output()
            .unwrap();
        assert!(promote.status.success(), "{promote:?}");
        killed_at
    });
}

/// The same under Patroni: the primary's node (its Patroni and its postmaster) is killed with
/// SIGKILL, and nothing is done by hand: Patroni on the other node promotes it once the leader
/// key expires (ttl 20 s).
#[test]
#[ignore = "needs two servers managed by Patroni: scripts/with-postgres --patroni"]
fn a_patroni_failover_loses_nothing_acknowledged() {
    let list = |name: &str| -> Vec<String> {
        std::env::var(name)
            .unwrap_or_else(|_| {
                panic!(
                    "{name} is not set: run as `scripts/with-postgres --patroni cargo test --release \
                     --features postgres --test failover -- --ignored --exact \
                     a_patroni_failover_loses_nothing_acknowledged`"
                )
            })
            .split(',')
            .map(str::to_owned)
            .collect()
    };
    let (ports, pids, data) = (
        list("IDEMDB_PATRONI_PORTS"),
        list("IDEMDB_PATRONI_PIDS"),
        list("IDEMDB_PATRONI_DATA"),
    );
    let bin = PathBuf::from(std::env::var("IDEMDB_PG_BIN").unwrap());
    let is_primary = |port: &str| {
        let out = Command::new(bin.join("psql"))
            .args([
                "-qtAX",
                "-h",
                "127.0.0.1",
                "-p",
                port,
                "-U",
                "postgres",
                "-d",
                "postgres",
            ])
            .args(["-c", "SELECT NOT pg_is_in_recovery()"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim() == "t"
    };
    under_load("Patroni", Duration::from_secs(45), || {
        let leader = (0..ports.len())
            .find(|&i| is_primary(&ports[i]))
            .expect("one node is the primary");
        let postmaster: u32 =
            std::fs::read_to_string(PathBuf::from(&data[leader]).join("postmaster.pid"))
                .unwrap()
                .lines()
                .next()
                .unwrap()
                .parse()
                .unwrap();
        // The node dies whole: its Patroni first, so that nothing restarts its PostgreSQL.
        kill(pids[leader].parse().unwrap());
        let killed_at = wall_ms();
        kill(postmaster);
        let other = &ports[1 - leader];
        let until = Instant::now() + Duration::from_secs(60);
        while !is_primary(other) {
            assert!(
                Instant::now() < until,
                "Patroni did not promote the standby in 60 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        killed_at
    });
}

fn kill(pid: u32) {
    assert!(Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap()
        .success());
}

/// Runs the workers for `run`, calls `fail_over` (which kills the primary, returns once the
/// standby is promoted, and says when it killed, in ms since the epoch) `KILL_AFTER` into it,
/// and checks what the workers were told against the promoted server.
fn under_load(how: &str, run: Duration, fail_over: impl FnOnce() -> u128) {
    let url = std::env::var("IDEMDB_PG_URL").unwrap();
    let schema = format!("failover_{}", std::process::id());
    drop(
        Store::builder()
            .schema(schema.clone())
            .connect(&url)
            .unwrap(),
    );
    let dir = tempfile::tempdir().unwrap();
    let logs: Vec<PathBuf> = (0..WORKERS)
        .map(|i| dir.path().join(format!("worker-{i}")))
        .collect();
    let workers: Vec<_> = (0..WORKERS)
        .map(|i| {
            Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "failover_worker",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("IDEMDB_FAILOVER_WORKER", i.to_string())
                .env("IDEMDB_FAILOVER_LOG", &logs[i])
                .env("IDEMDB_FAILOVER_SCHEMA", &schema)
                .env("IDEMDB_FAILOVER_RUN_MS", run.as_millis().to_string())
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    std::thread::sleep(KILL_AFTER);
    let killed_at = fail_over();
    let promoted_at = wall_ms();
    for mut w in workers {
        assert!(
            w.wait().unwrap().success(),
            "a worker failed (an untyped error?)"
        );
    }

    // What the workers were told.
    let mut executions: HashMap<String, Vec<(u64, bool)>> = HashMap::new();
    let mut completed: HashMap<String, u64> = HashMap::new();
    let mut gaps = Vec::new();
    let (mut errors, mut writes) = (0, 0);
    for path in &logs {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        // The gap: from the kill to the first success after the worker's first error since it
        // (a commit acknowledged just after the kill was made before it).
        let mut failed_since_kill = false;
        let mut first_ok_after_kill = None;
        for line in text.lines() {
            let parts: Vec<&str> = line.split(' ').collect();
            match parts.as_slice() {
                ["exec", key, fence, takeover] => executions
                    .entry((*key).to_owned())
                    .or_default()
                    .push((fence.parse().unwrap(), *takeover == "true")),
                ["done", key, fence] => {
                    let previous = completed.insert((*key).to_owned(), fence.parse().unwrap());
                    assert!(previous.is_none(), "{key} completed twice");
                }
                ["ok", ms] => {
                    writes += 1;
                    let ms: u128 = ms.parse().unwrap();
                    if failed_since_kill && first_ok_after_kill.is_none() {
                        first_ok_after_kill = Some(ms);
                    }
                }
                ["error", ms] => {
                    errors += 1;
                    failed_since_kill |= ms.parse::<u128>().unwrap() >= killed_at;
                }
                other => panic!("a bad log line: {other:?}"),
            }
        }
        gaps.push(
            first_ok_after_kill.expect("every worker served again after the failover") - killed_at,
        );
    }

    // Nothing acknowledged is lost: read back from the promoted server.
    let after = Store::builder().schema(schema).connect(&url).unwrap();
    for (key, fence) in &completed {
        match after.claim(&scope(), key, fp()).unwrap() {
            Claim::Replay(r) => assert_eq!(r.body(), fence.to_string().as_bytes(), "{key}"),
            other => panic!("{key}: its acknowledged completion is gone: {other:?}"),
        }
    }
    let mut takeovers = 0;
    for (key, execs) in &mut executions {
        execs.sort_unstable();
        let entry = after.get(&scope(), key).unwrap();
        let entry = entry.unwrap_or_else(|| panic!("{key}: its acknowledged claim is gone"));
        assert!(
            entry.fence >= execs.last().unwrap().0,
            "{key}: an older fence holds it"
        );
        // A key runs again only through a ticket that says it took over.
        for (fence, takeover) in &execs[1..] {
            assert!(
                takeover,
                "{key}: executed again under fence {fence} without a takeover"
            );
            takeovers += 1;
        }
    }
    let worst = gaps.iter().max().unwrap();
    println!(
        "failover ({how}): {WORKERS} workers, {} keys executed, {} completions acknowledged \
         ({writes} logged), {errors} typed errors, {takeovers} takeovers; primary killed, standby \
         promoted {:.2} s later; from the kill to the first acknowledged completion after an error, per worker: {:?} s (worst \
         {:.2} s)",
        executions.len(),
        completed.len(),
        (promoted_at - killed_at) as f64 / 1000.0,
        gaps.iter().map(|g| *g as f64 / 1000.0).collect::<Vec<_>>(),
        *worst as f64 / 1000.0
    );
    assert!(errors > 0, "the failover was seen");
}
