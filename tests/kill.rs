//! kill -9 crash test: nothing acknowledged is ever lost to a process kill.
//!
//! The test binary has no harness (`harness = false` in `Cargo.toml`): its `main` is the
//! parent, and the same binary started with [`CHILD_ENV`] set is the child. The child opens the store and runs [`THREADS`] threads that claim fresh
//! keys forever, complete about two thirds of them with a response derived from the key and
//! leave the rest in progress, and print one line per acknowledged call (`CLAIMED tenant key
//! fence` after `claim` returned `Acquired`, `COMPLETED tenant key fence` after `complete`
//! returned `Ok`), written whole and flushed only after the call returned.
//!
//! The parent SIGKILLs the child at a random moment each round (some before the store is even
//! open, most mid-stream), reads every line the child finished writing, reopens the file and
//! checks every acknowledged operation of every round so far: each claimed key is present with
//! its fence (an orphan in progress, or completed if its completion landed unacknowledged),
//! each completed key replays byte for byte, fences only grow across restarts, and the store
//! holds exactly the acknowledged keys plus at most one in-flight key per child thread. In a
//! few rounds it also opens the file while the child holds it, which must fail with
//! `Error::AlreadyOpen`.
//!
//! `IDEMDB_KILL_ROUNDS` sets the number of rounds (default 12); `IDEMDB_KILL_SEED` the base seed
//! of the kill schedule (default [`BASE_SEED`]), to reproduce a run; `IDEMDB_KILL_KEEP=<dir>`
//! keeps a copy of the file as each kill left it (before the parent's reopen repairs it). The
//! summary line goes to stderr, so every run prints it.

mod one_test;

use idemdb::simulation::{mix, SplitMix64};
use idemdb::{Claim, EntryState, Error, Fingerprint, Response, Scope, Store};
use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// Set (to the store path) only in the child process.
const CHILD_ENV: &str = "IDEMDB_KILL_CHILD";
const ROUND_ENV: &str = "IDEMDB_KILL_ROUND";
const ROUND_SEED_ENV: &str = "IDEMDB_KILL_ROUND_SEED";
const TENANTS: [&str; 3] = ["acme", "globex", "initech"];
const ENDPOINT: &str = "POST /v1/payments";
/// Worker threads in the child.
const THREADS: usize = 8;
const DEFAULT_ROUNDS: u64 = 12;
const BASE_SEED: u64 = 0x1de4_db9c_0ffe_e5ed;
/// The child's lease: long enough that no orphan goes stale while the test runs, so the
/// parent's claims on orphans answer `InProgress` and never take a key over.
const CHILD_LEASE: Duration = Duration::from_secs(24 * 3600);
const FIRST_ACK_TIMEOUT: Duration = Duration::from_secs(30);
const SIGKILL: i32 = 9;

// ---------------------------------------------------------------------------------------------
// Everything both processes derive from a key.

/// FNV-1a over the parts (each followed by a separator byte), then mixed.
fn hash(parts: &[&[u8]]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for part in parts {
        for &b in part.iter().chain(&[0xff]) {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    mix(h)
}

fn round_seed(base: u64, round: u64) -> u64 {
    mix(base ^ mix(round.wrapping_add(1)))
}

fn key_name(round: u64, thread: usize, i: usize) -> String {
    format!("r{round}-t{thread}-{i}")
}

/// `r{round}-t{thread}-{i}` back into its parts.
fn parse_key(key: &str) -> Option<(u64, usize, usize)> {
    let mut parts = key.strip_prefix('r')?.split('-');
    let round = parts.next()?.parse().ok()?;
    let thread = parts.next()?.strip_prefix('t')?.parse().ok()?;
    let i = parts.next()?.parse().ok()?;
    parts.next().is_none().then_some((round, thread, i))
}

fn tenant_of(thread: usize, i: usize) -> &'static str {
    TENANTS[(thread + i) % TENANTS.len()]
}

fn request_fingerprint(tenant: &str, key: &str) -> Fingerprint {
    Fingerprint::builder()
        .part(ENDPOINT.as_bytes())
        .part(tenant.as_bytes())
        .part(key.as_bytes())
        .finish()
}

/// A request with the same key and a different body: must be a mismatch.
fn other_fingerprint(tenant: &str, key: &str) -> Fingerprint {
    Fingerprint::builder()
        .part(b"a different request")
        .part(tenant.as_bytes())
        .part(key.as_bytes())
        .finish()
}

/// The response the child stores for a key: a status, three headers (one name repeated, as
/// `set-cookie` is in HTTP) and a body of 0..=3000 arbitrary bytes, all derived from the key.
fn expected_response(tenant: &str, key: &str) -> Response {
    let h = hash(&[tenant.as_bytes(), key.as_bytes()]);
    let mut rng = SplitMix64::new(h);
    let status = [200, 201, 202, 402, 409, 422][usize::try_from(h % 6).unwrap()];
    let len = if rng.below(10) == 0 {
        0
    } else {
        usize::try_from(rng.below(3001)).unwrap()
    };
    let mut body = Vec::with_capacity(len + 8);
    while body.len() < len {
        body.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    body.truncate(len);
    Response::new(status, body)
        .with_header(
            "set-cookie",
            format!("session={:016x}; HttpOnly", rng.next_u64()),
        )
        .with_header("idempotency-key", key)
        .with_header("set-cookie", format!("tenant={tenant}; Path=/"))
}

/// Whether the child completes a key (about two thirds) or leaves it in progress.
fn intends_to_complete(round_seed: u64, key: &str) -> bool {
    !hash(&[&round_seed.to_le_bytes(), key.as_bytes()]).is_multiple_of(3)
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.parse().ok()
}

// ---------------------------------------------------------------------------------------------
// The child.

/// The test's name, for `cargo test` filters and `--list`.
const TEST_NAME: &str = "kill_9_never_loses_an_acknowledged_operation";

/// The child when [`CHILD_ENV`] is set; else the parent, which is the test.
fn main() {
    if let Some(path) = std::env::var_os(CHILD_ENV) {
        child_main(Path::new(&path));
    }
    one_test::run(TEST_NAME, kill_9_never_loses_an_acknowledged_operation);
}

/// Writes `line` whole to stdout and flushes it: one `write` of a short line into the pipe, so
/// the parent sees it whole or not at all, never interleaved with another thread's.
fn emit(line: &str) {
    let mut out = std::io::stdout().lock();
    if out
        .write_all(line.as_bytes())
        .and_then(|()| out.flush())
        .is_err()
    {
        // The parent is gone: there is nobody left to acknowledge to.
        std::process::exit(71);
    }
}

fn fatal(msg: &str) -> ! {
    emit(&format!("FATAL {}\n", msg.replace('\n', " | ")));
    std::process::exit(70);
}

fn child_main(path: &Path) -> ! {
    std::panic::set_hook(Box::new(|info| fatal(&format!("panic: {info}"))));
    let round = env_u64(ROUND_ENV).unwrap_or_else(|| fatal("no round number"));
    let seed = env_u64(ROUND_SEED_ENV).unwrap_or_else(|| fatal("no round seed"));
    emit("STARTED\n");
    let store = Store::builder()
        .lease(CHILD_LEASE)
        .open(path)
        .unwrap_or_else(|e| fatal(&format!("open {}: {e:?}", path.display())));
    emit("OPENED\n");
    for thread in 0..THREADS {
        let store = store.clone();
        std::thread::spawn(move || worker(&store, round, seed, thread));
    }
    loop {
        std::thread::park();
    }
}

fn worker(store: &Store, round: u64, seed: u64, thread: usize) -> ! {
    let mut i = 0;
    loop {
        let tenant = tenant_of(thread, i);
        let key = key_name(round, thread, i);
        let scope = Scope::new(tenant, ENDPOINT);
        let ticket = match store.claim(&scope, &key, request_fingerprint(tenant, &key)) {
            Ok(Claim::Acquired(ticket)) => ticket,
            Ok(other) => fatal(&format!(
                "claim {tenant} {key}: a fresh key answered {other:?}"
            )),
            Err(e) => fatal(&format!("claim {tenant} {key}: {e:?}")),
        };
        let fence = ticket.fence();
        emit(&format!("CLAIMED {tenant} {key} {fence}\n"));
        if intends_to_complete(seed, &key) {
            if let Err(e) = store.complete(ticket, expected_response(tenant, &key)) {
                fatal(&format!("complete {tenant} {key} fence {fence}: {e:?}"));
            }
            emit(&format!("COMPLETED {tenant} {key} {fence}\n"));
        } else {
            // As if the handler were still running when the process died.
            drop(ticket);
        }
        i += 1;
    }
}

// ---------------------------------------------------------------------------------------------
// The parent.

/// An acknowledged key.
#[derive(Debug)]
struct Acked {
    tenant: String,
    round: u64,
    fence: u64,
    /// `COMPLETED` was acknowledged too.
    completed: bool,
}

/// Everything the children acknowledged, over all rounds.
#[derive(Default)]
struct Model {
    acked: BTreeMap<String, Acked>,
    /// fence -> key, to catch a fence handed out twice.
    fences: HashMap<u64, String>,
    /// (round, thread) -> acknowledged claims (keys 0..n of that thread).
    progress: BTreeMap<(u64, usize), usize>,
    seeds: Vec<u64>,
    completions: usize,
    /// Unacknowledged in-flight keys that were found in the store, with their fence: once seen
    /// after a reopen they are committed and must stay.
    landed: BTreeMap<String, u64>,
    /// The highest fence of any record before this round: every fence issued after a restart
    /// must be above it.
    max_fence_before: u64,
}

/// Kills the child if the parent panics while it runs, so no child outlives the test.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Sends every complete line of `out` until EOF; returns the partial last line, if the kill
/// cut one short (it is no acknowledgement).
fn read_lines(out: impl Read, tx: mpsc::Sender<String>) -> Option<String> {
    let mut reader = BufReader::new(out);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf) {
            Ok(0) => return None,
            Ok(_) if buf.ends_with(b"\n") => {
                let line = String::from_utf8_lossy(&buf[..buf.len() - 1]).into_owned();
                if tx.send(line).is_err() {
                    return None;
                }
            }
            Ok(_) => return Some(String::from_utf8_lossy(&buf).into_owned()),
            Err(e) => panic!("reading the child's stdout: {e}"),
        }
    }
}

fn is_ack(line: &str) -> bool {
    line.starts_with("CLAIMED ") || line.starts_with("COMPLETED ")
}

/// How one round kills its child.
#[derive(Debug)]
struct Plan {
    /// Kill `delay` after the spawn, without waiting for anything: usually before the store is
    /// open or before the first acknowledgement.
    early: bool,
    /// After the first acknowledgement, open the file a second time (must be `AlreadyOpen`).
    probe: bool,
    delay: Duration,
}

fn plan(round: u64, rng: &mut SplitMix64) -> Plan {
    let early = round.is_multiple_of(4);
    let delay_ms = if early {
        rng.below(12)
    } else {
        5 + rng.below(276)
    };
    Plan {
        early,
        probe: !early && round % 3 == 1,
        delay: Duration::from_millis(delay_ms),
    }
}

/// What one round saw.
struct RoundLog {
    lines: Vec<String>,
    /// A last line cut short by the kill.
    partial: Option<String>,
    /// Lines received when the probe ran.
    probed_at: Option<usize>,
}

/// Waits for the child's first acknowledgement.
fn wait_for_ack(rx: &Receiver<String>, lines: &mut Vec<String>, round: u64) {
    let deadline = Instant::now() + FIRST_ACK_TIMEOUT;
    loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => {
                assert!(!line.starts_with("FATAL"), "round {round}: child: {line}");
                let ack = is_ack(&line);
                lines.push(line);
                if ack {
                    return;
                }
            }
            Err(RecvTimeoutError::Timeout) => panic!(
                "round {round}: no acknowledgement within {FIRST_ACK_TIMEOUT:?}; child said \
                 {lines:?}"
            ),
            Err(RecvTimeoutError::Disconnected) => panic!(
                "round {round}: the child closed stdout before acknowledging anything; it said \
                 {lines:?}"
            ),
        }
    }
}

/// Runs one child and kills it as `plan` says.
fn run_round(exe: &Path, path: &Path, round: u64, seed: u64, plan: &Plan) -> RoundLog {
    let child = Command::new(exe)
        .env(CHILD_ENV, path)
        .env(ROUND_ENV, round.to_string())
        .env(ROUND_SEED_ENV, seed.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the child");
    let mut child = KillOnDrop(child);
    let out = child.0.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || read_lines(out, tx));
    let mut lines = Vec::new();
    let mut probed_at = None;
    if plan.early {
        std::thread::sleep(plan.delay);
    } else {
        wait_for_ack(&rx, &mut lines, round);
        if plan.probe {
            match Store::open(path) {
                Err(Error::AlreadyOpen) => {}
                Ok(_) => panic!(
                    "round {round}: a second Store::open succeeded while the child holds the file"
                ),
                Err(e) => panic!(
                    "round {round}: a second Store::open while the child holds the file should \
                     fail with AlreadyOpen, got {e:?}"
                ),
            }
            lines.extend(rx.try_iter());
            probed_at = Some(lines.len());
        }
        std::thread::sleep(plan.delay);
    }
    let exited_early = child.0.try_wait().expect("try_wait");
    if exited_early.is_none() {
        // SIGKILL on Unix.
        child.0.kill().expect("kill the child");
    }
    let status = child.0.wait().expect("wait for the child");
    // The child is dead; its stdout ends once the reader has drained the pipe.
    lines.extend(rx.iter());
    let partial = reader.join().expect("the reader thread panicked");
    if let Some(fatal) = lines.iter().find(|l| l.starts_with("FATAL")) {
        panic!("round {round}: child: {fatal}");
    }
    assert!(
        exited_early.is_none() && status.signal() == Some(SIGKILL),
        "round {round}: the child was to die of SIGKILL, it ended with {status} (exited before \
         the kill: {}); last lines {:?}",
        exited_early.is_some(),
        &lines[lines.len().saturating_sub(5)..]
    );
    RoundLog {
        lines,
        partial,
        probed_at,
    }
}

/// Adds a round's acknowledgements to the model, checking the lines themselves: each thread's
/// claims are consecutive, a completion follows its claim with the same fence, no fence is
/// reused, and every fence is above every fence of the store before this child started.
fn record_acks(model: &mut Model, round: u64, lines: &[String]) {
    for line in lines {
        let (kind, rest) = match line.split_once(' ') {
            Some((kind @ ("CLAIMED" | "COMPLETED"), rest)) => (kind, rest),
            _ => continue,
        };
        let fields: Vec<&str> = rest.split(' ').collect();
        let [tenant, key, fence] = fields[..] else {
            panic!("round {round}: malformed line {line:?}");
        };
        let fence: u64 = fence
            .parse()
            .unwrap_or_else(|_| panic!("round {round}: malformed line {line:?}"));
        let (r, thread, i) =
            parse_key(key).unwrap_or_else(|| panic!("round {round}: malformed key in {line:?}"));
        assert_eq!(
            r, round,
            "round {round}: a key of another round in {line:?}"
        );
        assert_eq!(tenant, tenant_of(thread, i), "round {round}: {line:?}");
        if kind == "CLAIMED" {
            let next = model.progress.entry((round, thread)).or_insert(0);
            assert_eq!(
                *next, i,
                "round {round}: thread {thread} acknowledged claim {i} after {next} claims"
            );
            *next += 1;
            assert!(
                fence > model.max_fence_before,
                "round {round}: {line:?}: fence {fence} is not above the highest fence already \
                 in the store ({}): fences must grow across restarts",
                model.max_fence_before
            );
            if let Some(other) = model.fences.insert(fence, key.to_owned()) {
                panic!("round {round}: fence {fence} acknowledged for {other} and for {key}");
            }
            let previous = model.acked.insert(
                key.to_owned(),
                Acked {
                    tenant: tenant.to_owned(),
                    round,
                    fence,
                    completed: false,
                },
            );
            assert!(
                previous.is_none(),
                "round {round}: {key} acknowledged twice"
            );
        } else {
            let acked = model
                .acked
                .get_mut(key)
                .unwrap_or_else(|| panic!("round {round}: {line:?} without its CLAIMED line"));
            assert_eq!(
                acked.fence, fence,
                "round {round}: {line:?}: claimed fence differs"
            );
            assert!(!acked.completed, "round {round}: {line:?} twice");
            assert!(
                intends_to_complete(model.seeds[usize::try_from(round).unwrap()], key),
                "round {round}: {line:?}: this key was to be left in progress"
            );
            acked.completed = true;
            model.completions += 1;
        }
    }
}

/// Describes how two responses differ.
fn diff(got: &Response, want: &Response) -> String {
    let first = got.body().iter().zip(want.body()).position(|(a, b)| a != b);
    format!(
        "status {} (want {}), headers {:?} (want {:?}), body {} bytes (want {}), first differing \
         body byte at {first:?}",
        got.status(),
        want.status(),
        got.headers(),
        want.headers(),
        got.body().len(),
        want.body().len()
    )
}

/// Checks one record against what is known of it: `ack` for an acknowledged key, `None` for an
/// in-flight key that may or may not have landed. Returns the stored fence, if any.
fn check_key(
    store: &Store,
    model: &Model,
    key: &str,
    tenant: &str,
    ack: Option<&Acked>,
    failures: &mut Vec<String>,
) -> Option<u64> {
    let (round, _, _) = parse_key(key).expect("a generated key");
    let seed = model.seeds[usize::try_from(round).unwrap()];
    let ctx = match ack {
        Some(a) if a.completed => {
            format!("acknowledged COMPLETED {tenant} {key} fence {}", a.fence)
        }
        Some(a) => format!("acknowledged CLAIMED {tenant} {key} fence {}", a.fence),
        None => format!("unacknowledged in-flight {tenant} {key}"),
    };
    let scope = Scope::new(tenant, ENDPOINT);
    let fp = request_fingerprint(tenant, key);
    let entry = match store.get(&scope, key) {
        Ok(Some(entry)) => entry,
        Ok(None) => {
            if ack.is_some() {
                failures.push(format!("LOST: {ctx}: the key is absent"));
            } else if let Some(fence) = model.landed.get(key) {
                failures.push(format!(
                    "LOST: {ctx}: found committed with fence {fence} after an earlier kill, now \
                     absent"
                ));
            }
            return None;
        }
        Err(e) => {
            failures.push(format!("{ctx}: get failed: {e:?}"));
            return None;
        }
    };
    let want_fence = ack
        .map(|a| a.fence)
        .or_else(|| model.landed.get(key).copied());
    if want_fence.is_some_and(|f| f != entry.fence) {
        failures.push(format!("{ctx}: the store holds fence {}", entry.fence));
    }
    if entry.fingerprint != fp {
        failures.push(format!("{ctx}: the stored fingerprint differs"));
    }
    let want = expected_response(tenant, key);
    let completed = match &entry.state {
        EntryState::InProgress { orphan, .. } => {
            if ack.is_some_and(|a| a.completed) {
                failures.push(format!(
                    "LOST: {ctx}: the acknowledged completion is gone, the key is in progress"
                ));
            }
            if !orphan {
                failures.push(format!("{ctx}: in progress but not an orphan after reopen"));
            }
            match store.claim(&scope, key, fp) {
                Ok(Claim::InProgress { .. }) => {}
                other => failures.push(format!(
                    "{ctx}: a retry of an orphan should be InProgress, got {other:?}"
                )),
            }
            false
        }
        EntryState::Completed { response, .. } => {
            if *response != want {
                failures.push(format!(
                    "{ctx}: get returns a different response: {}",
                    diff(response, &want)
                ));
            }
            if ack.is_none() {
                failures.push(format!(
                    "{ctx}: completed, but the child completes a key only after acknowledging \
                     its claim"
                ));
            } else if !intends_to_complete(seed, key) {
                failures.push(format!(
                    "{ctx}: completed, but the child never completed it"
                ));
            }
            match store.claim(&scope, key, fp) {
                Ok(Claim::Replay(r)) if r == want => {}
                Ok(Claim::Replay(r)) => failures.push(format!(
                    "{ctx}: the replay differs from the stored response: {}",
                    diff(&r, &want)
                )),
                other => failures.push(format!("{ctx}: a retry should replay, got {other:?}")),
            }
            true
        }
    };
    match store.claim(&scope, key, other_fingerprint(tenant, key)) {
        Ok(Claim::Mismatch { completed: c }) if c == completed => {}
        other => failures.push(format!(
            "{ctx}: a different request with this key should be Mismatch {{ completed: \
             {completed} }}, got {other:?}"
        )),
    }
    Some(entry.fence)
}

/// Cumulative counts for the summary.
#[derive(Default)]
struct Tally {
    kills: u64,
    before_open: u64,
    before_ack: u64,
    /// Acknowledgement lines cut short by the kill.
    partial_acks: u64,
    probes: u64,
    acks_after_probe: u64,
}

/// Reopens the store and checks everything acknowledged so far; panics with every failure.
fn verify(path: &Path, model: &mut Model, round: u64, lines: &[String]) {
    if let Some(keep) = std::env::var_os("IDEMDB_KILL_KEEP") {
        if path.exists() {
            std::fs::create_dir_all(&keep).unwrap();
            std::fs::copy(path, Path::new(&keep).join(format!("round{round}.idem"))).unwrap();
        }
    }
    let store = Store::open(path).unwrap_or_else(|e| {
        let when = if lines.iter().any(|l| l == "OPENED") {
            "after the child's Store::open returned"
        } else if round == 0 {
            "before the child's Store::open returned, while it may have been creating the file"
        } else {
            "before the child's Store::open returned"
        };
        panic!(
            "round {round}: reopening the store failed after a kill that landed {when} ({} \
             bytes left at {}): {e:?}",
            std::fs::metadata(path).map_or(0, |m| m.len()),
            path.display()
        )
    });
    let mut failures = Vec::new();
    let mut max_fence = model.max_fence_before;
    for (key, ack) in &model.acked {
        if let Some(f) = check_key(&store, model, key, &ack.tenant, Some(ack), &mut failures) {
            max_fence = max_fence.max(f);
        }
    }
    // Each child thread works on one key at a time, so besides its acknowledged keys 0..n the
    // store may hold its key n (claimed, the kill landing before the line), never n + 1.
    let mut landed = BTreeMap::new();
    for r in 0..=round {
        for thread in 0..THREADS {
            let n = model.progress.get(&(r, thread)).copied().unwrap_or(0);
            let key = key_name(r, thread, n);
            let tenant = tenant_of(thread, n);
            if let Some(fence) = check_key(&store, model, &key, tenant, None, &mut failures) {
                if r == round && fence <= model.max_fence_before {
                    failures.push(format!(
                        "in-flight {tenant} {key}: fence {fence} is not above the fences from \
                         before the restart ({})",
                        model.max_fence_before
                    ));
                }
                max_fence = max_fence.max(fence);
                landed.insert(key, fence);
            }
            let never = key_name(r, thread, n + 1);
            let tenant = tenant_of(thread, n + 1);
            match store.get(&Scope::new(tenant, ENDPOINT), &never) {
                Ok(None) => {}
                other => failures.push(format!(
                    "{tenant} {never} was never attempted, yet get returns {other:?}"
                )),
            }
        }
    }
    // Keys never used, and used keys under another scope, must be absent.
    let mut probes: Vec<(Scope, String)> = TENANTS
        .iter()
        .map(|t| (Scope::new(*t, ENDPOINT), format!("never-used-{round}")))
        .collect();
    for (key, ack) in model.acked.iter().filter(|(_, a)| a.round == round).take(5) {
        let other = TENANTS.iter().find(|t| **t != ack.tenant).unwrap();
        probes.push((Scope::new(*other, ENDPOINT), key.clone()));
        probes.push((Scope::new("umbrella", ENDPOINT), key.clone()));
        probes.push((
            Scope::new(ack.tenant.as_str(), "POST /v1/refunds"),
            key.clone(),
        ));
    }
    for (scope, key) in &probes {
        match store.get(scope, key) {
            Ok(None) => {}
            other => failures.push(format!(
                "{scope:?} {key} was never used, yet get returns {other:?}"
            )),
        }
    }
    let live = store.record_count().unwrap();
    let expected = u64::try_from(model.acked.len() + landed.len()).unwrap();
    if live != expected {
        failures.push(format!(
            "the store holds {live} records, expected {expected}: {} acknowledged and {} \
             in-flight keys found",
            model.acked.len(),
            landed.len()
        ));
    }
    drop(store);
    let acks: Vec<&str> = lines
        .iter()
        .map(String::as_str)
        .filter(|l| is_ack(l))
        .collect();
    assert!(
        failures.is_empty(),
        "after the kill of round {round}, {} check(s) failed (store {}):\n{}\nthe last \
         acknowledgements of round {round} ({} in all):\n{}",
        failures.len(),
        path.display(),
        failures
            .iter()
            .take(40)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n"),
        acks.len(),
        acks[acks.len().saturating_sub(16)..].join("\n")
    );
    model.landed = landed;
    model.max_fence_before = max_fence;
}

fn kill_9_never_loses_an_acknowledged_operation() {
    let rounds = env_u64("IDEMDB_KILL_ROUNDS").unwrap_or(DEFAULT_ROUNDS);
    let base = env_u64("IDEMDB_KILL_SEED").unwrap_or(BASE_SEED);
    let started = Instant::now();
    let exe = std::env::current_exe().expect("current_exe");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("kill.idem");
    let mut rng = SplitMix64::new(base);
    let mut model = Model::default();
    let mut tally = Tally::default();
    for round in 0..rounds {
        let seed = round_seed(base, round);
        model.seeds.push(seed);
        let plan = plan(round, &mut rng);
        let log = run_round(&exe, &path, round, seed, &plan);
        tally.kills += 1;
        if log
            .partial
            .as_deref()
            .is_some_and(|p| is_ack(p) || "CLAIMED ".starts_with(p) || "COMPLETED ".starts_with(p))
        {
            tally.partial_acks += 1;
        }
        if !log.lines.iter().any(|l| l == "OPENED") {
            tally.before_open += 1;
        }
        if !log.lines.iter().any(|l| is_ack(l)) {
            tally.before_ack += 1;
        }
        if let Some(at) = log.probed_at {
            tally.probes += 1;
            if log.lines[at..].iter().any(|l| is_ack(l)) {
                tally.acks_after_probe += 1;
            }
        }
        record_acks(&mut model, round, &log.lines);
        verify(&path, &mut model, round, &log.lines);
    }
    let summary = format!(
        "kill -9: {rounds} rounds, {} kills ({} before the store was open, {} before any \
         acknowledgement), {} acknowledged claims and {} completions checked, {} unacknowledged \
         in-flight claims found landed, {} AlreadyOpen probes ({} with acknowledgements after \
         them), {} partial acknowledgement lines dropped, 0 lost, {:.1} s\n",
        tally.kills,
        tally.before_open,
        tally.before_ack,
        model.acked.len(),
        model.completions,
        model.landed.len(),
        tally.probes,
        tally.acks_after_probe,
        tally.partial_acks,
        started.elapsed().as_secs_f64()
    );
    let _ = std::io::stderr().write_all(summary.as_bytes());
}
