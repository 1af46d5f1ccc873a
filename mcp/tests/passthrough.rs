//! The gateway as a plain proxy, driven by the official Python SDK (`tests/passthrough.py`):
//! server-everything seen directly and through `idemdb-mcp serve` must look the same.
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

#[test]
fn server_everything_looks_the_same_through_the_gateway() {
    let store = tempfile_dir();
    let out = Command::new(sdk("IDEMDB_MCP_PYTHON"))
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/passthrough.py"))
        .arg(env!("CARGO_BIN_EXE_idemdb-mcp"))
        .arg(sdk("IDEMDB_MCP_NODE_MODULES"))
        .arg(&store)
        .output()
        .expect("run the Python SDK's client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("13 tools identical"), "{stdout}");
    println!("{stdout}");
    let _ = std::fs::remove_dir_all(&store);
}

/// A fresh directory for the gateway's store.
fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("idemdb-mcp-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    dir
}
