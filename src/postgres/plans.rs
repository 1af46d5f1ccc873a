//! How the engine's statements are planned: once per connection, the same plan whatever the
//! table's statistics say.
//!
//! Every statement the engine sends finds its rows by key (a batch of keys joined to the
//! records by primary key) or walks one index in order (reap, purge, export). For all of them
//! one plan is right: index lookups in a nested loop. Left to itself, the planner chose
//! otherwise in two ways, both measured on this project's comparison run:
//!
//! - It planned each batch statement again on every execution (a custom plan: the arrays'
//!   lengths are known then), about 130 µs of the server's CPU per statement.
//! - A plan cached while the statistics said "few claims in progress" (a merge join over
//!   `records_in_progress`) walked every claim in progress for each completion once there
//!   were tens of thousands (a crash's orphans, or a load of abandoned claims).
//!
//! So each session of the pool plans every prepared statement once, generically, with
//! sequential scans, hash joins and merge joins ruled out (`enable_*` only makes them cost
//! more: a statement that had no other plan would still run). The statements keep the
//! planner away from `records_in_progress` where they look rows up by key (see `sql.rs`).

use super::rows::db_error;
use crate::error::Result;
use tokio_postgres::Client;

/// The settings [`fix_plans`] gives a session. `jit = off`: a statement whose only plan the
/// `enable_*` settings make cost 10^10 (a sequential scan with no index to use) would be
/// compiled by LLVM first, about 400 ms (found when a sum over `usage_total` did), and no
/// statement of the engine reads enough rows for compiled expressions to pay.
pub(crate) const SESSION: &str = "SET plan_cache_mode = force_generic_plan; \
    SET enable_seqscan = off; SET enable_hashjoin = off; SET enable_mergejoin = off; \
    SET jit = off";

/// Gives the session the planner settings every statement of the engine is written for.
///
/// # Errors
/// [`crate::Error::Database`] if the server refuses a setting.
pub(crate) async fn fix_plans(client: &Client) -> Result<()> {
    client.batch_execute(SESSION).await.map_err(db_error)
}

#[cfg(test)]
mod tests {
    //! Needs the server `scripts/with-postgres` starts (`IDEMDB_PG_URL`), like the PostgreSQL
    //! suite under `tests/`.

    use super::super::{schema, sql};
    use tokio_postgres::NoTls;

    /// Each hot statement, with arguments for `EXECUTE`.
    const STATEMENTS: [(&str, &str, &str); 11] = [
        (
            "claim",
            sql::CLAIM,
            "NULL, '{\"\\\\x01\"}', '{\"\\\\x02\"}', '{k1}', '{\"\\\\x03\"}', 1000, true, 'o', 1",
        ),
        (
            "claim_one",
            sql::CLAIM_ONE,
            "NULL, '\\x01', '\\x02', 'k2', '\\x03', 1000, true, 'o', 1",
        ),
        (
            "claim_new",
            sql::CLAIM_NEW,
            "NULL, '\\x01', '\\x02', 'k3', '\\x03', 1000, 'o', 1",
        ),
        (
            "held",
            sql::HELD,
            "NULL, '{\"\\\\x01\"}', '{\"\\\\x02\"}', '{k1}', 'o', 1",
        ),
        ("get", sql::GET, "NULL, '\\x01', '\\x02', 'k1', 'o', 1"),
        (
            "complete",
            sql::COMPLETE,
            "NULL, '{\"\\\\x01\"}', '{\"\\\\x02\"}', '{k1}', '{5}', '{200}', '{\"\\\\x\"}', \
             '{\"\\\\x\"}', 1000",
        ),
        (
            "complete_one",
            sql::COMPLETE_ONE,
            "NULL, '\\x01', '\\x02', 'k1', 5, 200, '\\x', '\\x', 1000",
        ),
        (
            "release",
            sql::RELEASE,
            "'{\"\\\\x01\"}', '{\"\\\\x02\"}', '{k1}', '{5}'",
        ),
        (
            "extend",
            sql::EXTEND,
            "NULL, '{\"\\\\x01\"}', '{\"\\\\x02\"}', '{k1}', '{5}', false, '{1000}'",
        ),
        (
            "abandon",
            sql::ABANDON,
            "'{\"\\\\x01\"}', '{\"\\\\x02\"}', '{k1}', '{5}'",
        ),
        (
            "reap_complete",
            sql::REAP_COMPLETE,
            "NULL, '\\x01', '\\x02', 'k1', 5, 9, 200, '\\x', '\\x', 1000",
        ),
    ];

    /// The plan of `text` prepared as `name` and executed with `args`, as the session plans it.
    async fn explain(
        client: &tokio_postgres::Client,
        name: &str,
        text: &str,
        args: &str,
    ) -> String {
        client
            .batch_execute(&format!("PREPARE {name} AS {text}"))
            .await
            .unwrap();
        let rows = client
            .simple_query(&format!("EXPLAIN (VERBOSE) EXECUTE {name}({args})"))
            .await
            .unwrap();
        let plan: Vec<String> = rows
            .iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
                _ => None,
            })
            .collect();
        plan.join("\n")
    }

    /// The generic plan of every hot statement looks its rows up by primary key, even when the
    /// statistics were taken with no claim in progress and a hundred thousand are (the plans
    /// that made each completion walk every claim in progress, and each batch be planned
    /// again, are what this rules out).
    #[test]
    fn hot_statements_look_rows_up_by_primary_key_whatever_the_statistics_say() {
        let url = std::env::var("IDEMDB_PG_URL").expect(
            "IDEMDB_PG_URL is not set: run `scripts/with-postgres cargo test --release --features postgres`",
        );
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let (mut client, connection) = tokio_postgres::connect(&url, NoTls).await.unwrap();
            tokio::spawn(connection);
            let s = "plans_test";
            client
                .batch_execute(&format!("DROP SCHEMA IF EXISTS {s} CASCADE"))
                .await
                .unwrap();
            schema::migrate(&mut client, s).await.unwrap();
            // Statistics from a table of completions only, then a crowd of claims.
            let q = |text: &str| schema::qualify(text, s);
            client
                .batch_execute(&q(
                    "INSERT INTO {s}.records (tenant, endpoint, key, fence, fingerprint, \
                         claimed_at, completed, completed_at, expires_at, status, headers, body) \
                     SELECT '\\x01', '\\x02', 'c' || g, g, '\\x03', 1, true, 1, 2, 200, '\\x', '\\x' \
                     FROM generate_series(1, 20000) g; \
                     ANALYZE {s}.records; \
                     INSERT INTO {s}.records (tenant, endpoint, key, fence, fingerprint, \
                         claimed_at, lease_until, owner, incarnation) \
                     SELECT '\\x01', '\\x02', 'p' || g, 100000 + g, '\\x03', 1, 2, 'o', 1 \
                     FROM generate_series(1, 100000) g",
                ))
                .await
                .unwrap();
            super::fix_plans(&client).await.unwrap();
            for (name, text, args) in STATEMENTS {
                let plan = explain(&client, name, &q(text), args).await;
                for bad in [
                    "Seq Scan on records",
                    "Hash Join",
                    "Merge Join",
                    "Materialize",
                    "records_in_progress",
                ] {
                    assert!(!plan.contains(bad), "{name} plans {bad}:\n{plan}");
                }
                assert!(
                    plan.contains("records_pkey"),
                    "{name} does not use the primary key:\n{plan}"
                );
                // Generic: the plan names parameters, not the arguments given.
                assert!(plan.contains('$'), "{name} was planned for its arguments:\n{plan}");
            }
            // A scan's pages: each starts where the last ended, through the index (a page
            // that reads the index from its start makes a scan quadratic).
            for (name, start, tenant, args) in [
                ("scan_after", false, false, "NULL, '\\x01', '\\x02', 'c5', false, 1000, NULL, NULL, NULL, 0"),
                ("scan_tenant", false, true, "NULL, '\\x01', '\\x02', 'c5', false, 1000, '\\x01', NULL, NULL, 0"),
                ("scan_tenant_first", true, true, "NULL, '\\x', '\\x', '', true, 1000, '\\x01', NULL, NULL, 8"),
            ] {
                let text = q(&super::super::transfer::scan_text(start, tenant));
                let plan = explain(&client, name, &text, args).await;
                assert!(
                    plan.contains("records_pkey") && plan.contains("Index Cond"),
                    "{name} does not start from its position in the primary key:\n{plan}"
                );
            }
            client
                .batch_execute(&format!("DROP SCHEMA {s} CASCADE"))
                .await
                .unwrap();
        });
    }
}
