//! What a transaction pooler costs the PostgreSQL engine: claim + complete through the blocking
//! API at 1 and 64 callers, three ways to one server, taken in turn (`IDEMDB_BENCH_ROUNDS`
//! rounds, default 2, of `IDEMDB_BENCH_SECONDS`, default 3):
//!
//! - direct, `pool_mode=session` (the default: statements prepared once per connection);
//! - direct, `pool_mode=transaction` (unnamed statements planned per execution, no pooler):
//!   what the statements alone cost;
//! - through PgBouncer in transaction mode, `pool_mode=transaction`;
//! - direct, `session`, with `max_live_records_per_tenant` and `max_store_bytes` set (a schema
//!   that counts its records, the claim statement that checks the bounds): what bounds cost.
//!
//! ```sh
//! cargo bench --features postgres --bench postgres_pooler
//! ```
//!
//! It starts the server and PgBouncer (`scripts/with-postgres --pgbouncer`, as root) and runs
//! itself beside them. Prints a table: requests per second and p50 latency per request.

use idemdb::Store;
use std::path::Path;
use std::time::Duration;

#[path = "pg_cycles/mod.rs"]
mod pg_cycles;
use pg_cycles::{env_or, run};

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    match std::env::var("IDEMDB_PG_DIRECT_URL") {
        Ok(direct) => measure(
            &direct,
            &std::env::var("IDEMDB_PG_URL").expect("beside PgBouncer"),
        ),
        Err(_) => {
            let status = std::process::Command::new(
                Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/with-postgres"),
            )
            .arg("--pgbouncer")
            .arg(std::env::current_exe().expect("this bench"))
            .status()
            .expect("run scripts/with-postgres");
            assert!(status.success());
        }
    }
}

fn measure(direct: &str, bouncer: &str) {
    let seconds = env_or("IDEMDB_BENCH_SECONDS", 3);
    let rounds = env_or("IDEMDB_BENCH_ROUNDS", 2);
    let unnamed = format!("{direct} pool_mode=transaction");
    println!("| callers | route | requests/s | p50 per request |");
    println!("| ---: | --- | ---: | ---: |");
    for callers in [1, 64] {
        for round in 0..rounds {
            for (name, url, bounded) in [
                ("direct, session", direct, false),
                ("direct, transaction", &unnamed, false),
                ("PgBouncer, transaction", bouncer, false),
                ("direct, session, bounded", direct, true),
            ] {
                let mut builder = Store::builder();
                if bounded {
                    builder = builder
                        .max_live_records_per_tenant(1 << 40)
                        .max_store_bytes(1 << 50);
                }
                // A schema of its own: the bounded store makes its schema count records.
                let schema = if bounded {
                    "pooler_bench_bounded"
                } else {
                    "pooler_bench"
                };
                let store = builder.schema(schema).connect(url).expect("connect");
                let (rate, p50) = run(&store, callers, Duration::from_secs(seconds), round);
                println!("| {callers} | {name} | {rate:.0} | {p50:.0?} |");
            }
        }
    }
}
