//! The PostgreSQL engine's promises that only matter when something else goes wrong, each made
//! to matter (`docs/postgres.md`):
//!
//! - every session commits durably (`synchronous_commit = on`) whatever the role's default;
//! - a server running with `fsync = off` is refused, on every connection;
//! - a statement undone by a deadlock runs again, and its claims are still made;
//! - fences grow per key even past a claim statement that waited while a newer claim was made;
//! - a session the server ends costs at most the statement it was sent, and a lone caller's own
//!   connection (the direct lane) that the server closed while idle is replaced before use.
//!
//! Runs against the server `scripts/with-postgres` starts (`IDEMDB_PG_URL`). The `fsync` test
//! changes the whole server's configuration, so it runs alone: it takes [`SERVER`] for
//! writing, every other test for reading.

#![cfg(feature = "postgres")]

use idemdb::{Claim, Error, Fingerprint, ManualClock, Response, Scope, Store};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use tokio_postgres::{Client, NoTls};

static SERVER: RwLock<()> = RwLock::new(());

/// Held by the tests that grant and revoke on the database: two such statements at once fail
/// with "tuple concurrently updated" (both rewrite `pg_database`'s row).
static DATABASE_GRANTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn url() -> String {
    std::env::var("IDEMDB_PG_URL").expect(
        "IDEMDB_PG_URL is not set: run `scripts/with-postgres cargo test --release --features postgres`",
    )
}

fn schema(test: &str) -> String {
    format!("promise_{test}_{}", std::process::id())
}

fn scope() -> Scope {
    Scope::new("tenant", "POST /v1/payments")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A session of the test's own, outside every store.
async fn outside(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

/// Deadlocks PostgreSQL found in this database so far.
async fn deadlocks(client: &Client) -> i64 {
    client
        .query_one(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// Waits until a session of the store waits for a lock held elsewhere.
async fn until_a_store_statement_waits(observer: &Client, schema: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let waiting: i64 = observer
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'",
                &[&schema],
            )
            .await
            .unwrap()
            .get(0);
        if waiting > 0 {
            return;
        }
        assert!(Instant::now() < deadline, "no statement of the store waits");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn acquired(claim: idemdb::Result<Claim>) -> idemdb::Ticket {
    match claim {
        Ok(Claim::Acquired(t)) => t,
        other => panic!("expected an acquired claim, got {other:?}"),
    }
}

/// A new role whose sessions default to `synchronous_commit = level`, allowed to create a
/// schema, and the name of a schema for it: `(role, schema)`.
fn role_committing_with(
    rt: &tokio::runtime::Runtime,
    admin: &Client,
    test: &str,
    level: &str,
) -> (String, String) {
    let role = format!("{test}_sc_{level}_{}", std::process::id());
    let schema = schema(&format!("{test}_{level}"));
    rt.block_on(admin.batch_execute(&format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE; DROP ROLE IF EXISTS {role};
         CREATE ROLE {role} LOGIN; GRANT CREATE ON DATABASE idem TO {role};
         ALTER ROLE {role} SET synchronous_commit = {level};"
    )))
    .unwrap();
    (role, schema)
}

/// A role whose sessions default to `synchronous_commit = off` (or `local`, `remote_write`)
/// would let a commit be acknowledged before its WAL is on disk. Every session of the store
/// runs with `on` all the same, and a role that asks for the stronger `remote_apply` keeps it.
/// A trigger notes the setting of each session that writes a record.
#[test]
fn every_session_commits_durably_whatever_the_roles_default() {
    let _shared = SERVER.read().unwrap_or_else(|e| e.into_inner());
    let _grants = DATABASE_GRANTS.lock().unwrap_or_else(|e| e.into_inner());
    let rt = runtime();
    let admin = rt.block_on(outside(&url()));
    for (default, expected) in [
        ("off", "on"),
        ("local", "on"),
        ("remote_write", "on"),
        ("remote_apply", "remote_apply"),
    ] {
        let (role, schema) = role_committing_with(&rt, &admin, "sc", default);
        let role_url = format!("{} user={role}", url());
        // The role's default is what a plain session of it gets.
        let plain = rt.block_on(outside(&role_url));
        let setting: String = rt
            .block_on(plain.query_one("SHOW synchronous_commit", &[]))
            .unwrap()
            .get(0);
        assert_eq!(setting, default);
        let store = Store::builder()
            .schema(schema.clone())
            .connect(&role_url)
            .unwrap();
        rt.block_on(admin.batch_execute(&format!(
            "CREATE TABLE {schema}.seen (setting text NOT NULL);
             CREATE FUNCTION {schema}.note() RETURNS trigger SECURITY DEFINER
                 LANGUAGE plpgsql AS $$
                 BEGIN
                     INSERT INTO {schema}.seen VALUES (current_setting('synchronous_commit'));
                     RETURN NULL;
                 END $$;
             CREATE TRIGGER note AFTER INSERT OR UPDATE OR DELETE ON {schema}.records
                 FOR EACH ROW EXECUTE FUNCTION {schema}.note();"
        )))
        .unwrap();
        let fp = Fingerprint::of(b"pay");
        for i in 0..8 {
            let t = acquired(store.claim(&scope(), &format!("k{i}"), fp));
            if i % 2 == 0 {
                store.complete(t, Response::new(201, "ok")).unwrap();
            } else {
                store.release(t).unwrap();
            }
        }
        let seen: Vec<String> = rt
            .block_on(admin.query(&format!("SELECT setting FROM {schema}.seen"), &[]))
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(seen.len(), 16, "a claim and an end for each of 8 keys");
        assert!(
            seen.iter().all(|s| s == expected),
            "role default {default}: the store's sessions ran with {seen:?}"
        );
        drop(store);
        drop(plain);
        rt.block_on(admin.batch_execute(&format!(
            "DROP SCHEMA {schema} CASCADE; REVOKE CREATE ON DATABASE idem FROM {role};
             DROP ROLE {role};"
        )))
        .unwrap();
    }
}

/// Behind a transaction pooler the store may not set its sessions' `synchronous_commit` (a
/// `SET` would stay on a server session other clients then use, and the store's next
/// transaction may run on another one). A role whose sessions would commit without waiting
/// for the WAL is refused at connect, with the setting to make; nothing is created.
#[test]
fn behind_a_transaction_pooler_a_role_without_durable_commits_is_refused() {
    let _shared = SERVER.read().unwrap_or_else(|e| e.into_inner());
    let _grants = DATABASE_GRANTS.lock().unwrap_or_else(|e| e.into_inner());
    let rt = runtime();
    let admin = rt.block_on(outside(&url()));
    for default in ["off", "local", "remote_write", "on", "remote_apply"] {
        let (role, schema) = role_committing_with(&rt, &admin, "pooled", default);
        let result = Store::builder()
            .schema(schema.clone())
            .connect(&format!("{} user={role} pool_mode=transaction", url()));
        let made: i64 = rt
            .block_on(admin.query_one(
                "SELECT count(*) FROM pg_namespace WHERE nspname = $1",
                &[&schema],
            ))
            .unwrap()
            .get(0);
        match (default, result) {
            ("on" | "remote_apply", Ok(store)) => {
                let t = acquired(store.claim(&scope(), "k", Fingerprint::of(b"pay")));
                store.complete(t, Response::new(201, "ok")).unwrap();
                assert_eq!(made, 1);
            }
            (_, Err(idemdb::Error::Database { reason, .. })) => {
                assert!(
                    reason.contains(&format!("synchronous_commit = {default}"))
                        && reason.contains("ALTER ROLE"),
                    "{reason}"
                );
                assert_eq!(made, 0, "a refused connect made the schema");
            }
            (_, other) => panic!("role default {default}: {other:?}"),
        }
        rt.block_on(admin.batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; REVOKE CREATE ON DATABASE idem FROM {role};
             DROP ROLE {role};"
        )))
        .unwrap();
    }
}

/// With `fsync = off` a crash of the server loses commits it acknowledged, so the store refuses
/// such a server: at connect, and on a connection it opens later (the server may have been
/// reconfigured, or a failover reached another). Nothing is written meanwhile, and once the
/// server is durable again the same store serves.
#[test]
fn a_server_with_fsync_off_is_refused_on_every_connection() {
    let _alone = SERVER.write().unwrap_or_else(|e| e.into_inner());
    let rt = runtime();
    let admin = rt.block_on(outside(&url()));
    let schema = schema("fsync");
    let set_fsync = |value: &str| {
        // ALTER SYSTEM refuses to run in a transaction block: two round trips.
        rt.block_on(admin.batch_execute(&format!("ALTER SYSTEM SET fsync = {value}")))
            .unwrap();
        rt.block_on(admin.batch_execute("SELECT pg_reload_conf()"))
            .unwrap();
        // A reload reaches new sessions at once, but give the postmaster a moment.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let probe = rt.block_on(outside(&url()));
            let now: String = rt
                .block_on(probe.query_one("SHOW fsync", &[]))
                .unwrap()
                .get(0);
            if now == value {
                return;
            }
            assert!(Instant::now() < deadline, "fsync did not become {value}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let store = Store::builder()
        .schema(schema.clone())
        .pool_size(1)
        .connect(&url())
        .unwrap();
    let fp = Fingerprint::of(b"pay");
    std::mem::forget(acquired(store.claim(&scope(), "before", fp)));

    set_fsync("off");
    let refused = Store::builder().schema(schema.clone()).connect(&url());
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        match refused {
            Err(Error::Database { reason, .. }) => assert!(reason.contains("fsync"), "{reason}"),
            other => panic!("connect to a server with fsync = off: {other:?}"),
        }
        // The connected store's session ends; the connection that replaces it is refused.
        rt.block_on(admin.batch_execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
        ))
        .unwrap();
        let mut refused_claims = 0;
        for i in 0..3 {
            match store.claim(&scope(), &format!("during-{i}"), fp) {
                Err(Error::Database { reason, .. }) if reason.contains("fsync") => {
                    refused_claims += 1
                }
                // The first use may find the terminated session and fail on it.
                Err(Error::Database { .. }) => {}
                other => panic!("a claim while fsync = off: {other:?}"),
            }
        }
        assert!(
            refused_claims >= 2,
            "{refused_claims} claims refused for fsync"
        );
    }));
    // Whatever happened, the server is made durable again for every other test.
    let admin = rt.block_on(outside(&url()));
    rt.block_on(admin.batch_execute("ALTER SYSTEM RESET fsync"))
        .unwrap();
    rt.block_on(admin.batch_execute("SELECT pg_reload_conf()"))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while rt
        .block_on(rt.block_on(outside(&url())).query_one("SHOW fsync", &[]))
        .unwrap()
        .get::<_, String>(0)
        != "on"
    {
        assert!(Instant::now() < deadline, "fsync did not come back on");
        std::thread::sleep(Duration::from_millis(20));
    }
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
    let written: i64 = rt
        .block_on(admin.query_one(
            &format!("SELECT count(*) FROM {schema}.records WHERE key LIKE 'during-%'"),
            &[],
        ))
        .unwrap()
        .get(0);
    assert_eq!(
        written, 0,
        "nothing is written through a refused connection"
    );
    std::mem::forget(acquired(store.claim(&scope(), "after", fp)));
    drop(store);
    rt.block_on(admin.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")))
        .unwrap();
}

/// Two claims that share a statement lock their rows in key order; a session elsewhere that
/// locks them in the other order deadlocks with it. PostgreSQL undoes the store's statement
/// (the one whose deadlock check runs first), and the store runs it again: both claims are
/// made, and the caller never sees the deadlock.
#[test]
fn a_claim_statement_undone_by_a_deadlock_runs_again() {
    let _shared = SERVER.read().unwrap_or_else(|e| e.into_inner());
    let rt = runtime();
    let schema = schema("deadlock");
    let clock = ManualClock::new();
    let store = Arc::new(
        Store::builder()
            .schema(schema.clone())
            .pool_size(1)
            .ttl(Duration::from_secs(10))
            .clock(clock.clone())
            .connect(&url())
            .unwrap(),
    );
    let fp = Fingerprint::of(b"pay");
    // Three completed records, then their TTL runs out: each is claimable, by an update.
    for key in ["dl-a", "dl-b", "dl-c"] {
        let t = acquired(store.claim(&scope(), key, fp));
        store.complete(t, Response::new(200, "old")).unwrap();
    }
    clock.advance(Duration::from_secs(11));

    rt.block_on(async {
        let observer = outside(&url()).await;
        let before = deadlocks(&observer).await;
        let other = outside(&url()).await;
        // The other session finds its deadlocks late, so that the store's statement is the
        // one PostgreSQL undoes.
        other
            .batch_execute(&format!(
                "SET deadlock_timeout = '20s'; BEGIN;
                 SELECT 1 FROM {schema}.records WHERE key = 'dl-b' FOR UPDATE;
                 SAVEPOINT c;
                 SELECT 1 FROM {schema}.records WHERE key = 'dl-c' FOR UPDATE;"
            ))
            .await
            .unwrap();
        // The store's one connection waits for dl-c, so the claims of dl-a and dl-b queue up
        // behind it and share the next statement.
        let claim = |key: &'static str| {
            let store = Arc::clone(&store);
            tokio::spawn(async move { store.claim_async(&scope(), key, fp).await })
        };
        let first = claim("dl-c");
        until_a_store_statement_waits(&observer, &schema).await;
        let (a, b) = (claim("dl-a"), claim("dl-b"));
        tokio::time::sleep(Duration::from_millis(200)).await;
        // dl-c is let go; the pair's statement locks dl-a, then waits for dl-b.
        other
            .batch_execute("ROLLBACK TO SAVEPOINT c")
            .await
            .unwrap();
        let first = first.await.unwrap();
        until_a_store_statement_waits(&observer, &schema).await;
        // Now the other session asks for dl-a: a cycle. The store's session finds it after
        // its deadlock_timeout (1 s), its statement is undone, and this lock is granted.
        other
            .batch_execute(&format!(
                "SELECT 1 FROM {schema}.records WHERE key = 'dl-a' FOR UPDATE"
            ))
            .await
            .unwrap();
        // The statement runs again and waits for this session, which lets everything go.
        until_a_store_statement_waits(&observer, &schema).await;
        other.batch_execute("ROLLBACK").await.unwrap();
        let (a, b) = (a.await.unwrap(), b.await.unwrap());
        for (key, claim) in [("dl-c", first), ("dl-a", a), ("dl-b", b)] {
            match claim {
                Ok(Claim::Acquired(t)) => std::mem::forget(t),
                other => panic!("{key}: {other:?}"),
            }
        }
        // The statistics collector reports with a small delay.
        let deadline = Instant::now() + Duration::from_secs(5);
        while deadlocks(&observer).await == before {
            assert!(Instant::now() < deadline, "no deadlock happened");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        observer
            .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .await
            .unwrap();
    });
}

/// A claim statement draws its fence, then waits for a row another session holds; meanwhile
/// that session gives the key a newer claim (a greater fence) whose lease has run out too. The
/// waiting statement must not take the key over with its older, smaller fence: fences of one
/// key only grow, or a holder fenced out could write again. The store claims the key with a
/// fresh fence instead, a takeover of the newer claim.
#[test]
fn a_claim_that_waited_never_takes_a_key_with_an_older_fence() {
    let _shared = SERVER.read().unwrap_or_else(|e| e.into_inner());
    let rt = runtime();
    let schema = schema("fence");
    let clock = ManualClock::new();
    let store = Store::builder()
        .schema(schema.clone())
        .lease(Duration::from_secs(30))
        .clock(clock.clone())
        .connect(&url())
        .unwrap();
    let fp = Fingerprint::of(b"pay");
    let abandoned = acquired(store.claim(&scope(), "f-key", fp));
    std::mem::forget(abandoned); // its process died
    clock.advance(Duration::from_secs(31));

    rt.block_on(async {
        let observer = outside(&url()).await;
        let other = outside(&url()).await;
        other
            .batch_execute(&format!(
                "BEGIN; SELECT 1 FROM {schema}.records WHERE key = 'f-key' FOR UPDATE"
            ))
            .await
            .unwrap();
        let scope = scope();
        let claim = store.claim_async(&scope, "f-key", fp);
        let driving = async {
            until_a_store_statement_waits(&observer, &schema).await;
            // The store's statement has drawn its fence; a newer claim draws a greater one.
            let newer: i64 = other
                .query_one(
                    &format!(
                        "UPDATE {schema}.records SET fence = nextval('{schema}.fences')
                         WHERE key = 'f-key' RETURNING fence"
                    ),
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            other.batch_execute("COMMIT").await.unwrap();
            newer
        };
        let (claim, newer) = tokio::join!(claim, driving);
        let ticket = match claim {
            Ok(Claim::Acquired(t)) => t,
            other => panic!("{other:?}"),
        };
        let newer = u64::try_from(newer).unwrap();
        assert!(
            ticket.fence() > newer,
            "fence {} after a claim with fence {newer}",
            ticket.fence()
        );
        assert_eq!(
            ticket.takeover().map(|t| t.previous_fence),
            Some(newer),
            "the claim took over the newer claim, not the one it first saw"
        );
        std::mem::forget(ticket);
        observer
            .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .await
            .unwrap();
    });
}

/// A claim statement stuck behind a row lock (another session's open transaction) holds one
/// connection; the store's other work goes on meanwhile, on its other connections, instead of
/// queueing behind it until the lock goes.
#[test]
fn a_claim_stuck_behind_a_row_lock_does_not_stall_other_keys() {
    let _shared = SERVER.read().unwrap_or_else(|e| e.into_inner());
    let rt = runtime();
    let schema = schema("stuck");
    let clock = ManualClock::new();
    let store = Arc::new(
        Store::builder()
            .schema(schema.clone())
            .ttl(Duration::from_secs(10))
            .clock(clock.clone())
            .connect(&url())
            .unwrap(),
    );
    let fp = Fingerprint::of(b"pay");
    let t = acquired(store.claim(&scope(), "stuck", fp));
    store.complete(t, Response::new(200, "old")).unwrap();
    clock.advance(Duration::from_secs(11));
    rt.block_on(async {
        let observer = outside(&url()).await;
        let other = outside(&url()).await;
        other
            .batch_execute(&format!(
                "BEGIN; SELECT 1 FROM {schema}.records WHERE key = 'stuck' FOR UPDATE"
            ))
            .await
            .unwrap();
        let stuck = {
            let store = Arc::clone(&store);
            tokio::spawn(async move { store.claim_async(&scope(), "stuck", fp).await })
        };
        until_a_store_statement_waits(&observer, &schema).await;
        let scope = scope();
        for i in 0..20 {
            let key = format!("free-{i}");
            let claim = store.claim_async(&scope, &key, fp);
            match tokio::time::timeout(Duration::from_secs(5), claim).await {
                Ok(Ok(Claim::Acquired(t))) => std::mem::forget(t),
                Ok(other) => panic!("free-{i}: {other:?}"),
                Err(_) => panic!("free-{i} waited for the stuck statement"),
            }
        }
        assert!(!stuck.is_finished());
        other.batch_execute("ROLLBACK").await.unwrap();
        match stuck.await.unwrap() {
            Ok(Claim::Acquired(t)) => std::mem::forget(t),
            other => panic!("stuck: {other:?}"),
        }
        observer
            .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .await
            .unwrap();
    });
}

/// The sessions of the store whose tables are in `schema` (their last statement names it).
fn sessions_of(schema: &str) -> String {
    format!(
        "SELECT pid FROM pg_stat_activity
         WHERE pid <> pg_backend_pid() AND query LIKE '%\"{schema}\".%'"
    )
}

/// Asks the server to end those sessions (it does so asynchronously); how many it was asked to.
async fn end_sessions_of(admin: &Client, schema: &str) -> i64 {
    let sessions = sessions_of(schema);
    admin
        .query_one(
            &format!("SELECT count(pg_terminate_backend(pid)) FROM ({sessions}) s"),
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// A blocking caller alone runs its statement on a connection its own thread drives (the
/// direct lane), and that connection's task only runs while a caller is inside it. A session
/// the server ended while the lane sat idle (an idle timeout, a restart, a failover) must be
/// seen as closed and replaced before the next statement, not fail that caller's claim.
#[test]
fn a_lane_connection_the_server_closed_while_idle_is_replaced_before_use() {
    let _shared = SERVER.read().unwrap_or_else(|e| e.into_inner());
    let rt = runtime();
    let schema = schema("lane_closed");
    let store = Store::builder()
        .schema(schema.clone())
        .pool_size(1)
        .connect(&url())
        .unwrap();
    let fp = Fingerprint::of(b"pay");
    let t = acquired(store.claim(&scope(), "first", fp));
    store.complete(t, Response::new(201, "charged")).unwrap();

    let admin = rt.block_on(outside(&url()));
    let ended = rt.block_on(end_sessions_of(&admin, &schema));
    assert!(ended >= 1, "no session of the store to end");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !rt
        .block_on(admin.query(&sessions_of(&schema), &[]))
        .unwrap()
        .is_empty()
    {
        assert!(Instant::now() < deadline, "the ended sessions did not go");
        std::thread::sleep(Duration::from_millis(10));
    }

    for i in 0..3 {
        let t = acquired(store.claim(&scope(), &format!("after-{i}"), fp));
        store.complete(t, Response::new(201, "charged")).unwrap();
    }
    match store.claim(&scope(), "first", fp) {
        Ok(Claim::Replay(r)) => assert_eq!(r.body(), b"charged"),
        other => panic!("the record made before the sessions ended: {other:?}"),
    }
    drop(store);
    rt.block_on(admin.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")))
        .unwrap();
}

/// A server that ends a session answers the statement in flight with a `FATAL` error and then
/// closes the socket. The next statement used to be sent on that connection before its close
/// was read, and failed with "connection closed": two callers failed for one ended session (a
/// third of the runs of the `fsync` test above). A `FATAL` answer now retires the connection at
/// once, so only the statement the server ended fails.
#[test]
fn a_session_the_server_ends_fails_at_most_the_statement_it_was_sent() {
    let _shared = SERVER.read().unwrap_or_else(|e| e.into_inner());
    let rt = runtime();
    let schema = schema("session_ended");
    let store = Store::builder()
        .schema(schema.clone())
        .connect(&url())
        .unwrap();
    let fp = Fingerprint::of(b"pay");
    let admin = rt.block_on(outside(&url()));
    for round in 0..50 {
        std::mem::forget(acquired(store.claim(
            &scope(),
            &format!("live-{round}"),
            fp,
        )));
        rt.block_on(end_sessions_of(&admin, &schema));
        // Sent while the session ends: it may fail.
        match store.claim(&scope(), &format!("ending-{round}"), fp) {
            Ok(Claim::Acquired(t)) => std::mem::forget(t),
            Err(Error::Database { .. }) => {}
            other => panic!("round {round}: {other:?}"),
        }
        // Sent after the failure was answered: on a new connection.
        match store.claim(&scope(), &format!("after-{round}"), fp) {
            Ok(Claim::Acquired(t)) => std::mem::forget(t),
            other => panic!("round {round}, the claim after the ended session: {other:?}"),
        }
    }
    drop(store);
    rt.block_on(admin.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")))
        .unwrap();
}

/// The statements of reads and maintenance (a get, a count, a reap, a purge, a scan) run on the
/// pooled connections as tasks. They used to run on the driver directly, so a `FATAL` answer did
/// not retire the connection as it does on the claim path, and the next task could be sent on
/// the ended session before its close was read, failing a second caller for one ended session.
#[test]
fn a_session_the_server_ends_fails_at_most_the_task_it_was_sent() {
    let _shared = SERVER.read().unwrap_or_else(|e| e.into_inner());
    let rt = runtime();
    let schema = schema("session_ended_tasks");
    let store = Store::builder()
        .schema(schema.clone())
        .pool_size(1)
        .connect(&url())
        .unwrap();
    let fp = Fingerprint::of(b"pay");
    let t = acquired(store.claim(&scope(), "done", fp));
    store.complete(t, Response::new(201, "charged")).unwrap();
    let admin = rt.block_on(outside(&url()));
    for round in 0..30 {
        // A task first, so that the pooled session's last statement names the schema.
        store.record_count().unwrap();
        rt.block_on(end_sessions_of(&admin, &schema));
        // Sent while the session ends: it may fail.
        let _ = store.record_count();
        // Sent after that failure was answered: on a new connection, every kind of task.
        let after =
            |what: &str, ok: bool| assert!(ok, "round {round}: {what} after the ended session");
        after("count", store.record_count().is_ok());
        after("get", matches!(store.get(&scope(), "done"), Ok(Some(_))));
        after("reap", store.reap(|_| idemdb::Resolution::Keep).is_ok());
        after("purge", store.purge_expired().is_ok());
        after("scan", store.list(&idemdb::Query::all()).is_ok());
    }
    drop(store);
    rt.block_on(admin.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")))
        .unwrap();
}
