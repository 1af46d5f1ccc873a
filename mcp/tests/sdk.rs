//! The gateway from outside, driven by the official Python SDK (and the TypeScript SDK's
//! client): as a plain proxy (`tests/passthrough.py`: server-everything seen directly and
//! through `idemdb-mcp serve` must look the same), and as an agent's tool gateway in front of a
//! tool server with a ledger (`tests/agent_loop.py`: timeouts, reworded retries, concurrent
//! duplicates and a resumed agent, every side effect once; `tests/upstream_dies.py` and
//! `tests/gateway_killed.py`: a tool server or the gateway dying mid-call leaves the step's
//! outcome unknown, and the step is never run again; `tests/ts_client.cjs`: a reworded retry
//! from the TypeScript SDK's client replayed; `tests/http_gateway.py` and `tests/ts_http.cjs`:
//! the same on Streamable HTTP, `--listen`, with its tenants, sessions and refusals;
//! `tests/config_gateway.py`: `--config`, several upstreams on stdio and Streamable HTTP behind
//! one gateway, and an upstream that honours the key; `tests/counted.py`, with features
//! `metrics` and `tracing`: every outcome of a tools/call counted exactly in `/metrics` and on
//! stderr; `tests/two_gateways.py`, with feature `postgres`: two gateways on one database).
//!
//! Needs the SDKs `scripts/mcp-sdks` installs: `eval "$(scripts/mcp-sdks)"` sets
//! `IDEMDB_MCP_PYTHON` and `IDEMDB_MCP_NODE_MODULES` (`.ci/run` does).

use std::path::Path;
use std::process::Command;

fn sdk(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "{var} is not set: run `eval \"$(scripts/mcp-sdks)\"` first (it installs the MCP SDKs)"
        )
    })
}

const GATEWAY: &str = env!("CARGO_BIN_EXE_idemdb-mcp");

/// The operator's `idemdb` command, built beside the gateway (by the workspace's own tests, or
/// `cargo build --release -p idemdb-cli`): the scripts list and resolve unknown steps with it.
/// `IDEMDB_CLI` names another build (one with the `postgres` feature, for a database store).
fn cli() -> std::path::PathBuf {
    if let Some(cli) = std::env::var_os("IDEMDB_CLI") {
        return cli.into();
    }
    let cli = Path::new(GATEWAY).with_file_name("idemdb");
    assert!(
        cli.exists(),
        "{} is missing: run `cargo build --release -p idemdb-cli` first",
        cli.display()
    );
    cli
}

/// Runs `script` with the SDK's Python, the gateway's binary, `arg` and a fresh directory.
fn python(name: &str, script: &str, arg: &str) -> String {
    run(
        name,
        &sdk("IDEMDB_MCP_PYTHON"),
        script,
        &[GATEWAY, arg],
        &[],
    )
}

/// Runs `program` on `script` with `args` and a fresh directory after them; returns what it
/// printed, having checked it succeeded.
fn run(name: &str, program: &str, script: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let dir = std::env::temp_dir().join(format!("idemdb-mcp-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(script);
    let out = Command::new(program)
        .env("IDEMDB_CLI", cli())
        .envs(env.iter().copied())
        .arg(script)
        .args(args)
        .arg(&dir)
        .output()
        .expect("run the SDK's client");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
    println!("{stdout}");
    stdout
}

#[test]
fn server_everything_looks_the_same_through_the_gateway() {
    let modules = sdk("IDEMDB_MCP_NODE_MODULES");
    let out = python("passthrough", "passthrough.py", &modules);
    assert!(out.contains("13 tools identical"), "{out}");
}

#[test]
fn an_agent_that_times_out_rewords_retries_and_resumes_has_each_side_effect_once() {
    let out = python("agent", "agent_loop.py", &sdk("IDEMDB_MCP_PYTHON"));
    let once = "4 side effects in the ledger (0 duplicates)";
    assert!(out.contains(once), "{out}");
}

#[test]
fn an_upstream_that_dies_mid_call_leaves_the_outcome_unknown_and_is_never_run_again() {
    let out = python("dies", "upstream_dies.py", &sdk("IDEMDB_MCP_PYTHON"));
    assert!(out.contains("1 side effect in the ledger"), "{out}");
}

#[test]
fn a_gateway_killed_mid_call_and_restarted_never_runs_the_step_again() {
    let out = python("killed", "gateway_killed.py", &sdk("IDEMDB_MCP_PYTHON"));
    assert!(out.contains("1 side effect in the ledger"), "{out}");
}

#[test]
fn the_typescript_sdks_client_gets_a_reworded_retry_replayed() {
    let (modules, python) = (sdk("IDEMDB_MCP_NODE_MODULES"), sdk("IDEMDB_MCP_PYTHON"));
    let out = run(
        "ts",
        "node",
        "ts_client.cjs",
        &[&modules, GATEWAY, &python],
        &[],
    );
    assert!(out.contains("1 side effect in the ledger"), "{out}");
}

#[cfg(feature = "postgres")]
#[test]
fn two_gateways_on_one_database_run_each_step_once_and_renew_their_leases() {
    let python = sdk("IDEMDB_MCP_PYTHON");
    let store = std::env::var("IDEMDB_PG_STORE")
        .expect("IDEMDB_PG_STORE is not set: run under scripts/with-postgres");
    let out = run(
        "two",
        &python,
        "two_gateways.py",
        &[GATEWAY, &python],
        &[("IDEMDB_MCP_STORE", &store)],
    );
    assert!(out.contains("2 side effects in the ledger"), "{out}");
}

#[test]
fn on_streamable_http_tenants_are_apart_duplicates_run_once_and_refusals_are_clear() {
    let out = python("http", "http_gateway.py", &sdk("IDEMDB_MCP_PYTHON"));
    assert!(
        out.contains("4 side effects in the ledger (0 duplicates)"),
        "{out}"
    );
}

#[test]
fn the_typescript_sdks_http_client_gets_a_reworded_retry_replayed() {
    let (modules, python) = (sdk("IDEMDB_MCP_NODE_MODULES"), sdk("IDEMDB_MCP_PYTHON"));
    let out = run(
        "ts-http",
        "node",
        "ts_http.cjs",
        &[&modules, GATEWAY, &python],
        &[],
    );
    assert!(out.contains("1 side effect in the ledger"), "{out}");
}

/// `tests/config_gateway.py`'s part `part`: one gateway, `serve --config`, in front of the
/// ledger server on stdio and on Streamable HTTP, server-everything, and a payment server.
fn config_gateway(part: &str) -> String {
    let (modules, python) = (sdk("IDEMDB_MCP_NODE_MODULES"), sdk("IDEMDB_MCP_PYTHON"));
    let name = format!("config-{part}");
    run(
        &name,
        &python,
        "config_gateway.py",
        &[GATEWAY, &python, &modules, part],
        &[],
    )
}

#[test]
fn a_config_of_several_upstreams_prefixes_their_tools_and_keeps_each_step_once_per_upstream() {
    let out = config_gateway("hub");
    assert!(out.contains("4 upstreams"), "{out}");
    assert!(
        out.contains("one step on two upstreams: 2 side effects"),
        "{out}"
    );
    assert!(out.contains("1 attempt, 1 charge"), "{out}");
}

#[test]
fn a_lost_call_to_an_upstream_that_honours_the_key_is_forwarded_again_and_charged_once() {
    let out = config_gateway("honours-key");
    assert!(out.contains("2 attempts, 1 charge"), "{out}");
}

#[cfg(all(feature = "metrics", feature = "tracing"))]
#[test]
fn every_outcome_of_a_tool_call_is_counted_in_the_metrics_and_the_events() {
    let out = python("counted", "counted.py", &sdk("IDEMDB_MCP_PYTHON"));
    assert!(out.contains("every outcome counted exactly"), "{out}");
}

#[cfg(not(feature = "metrics"))]
#[test]
fn metrics_asked_of_a_gateway_built_without_them_is_refused_naming_the_feature() {
    let store = std::env::temp_dir().join(format!("idemdb-mcp-nometrics-{}", std::process::id()));
    let out = Command::new(GATEWAY)
        .args(["serve", "--store"])
        .arg(&store)
        .args(["--metrics", "127.0.0.1:0", "--", "true"])
        .output()
        .expect("run the gateway");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--features metrics"), "{stderr}");
    assert!(!store.exists(), "refused before the store opened");
}

#[test]
fn a_tools_failure_is_replayed_an_upstream_error_releases_and_config_serves_http() {
    let out = python("outcomes", "outcomes.py", &sdk("IDEMDB_MCP_PYTHON"));
    assert!(out.contains("3 side effects in the ledger"), "{out}");
}
