//! What TLS costs the PostgreSQL engine: claim + complete through the blocking API at 1 and 64
//! callers, with `sslmode=verify-full` against `sslmode=disable`, on one server, the two taken
//! in turn (`IDEMDB_BENCH_ROUNDS` rounds, default 2, of `IDEMDB_BENCH_SECONDS`, default 3).
//!
//! ```sh
//! cargo bench --features postgres --bench postgres_tls
//! ```
//!
//! It makes its certificates (`tests/tls_certs`), starts a server that speaks TLS
//! (`scripts/with-postgres --tls`, as root), and runs itself beside it. The plain connections
//! log in as `idemdb_plain`, the one role that server lets in without TLS. Prints a table:
//! requests per second and p50 latency per request for each.

use idemdb::Store;
use std::path::Path;
use std::time::Duration;

#[path = "pg_cycles/mod.rs"]
mod pg_cycles;
use pg_cycles::{env_or, run};

#[path = "../tests/tls_certs/mod.rs"]
mod tls_certs;

const CERTS_ENV: &str = "IDEMDB_TLS_CERTS";

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    match std::env::var_os(CERTS_ENV) {
        Some(dir) => measure(Path::new(&dir)),
        None => {
            let dir = tempfile::tempdir().expect("a temporary directory");
            tls_certs::make(dir.path());
            let status = std::process::Command::new(
                Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/with-postgres"),
            )
            .arg("--tls")
            .arg(dir.path())
            .arg(std::env::current_exe().expect("this bench"))
            .env(CERTS_ENV, dir.path())
            .status()
            .expect("run scripts/with-postgres");
            assert!(status.success());
        }
    }
}

fn measure(dir: &Path) {
    let port = std::env::var("IDEMDB_PG_PORT").expect("beside scripts/with-postgres");
    let seconds = env_or("IDEMDB_BENCH_SECONDS", 3);
    let rounds = env_or("IDEMDB_BENCH_ROUNDS", 2);
    let plain = format!("host=127.0.0.1 port={port} user=idemdb_plain dbname=idem sslmode=disable");
    let tls = format!(
        "host=localhost port={port} user=idemdb_plain dbname=idem sslmode=verify-full sslrootcert='{}'",
        dir.join("ca.crt").display()
    );
    println!("| callers | connection | requests/s | p50 per request |");
    println!("| ---: | --- | ---: | ---: |");
    for callers in [1, 64] {
        for round in 0..rounds {
            for (name, url) in [("plain", &plain), ("TLS, verify-full", &tls)] {
                let store = Store::builder()
                    .schema("tls_bench")
                    .connect(url)
                    .expect("connect");
                let (rate, p50) = run(&store, callers, Duration::from_secs(seconds), round);
                println!("| {callers} | {name} | {rate:.0} | {p50:.0?} |");
            }
        }
    }
}
