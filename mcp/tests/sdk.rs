//! The gateway from outside, driven by the official Python SDK: as a plain proxy
//! (`tests/passthrough.py`: server-everything seen directly and through `idemdb-mcp serve` must
//! look the same), and as an agent's tool gateway (`tests/agent_loop.py`: timeouts, reworded
//! retries, concurrent duplicates and a resumed agent against a tool server with a ledger; every
//! side effect once; `tests/upstream_dies.py`: a tool server that dies mid-call leaves the step's
//! outcome unknown, and the step is never run again; `tests/gateway_killed.py`: the same when the
//! gateway itself is SIGKILLed mid-call and started again on its store).
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

/// Runs `script` with the SDK's Python, the gateway's binary, `arg` and a fresh directory;
/// returns what it printed, having checked it succeeded.
fn python(name: &str, script: &str, arg: &str) -> String {
    let dir = std::env::temp_dir().join(format!("idemdb-mcp-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let out = Command::new(sdk("IDEMDB_MCP_PYTHON"))
        .arg(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests")
                .join(script),
        )
        .arg(env!("CARGO_BIN_EXE_idemdb-mcp"))
        .arg(arg)
        .arg(&dir)
        .output()
        .expect("run the Python SDK's client");
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
    let out = python(
        "passthrough",
        "passthrough.py",
        &sdk("IDEMDB_MCP_NODE_MODULES"),
    );
    assert!(out.contains("13 tools identical"), "{out}");
}

#[test]
fn an_agent_that_times_out_rewords_retries_and_resumes_has_each_side_effect_once() {
    let out = python("agent", "agent_loop.py", &sdk("IDEMDB_MCP_PYTHON"));
    assert!(
        out.contains("3 side effects in the ledger (0 duplicates)"),
        "{out}"
    );
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
