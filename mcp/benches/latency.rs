//! The gateway's added latency per `tools/call`: a client speaking MCP on stdio makes calls one
//! at a time, straight to a tool server and through `idemdb-mcp serve`, and prints p50 and p99
//! of each and what the gateway adds over the direct call.
//!
//! The tool server is this binary itself, re-executed with `IDEMDB_MCP_BENCH_SERVER=1`: a
//! minimal MCP server in Rust that answers every call at once, so what is measured is the
//! gateway (and the pipes), not a server's own latency.
//!
//!     cargo bench -p idemdb-mcp --bench latency
//!     IDEMDB_MCP_BENCH_CALLS=500 cargo bench -p idemdb-mcp --bench latency
//!     # the same rows on PostgreSQL too (scripts/with-postgres sets IDEMDB_PG_STORE):
//!     scripts/with-postgres cargo bench -p idemdb-mcp --features postgres --bench latency
//!
//! Rows: direct (client to tool server); through the gateway on a file store, unkeyed (passed
//! through); keyed, a new step each call (claimed durably, forwarded, stored); keyed, the same
//! step again (replayed from the store, never forwarded). With feature `postgres` and
//! `IDEMDB_PG_STORE` set (scripts/with-postgres), the three gateway rows again on PostgreSQL.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Set in the environment of the tool server this binary runs as.
const SERVER: &str = "IDEMDB_MCP_BENCH_SERVER";
/// The number of measured calls per row (a tenth as many first, to warm up).
const CALLS: &str = "IDEMDB_MCP_BENCH_CALLS";
const GATEWAY: &str = env!("CARGO_BIN_EXE_idemdb-mcp");

fn main() {
    if std::env::var_os(SERVER).is_some() {
        return tool_server();
    }
    let calls: usize = std::env::var(CALLS)
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(2000);
    let warm_up = (calls / 10).max(1);
    let me = std::env::current_exe().expect("the bench's own path");
    let dir = std::env::temp_dir().join(format!("idemdb-mcp-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a temporary directory");

    println!("idemdb-mcp latency per tools/call, one at a time over stdio");
    println!(
        "machine: {} CPUs ({}), {calls} calls per row after {warm_up} to warm up",
        std::thread::available_parallelism().map_or(0, usize::from),
        cpu_model()
    );
    let direct = measure(&server_command(&me), Calls::Unkeyed, calls, warm_up);
    let mut rows = vec![("direct (client -> tool server)".to_owned(), direct.clone())];
    let file = dir.join("bench.idem");
    let mut stores = vec![("file", file.to_string_lossy().into_owned())];
    if let Some(url) = postgres_url() {
        stores.push(("postgres", url));
    }
    for (name, store) in &stores {
        let gateway = gateway_command(&me, store);
        let run = run_id();
        for (what, mode) in [
            ("unkeyed", Calls::Unkeyed),
            ("keyed, new step", Calls::NewStep(run.clone())),
            ("keyed, replay", Calls::Replay(run.clone())),
        ] {
            rows.push((
                format!("gateway, {name} store: {what}"),
                measure(&gateway, mode, calls, warm_up),
            ));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);

    let (base50, base99) = (percentile(&direct, 50), percentile(&direct, 99));
    println!(
        "\n{:<44} {:>9} {:>9} {:>11} {:>11}",
        "row", "p50 µs", "p99 µs", "added p50", "added p99"
    );
    for (name, samples) in &rows {
        let (p50, p99) = (percentile(samples, 50), percentile(samples, 99));
        println!(
            "{name:<44} {:>9.1} {:>9.1} {:>11.1} {:>11.1}",
            p50,
            p99,
            p50 - base50,
            p99 - base99
        );
    }
}

/// Which calls a row makes.
#[derive(Clone)]
enum Calls {
    /// No key.
    Unkeyed,
    /// A new step of the task each call.
    NewStep(String),
    /// Step 0 of the task every call (run once during the warm-up, replayed after).
    Replay(String),
}

/// The round trip of each of `calls` calls (µs), after `warm_up` unmeasured ones, to a fresh
/// process of `command`.
fn measure(command: &[String], mode: Calls, calls: usize, warm_up: usize) -> Vec<f64> {
    let mut peer = Peer::start(command);
    peer.ask(
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "latency-bench", "version": "0"}}),
    );
    peer.notify("notifications/initialized");
    let mut samples = Vec::with_capacity(calls);
    for i in 0..warm_up + calls {
        let mut params = json!({"name": "echo", "arguments": {"text": "hello"}});
        match &mode {
            Calls::Unkeyed => {}
            // Warm-up and measured calls alike take new steps: none is ever replayed.
            Calls::NewStep(task) => {
                params["_meta"] =
                    json!({"io.idemdb/task": format!("{task}-new"), "io.idemdb/step": i + 1})
            }
            Calls::Replay(task) => {
                params["_meta"] =
                    json!({"io.idemdb/task": format!("{task}-replay"), "io.idemdb/step": 0})
            }
        }
        let started = Instant::now();
        let answer = peer.ask("tools/call", params);
        let took = started.elapsed();
        let replayed = answer["result"]["_meta"]["io.idemdb/replayed"] == json!(true);
        assert!(
            answer["result"]["content"][0]["text"] == "hello"
                && replayed == (matches!(mode, Calls::Replay(_)) && i > 0),
            "an unexpected answer: {answer}"
        );
        if i >= warm_up {
            samples.push(took.as_secs_f64() * 1e6);
        }
    }
    peer.finish();
    samples.sort_by(f64::total_cmp);
    samples
}

/// A process spoken to in MCP's stdio transport.
struct Peer {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    next: u64,
    line: String,
}

impl Peer {
    fn start(command: &[String]) -> Peer {
        let mut child = Command::new(&command[0])
            .args(&command[1..])
            .env(SERVER, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the peer");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        Peer {
            child,
            stdin,
            stdout,
            next: 0,
            line: String::new(),
        }
    }

    fn send(&mut self, message: &Value) {
        let stdin = self.stdin.as_mut().expect("open until finish");
        writeln!(stdin, "{message}").expect("write to the peer");
        stdin.flush().expect("flush to the peer");
    }

    fn notify(&mut self, method: &str) {
        self.send(&json!({"jsonrpc": "2.0", "method": method}));
    }

    /// Sends a request and reads until its answer.
    fn ask(&mut self, method: &str, params: Value) -> Value {
        self.next += 1;
        let id = self.next;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            self.line.clear();
            let n = self
                .stdout
                .read_line(&mut self.line)
                .expect("read the peer");
            assert!(n > 0, "the peer ended before answering {method}");
            let message: Value = serde_json::from_str(&self.line).expect("a JSON line");
            if message["id"] == json!(id) {
                return message;
            }
        }
    }

    /// Closes stdin (the stdio transport's shutdown) and waits for the process to end.
    fn finish(mut self) {
        drop(self.stdin.take());
        let status = self.child.wait().expect("wait for the peer");
        assert!(status.success(), "the peer ended with {status}");
    }
}

/// This binary as the tool server.
fn server_command(me: &Path) -> Vec<String> {
    vec![me.to_string_lossy().into_owned()]
}

/// The gateway on `store` in front of this binary as the tool server.
fn gateway_command(me: &Path, store: &str) -> Vec<String> {
    let mut command = vec![
        GATEWAY.to_owned(),
        "serve".into(),
        "--store".into(),
        store.into(),
    ];
    command.push("--".into());
    command.extend(server_command(me));
    command
}

/// Tasks of this run: a PostgreSQL store outlives it, so keys must not repeat across runs.
fn run_id() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    format!("bench-{}-{}", std::process::id(), now.as_nanos())
}

/// The `postgres://` store `scripts/with-postgres` names (`IDEMDB_PG_STORE`); `None` without
/// feature `postgres` or the variable.
fn postgres_url() -> Option<String> {
    if !cfg!(feature = "postgres") {
        return None;
    }
    std::env::var("IDEMDB_PG_STORE").ok()
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
                .map(|(_, model)| model.trim().to_owned())
        })
        .unwrap_or_else(|| "CPU model unknown".into())
}

/// The `p`th percentile of sorted `samples` (nearest rank).
fn percentile(samples: &[f64], p: usize) -> f64 {
    let rank = (samples.len() * p).div_ceil(100).max(1);
    samples[rank.min(samples.len()) - 1]
}

/// The tool server: one tool, `echo`, answered at once; everything on stdio, one JSON-RPC
/// message per line, until stdin closes.
fn tool_server() {
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout().lock();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { return };
        let Ok(message) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let Some(id) = message
            .get("id")
            .filter(|_| message.get("method").is_some())
        else {
            continue; // A notification.
        };
        let result = match message["method"].as_str() {
            Some("initialize") => json!({
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "latency-bench-server", "version": "0"}}),
            Some("tools/list") => json!({"tools": [{"name": "echo",
                "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}}}]}),
            Some("tools/call") => json!({"content": [{"type": "text",
                "text": message["params"]["arguments"]["text"]}]}),
            _ => json!({}),
        };
        let answer = json!({"jsonrpc": "2.0", "id": id, "result": result});
        if writeln!(stdout, "{answer}")
            .and_then(|()| stdout.flush())
            .is_err()
        {
            return;
        }
    }
}
