//! Every statement the PostgreSQL engine sends, with the schema they run on. `{s}` stands for
//! the store's schema, quoted; `docs/postgres.md` argues why each statement is atomic.
//!
//! Times are milliseconds since the Unix epoch by the database's clock:
//! `statement_timestamp()`, fixed for the whole statement. `$1` overrides it with the time of a
//! clock injected for tests (`NULL` otherwise; see `docs/postgres.md`, "Whose clock").
//!
//! A statement that finds rows by key says "in progress" as `expires_at IS NULL` (the same
//! thing, by the table's first `CHECK`), never `NOT completed`: that would let the planner
//! answer it from `records_in_progress`, whose rows it may believe few, and a plan cached on
//! that belief scans every claim in progress for each key (`plans.rs`).

/// The schema version this library writes and reads. A schema recorded with a higher version
/// was made by a newer idemdb and is refused.
pub(crate) const SCHEMA_VERSION: i32 = 2;

/// The statement's time in milliseconds: the database's, unless `$1` gives a test clock's.
macro_rules! now_ms {
    () => {
        "coalesce($1::bigint, (extract(epoch FROM statement_timestamp()) * 1000)::bigint)"
    };
}

/// The bytes a record counts for: its key's columns, fingerprint, headers and body, plus 48 for
/// its fence and times (`$r` a row of `records`). What `max_store_bytes` bounds on PostgreSQL.
macro_rules! record_bytes {
    ($r:literal) => {
        concat!(
            "48 + octet_length(",
            $r,
            ".tenant) + octet_length(",
            $r,
            ".endpoint) + octet_length(",
            $r,
            ".key) + octet_length(",
            $r,
            ".fingerprint) + coalesce(octet_length(",
            $r,
            ".headers), 0) + coalesce(octet_length(",
            $r,
            ".body), 0)"
        )
    };
}

/// The end of a counting trigger's function: adds the changes `d` (tenant, records `n`,
/// bytes `b`) to the session's slot of `usage` and `usage_total`.
macro_rules! add_to_usage {
    () => {
        r#"
    , total AS (INSERT INTO {s}.usage_total AS u (slot, records, bytes)
        SELECT pg_backend_pid() % 64, sum(n), sum(b) FROM d HAVING count(*) > 0
        ON CONFLICT (slot) DO UPDATE SET records = u.records + excluded.records,
            bytes = u.bytes + excluded.bytes)
    INSERT INTO {s}.usage AS u (tenant, slot, records, bytes)
        SELECT tenant, pg_backend_pid() % 64, n, b FROM d
        ON CONFLICT (tenant, slot) DO UPDATE SET records = u.records + excluded.records,
            bytes = u.bytes + excluded.bytes;
    RETURN NULL;
END $f$;"#
    };
}

/// What a completion sets besides the response (after `WITH t AS (SELECT .. AS now)`; `$9` TTL in
/// ms).
macro_rules! complete_set {
    () => {
        "UPDATE {s}.records r SET completed = true, completed_at = t.now, \
         expires_at = t.now + $9::bigint, \
         lease_until = NULL, owner = NULL, incarnation = NULL, orphan = false,\n"
    };
}

/// Creates what is missing of schema version 1. Idempotent; run under the migration lock.
///
/// - `records`: one row per live (tenant, endpoint, key). A row is in progress
///   (`completed = false`: `lease_until`, `owner`, `incarnation`, `orphan`) or completed
///   (`expires_at`, `status`, `headers`, `body`). The `replaced_*` columns describe the claim a
///   row's current claim replaced, so that one statement can return it.
/// - `fences`: the fencing counter shared by every replica; `nextval` never goes back.
/// - `incarnations`: one number per connected `Store`, so a restarted replica knows its
///   earlier claims (same owner, smaller incarnation) as orphans. Each number is written to
///   `meta.last_incarnation` by a committed update, so that a crash of the server cannot hand
///   it out again (a sequence's advance is only durable with a commit that wrote).
pub(crate) const CREATE: &str = r#"
CREATE TABLE IF NOT EXISTS {s}.meta (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    schema_version integer NOT NULL,
    last_incarnation bigint NOT NULL DEFAULT 0
);
CREATE SEQUENCE IF NOT EXISTS {s}.fences AS bigint MINVALUE 1 NO CYCLE;
CREATE SEQUENCE IF NOT EXISTS {s}.incarnations AS bigint MINVALUE 1 NO CYCLE;
CREATE TABLE IF NOT EXISTS {s}.records (
    tenant bytea NOT NULL,
    endpoint bytea NOT NULL,
    key text NOT NULL,
    fence bigint NOT NULL,
    fingerprint bytea NOT NULL,
    claimed_at bigint NOT NULL,
    completed boolean NOT NULL DEFAULT false,
    lease_until bigint,
    owner text,
    incarnation bigint,
    orphan boolean NOT NULL DEFAULT false,
    completed_at bigint,
    expires_at bigint,
    status integer,
    headers bytea,
    body bytea,
    replaced_fence bigint,
    replaced_claimed_at bigint,
    replaced_orphan boolean,
    replaced_in_progress boolean,
    PRIMARY KEY (tenant, endpoint, key),
    CHECK (completed = (expires_at IS NOT NULL)),
    CHECK (completed OR lease_until IS NOT NULL)
);
CREATE INDEX IF NOT EXISTS records_expiry ON {s}.records (expires_at) WHERE completed;
CREATE INDEX IF NOT EXISTS records_in_progress ON {s}.records (fence) WHERE NOT completed;
INSERT INTO {s}.meta (schema_version) VALUES (2) ON CONFLICT DO NOTHING;
"#;

/// Creates what is missing of schema version 2: what counting the records needs (the counting
/// itself is [`COUNT_RECORDS`], made only for a store with bounds). Idempotent; run under the
/// migration lock, after [`CREATE`].
///
/// - `usage` and `usage_total`: records and bytes ([`record_bytes!`]), as sums of rows, one
///   per (tenant, slot) and per slot; a session adds to the slot of its backend (`pg_backend_pid()
///   % 64`), so that sessions writing at once rarely wait for each other's row lock. The
///   counts are exact once committed: each row changes only with the transaction that
///   changed the records.
/// - `count_inserted`, `count_deleted`, `count_updated`: the triggers' functions.
/// - `room(tenant, limit)`: how many more records `tenant` may hold under `limit`, under a
///   transaction-scoped advisory lock of the tenant's that the caller keeps until it commits,
///   and read with a snapshot taken after the lock (a `VOLATILE` function's query sees what
///   committed before it began): the claims of one tenant under a limit are admitted one
///   transaction at a time, each seeing the ones before.
pub(crate) const CREATE_USAGE: &str = concat!(
    r#"
CREATE TABLE IF NOT EXISTS {s}.usage (
    tenant bytea NOT NULL,
    slot integer NOT NULL,
    records bigint NOT NULL,
    bytes bigint NOT NULL,
    PRIMARY KEY (tenant, slot)
);
CREATE TABLE IF NOT EXISTS {s}.usage_total (
    slot integer PRIMARY KEY,
    records bigint NOT NULL,
    bytes bigint NOT NULL
);
CREATE OR REPLACE FUNCTION {s}.count_inserted() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $f$
BEGIN
    WITH d AS (SELECT tenant, count(*) AS n, sum("#,
    record_bytes!("n"),
    r#") AS b FROM new_rows n GROUP BY tenant)
"#,
    add_to_usage!(),
    r#"
CREATE OR REPLACE FUNCTION {s}.count_deleted() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $f$
BEGIN
    WITH d AS (SELECT tenant, -count(*) AS n, -sum("#,
    record_bytes!("o"),
    r#") AS b FROM old_rows o GROUP BY tenant)
"#,
    add_to_usage!(),
    r#"
CREATE OR REPLACE FUNCTION {s}.count_updated() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $f$
BEGIN
    WITH d AS (SELECT tenant, 0 AS n, sum(b) AS b FROM (
            SELECT tenant, "#,
    record_bytes!("n"),
    r#" AS b FROM new_rows n
            UNION ALL SELECT tenant, -("#,
    record_bytes!("o"),
    r#") FROM old_rows o) x
        GROUP BY tenant HAVING sum(b) <> 0)"#,
    add_to_usage!(),
    r#"
CREATE OR REPLACE FUNCTION {s}.room(t bytea, lim bigint) RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $f$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('idemdb room {s} ' || encode(t, 'hex'), 0));
    RETURN lim - coalesce((SELECT sum(records) FROM {s}.usage WHERE tenant = t), 0);
END $f$;
"#
);

/// Starts counting the records: the triggers of every statement that inserts, updates or
/// deletes records (whoever sends it), then the counts of what the table holds, taken once
/// (creating the triggers takes a lock that lets every statement that wrote before finish, and
/// keeps new ones waiting until this transaction commits: the count's snapshot has them all,
/// and every later change is counted). Run under the migration lock when the triggers are
/// missing.
pub(crate) const COUNT_RECORDS: &str = concat!(
    r#"
CREATE TRIGGER count_inserted AFTER INSERT ON {s}.records
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION {s}.count_inserted();
CREATE TRIGGER count_deleted AFTER DELETE ON {s}.records
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION {s}.count_deleted();
CREATE TRIGGER count_updated AFTER UPDATE ON {s}.records
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {s}.count_updated();
DELETE FROM {s}.usage;
DELETE FROM {s}.usage_total;
WITH d AS (SELECT tenant, count(*) AS n, sum("#,
    record_bytes!("r"),
    r#") AS b FROM {s}.records r GROUP BY tenant),
total AS (INSERT INTO {s}.usage_total (slot, records, bytes)
    SELECT 0, sum(n), sum(b) FROM d HAVING count(*) > 0)
INSERT INTO {s}.usage (tenant, slot, records, bytes) SELECT tenant, 0, n, b FROM d"#
);

/// The claim of distinct keys: one `INSERT .. ON CONFLICT DO UPDATE .. WHERE` takes each key
/// that is absent, expired, or (with `$7`, the take-over policy) stale with the same
/// fingerprint, and returns a row for each key it took. A key whose record, as the statement's
/// snapshot shows it, answers the claim (a live claim, a completion, another fingerprint) is
/// not even tried, so a batch of such answers takes no lock and writes nothing: its keys are
/// read afterwards by [`HELD`] (or [`GET`]), which sees the record that answers them. The write
/// decides on the newest version of the row, under its lock, so a record the snapshot did not
/// show (committed by another session meanwhile) is never overwritten by mistake: the insert
/// conflicts, its `WHERE` is false, and the key is not returned.
///
/// `excluded.fence > r.fence` keeps each key's fences growing even if this statement drew its
/// fence before the claim it replaces drew its own (a statement that waited a whole lease).
///
/// Why two statements and not one that also reads the answers: the single statement (the
/// insert in a `WITH` and an outer join for the records that answer) cost about 60 µs more
/// of the server's CPU per claim, measured with pgbench (`docs/postgres.md`), and most claims
/// are new keys, for which the read is not needed.
///
/// Parameters: `$1` test clock, `$2..$5` tenants, endpoints, keys, fingerprints, `$6`
/// lease in ms, `$7` take over stale claims, `$8` owner, `$9` incarnation. The statement over
/// the keys `$input` (a query with columns tenant, endpoint, key, fingerprint) yields.
macro_rules! claim_over {
    ($input:expr) => {
        concat!(
            r#"INSERT INTO {s}.records AS r (tenant, endpoint, key, fence, fingerprint, claimed_at,
    completed, lease_until, owner, incarnation, orphan)
SELECT i.tenant, i.endpoint, i.key, nextval('{s}.fences'), i.fingerprint, t.now,
    false, t.now + $6::bigint, $8::text, $9::bigint, false
FROM ("#,
            $input,
            ") i CROSS JOIN (SELECT ",
            now_ms!(),
            r#" AS now) t
WHERE NOT EXISTS (
    SELECT 1 FROM {s}.records h
    WHERE h.tenant = i.tenant AND h.endpoint = i.endpoint AND h.key = i.key
      AND NOT ((h.completed AND h.expires_at <= t.now)
            OR ($7::boolean AND NOT h.completed AND h.lease_until <= t.now
                AND h.fingerprint = i.fingerprint)))
ORDER BY i.tenant, i.endpoint, i.key
ON CONFLICT (tenant, endpoint, key) DO UPDATE SET
    fence = excluded.fence, fingerprint = excluded.fingerprint,
    claimed_at = excluded.claimed_at, completed = false,
    lease_until = excluded.lease_until, owner = excluded.owner,
    incarnation = excluded.incarnation, orphan = false,
    completed_at = NULL, expires_at = NULL, status = NULL, headers = NULL, body = NULL,
    replaced_fence = r.fence, replaced_claimed_at = r.claimed_at,
    replaced_orphan = r.orphan OR (r.owner = excluded.owner AND r.incarnation < excluded.incarnation),
    replaced_in_progress = NOT r.completed
WHERE excluded.fence > r.fence
  AND ((r.completed AND r.expires_at <= excluded.claimed_at)
    OR ($7::boolean AND NOT r.completed AND r.lease_until <= excluded.claimed_at
        AND r.fingerprint = excluded.fingerprint))
RETURNING r.tenant, r.endpoint, r.key, r.fence, r.claimed_at, r.lease_until,
    r.replaced_fence, r.replaced_claimed_at, r.replaced_orphan, r.replaced_in_progress"#
        )
    };
}

/// The claim of a batch of distinct keys, as arrays.
pub(crate) const CLAIM: &str = claim_over!(
    "SELECT * FROM unnest($2::bytea[], $3::bytea[], $4::text[], $5::bytea[])
        AS u(tenant, endpoint, key, fingerprint)"
);

/// [`CLAIM`] under the store's bounds (`$10` the most records per tenant, `$11` the most bytes
/// of records, each `NULL` for none): a key without a record (as the snapshot shows it) is
/// taken only if its tenant has room ([`CREATE_USAGE`]'s `room`, which holds the tenant's lock
/// until this statement commits; a tenant's new keys in one batch take its room in their
/// order) and the store's records' bytes (`usage_total`) are below `$11`. A key with a record
/// is never refused. Returns [`CLAIM`]'s rows for the keys it took, then one row per refused
/// key: its key columns, `NULL`s, and `'tenant'` or `'store'` in an eleventh column, with the
/// store's bytes in a twelfth.
pub(crate) const CLAIM_BOUNDED: &str = concat!(
    r#"WITH u AS (
    SELECT u.*, EXISTS (SELECT 1 FROM {s}.records h
            WHERE h.tenant = u.tenant AND h.endpoint = u.endpoint AND h.key = u.key) AS held
    FROM unnest($2::bytea[], $3::bytea[], $4::text[], $5::bytea[]) WITH ORDINALITY
        AS u(tenant, endpoint, key, fingerprint, ord)),
n AS (SELECT u.*, row_number() OVER (PARTITION BY u.tenant, u.held ORDER BY u.ord) AS nth FROM u),
rooms AS MATERIALIZED (SELECT tenant, {s}.room(tenant, $10::bigint) AS room
    FROM (SELECT DISTINCT tenant FROM n WHERE NOT held AND $10::bigint IS NOT NULL) d),
store AS MATERIALIZED (SELECT coalesce((SELECT sum(bytes) FROM {s}.usage_total WHERE slot >= 0), 0)::bigint
    AS bytes),
input AS MATERIALIZED (
    SELECT n.tenant, n.endpoint, n.key, n.fingerprint, store.bytes,
        CASE WHEN n.held THEN NULL
             WHEN $11::bigint IS NOT NULL AND store.bytes >= $11::bigint THEN 'store'
             WHEN n.nth > rooms.room THEN 'tenant' END AS refused
    FROM n CROSS JOIN store LEFT JOIN rooms ON rooms.tenant = n.tenant),
won AS ("#,
    claim_over!("SELECT * FROM input WHERE refused IS NULL"),
    r#")
SELECT won.*, NULL::text, NULL::bigint FROM won
UNION ALL
SELECT tenant, endpoint, key, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint,
    NULL::bigint, NULL::boolean, NULL::boolean, refused, bytes
FROM input WHERE refused IS NOT NULL"#
);

/// [`CLAIM`] for one key, with scalar parameters: the same statement, planned for one row
/// (a lone caller's claim is most of what a quiet store sends).
pub(crate) const CLAIM_ONE: &str = claim_over!(
    "SELECT $2::bytea AS tenant, $3::bytea AS endpoint, $4::text AS key,
        $5::bytea AS fingerprint"
);

/// A lone claim's first try: the insert of a key that has no record, nothing else. Most claims
/// are of new keys, and this is the cheapest statement that takes one: about 30 µs less of
/// the server's CPU than [`CLAIM_ONE`] (pgbench, `docs/postgres.md`), which also weighs the
/// record it finds. A key that has one is not returned; the caller reads the record ([`GET`])
/// and, if it is claimable (expired, or stale under the take-over policy), claims it with
/// [`CLAIM_ONE`]. Returns the new claim's fence and time (its lease ends `$6` later): the rest
/// the caller knows (each returned column costs the server a few µs, measured).
///
/// Parameters: `$1` test clock, `$2..$5` tenant, endpoint, key, fingerprint, `$6` lease in
/// ms, `$7` owner, `$8` incarnation.
pub(crate) const CLAIM_NEW: &str = concat!(
    r#"INSERT INTO {s}.records AS r (tenant, endpoint, key, fence, fingerprint, claimed_at,
    completed, lease_until, owner, incarnation, orphan)
VALUES ($2, $3, $4, nextval('{s}.fences'), $5, "#,
    now_ms!(),
    ", false, ",
    now_ms!(),
    r#" + $6::bigint, $7::text, $8::bigint, false)
ON CONFLICT (tenant, endpoint, key) DO NOTHING
RETURNING r.fence, r.claimed_at"#
);

/// Completes a batch of claims, each only if its fence still holds the key in progress.
/// `$1` test clock, `$2..$8` tenants, endpoints, keys, fences, statuses, headers, bodies, `$9`
/// TTL in ms.
pub(crate) const COMPLETE: &str = concat!(
    "WITH t AS (SELECT ",
    now_ms!(),
    " AS now)\n",
    complete_set!(),
    r#"    status = u.status, headers = u.headers, body = u.body
FROM t, unnest($2::bytea[], $3::bytea[], $4::text[], $5::bigint[], $6::int[], $7::bytea[], $8::bytea[])
    AS u(tenant, endpoint, key, fence, status, headers, body)
WHERE r.tenant = u.tenant AND r.endpoint = u.endpoint AND r.key = u.key
    AND r.fence = u.fence AND r.expires_at IS NULL
RETURNING r.fence, r.expires_at"#
);

/// [`COMPLETE`] for one claim, with scalar parameters: `$1` test clock, `$2..$8` tenant,
/// endpoint, key, fence, status, headers, body, `$9` TTL in ms.
pub(crate) const COMPLETE_ONE: &str = concat!(
    "WITH t AS (SELECT ",
    now_ms!(),
    " AS now)\n",
    complete_set!(),
    r#"    status = $6::int, headers = $7::bytea, body = $8::bytea
FROM t
WHERE r.tenant = $2::bytea AND r.endpoint = $3::bytea AND r.key = $4::text
    AND r.fence = $5::bigint AND r.expires_at IS NULL
RETURNING r.fence, r.expires_at"#
);

/// Deletes a batch of claims, each only if its fence still holds the key in progress (a
/// release, or the withdrawal of a fresh claim nobody received). `$1..$4` tenants, endpoints,
/// keys, fences.
pub(crate) const RELEASE: &str = r#"
DELETE FROM {s}.records r
USING unnest($1::bytea[], $2::bytea[], $3::text[], $4::bigint[]) AS u(tenant, endpoint, key, fence)
WHERE r.tenant = u.tenant AND r.endpoint = u.endpoint AND r.key = u.key
    AND r.fence = u.fence AND r.expires_at IS NULL
RETURNING r.fence"#;

/// Renews a batch of leases to run until now plus each one's `by`; `$6` marks them orphans
/// and is used with a zero `by` to end a lease at once (a withdrawn takeover). `$1`
/// test clock, `$2..$5` tenants, endpoints, keys, fences, `$6` orphan, `$7` by in ms.
pub(crate) const EXTEND: &str = concat!(
    "WITH t AS (SELECT ",
    now_ms!(),
    r#" AS now)
UPDATE {s}.records r SET lease_until = t.now + u.by, orphan = r.orphan OR $6::boolean
FROM t, unnest($2::bytea[], $3::bytea[], $4::text[], $5::bigint[], $7::bigint[])
    AS u(tenant, endpoint, key, fence, by)
WHERE r.tenant = u.tenant AND r.endpoint = u.endpoint AND r.key = u.key
    AND r.fence = u.fence AND r.expires_at IS NULL
RETURNING r.fence, r.lease_until"#
);

/// Marks claims whose tickets were dropped unspent as orphans. `$1..$4` tenants, endpoints,
/// keys, fences.
pub(crate) const ABANDON: &str = r#"
UPDATE {s}.records r SET orphan = true
FROM unnest($1::bytea[], $2::bytea[], $3::text[], $4::bigint[]) AS u(tenant, endpoint, key, fence)
WHERE r.tenant = u.tenant AND r.endpoint = u.endpoint AND r.key = u.key
    AND r.fence = u.fence AND r.expires_at IS NULL
RETURNING r.fence"#;

/// The columns [`GET`] and [`HELD`] read: the database's time, then the record `r` (all
/// `NULL` when the key has none). `$1` test clock, `$5` owner, `$6` incarnation.
macro_rules! record_columns {
    () => {
        concat!(
            "SELECT ",
            now_ms!(),
            r#", r.fence, r.fingerprint, r.claimed_at, r.completed, r.lease_until, r.expires_at,
    r.orphan OR (r.owner = $5::text AND r.incarnation < $6::bigint),
    r.status, r.headers, r.body
"#
        )
    };
}

/// One record as `get`, `wait` and a claim that did not take its key see it, with the
/// database's time. `$2..$4` tenant, endpoint, key; the rest as [`record_columns`].
pub(crate) const GET: &str = concat!(
    record_columns!(),
    r#"FROM (SELECT 1) one
LEFT JOIN {s}.records r ON r.tenant = $2 AND r.endpoint = $3 AND r.key = $4"#
);

/// [`GET`] for a batch of keys, as arrays: one row per key, in the arrays' order.
pub(crate) const HELD: &str = concat!(
    record_columns!(),
    r#"FROM unnest($2::bytea[], $3::bytea[], $4::text[]) WITH ORDINALITY AS i(tenant, endpoint, key, ord)
LEFT JOIN {s}.records r ON r.tenant = i.tenant AND r.endpoint = i.endpoint AND r.key = i.key
ORDER BY i.ord"#
);

/// The stale claims a reap offers: leases run out, orphans marked by a dropped ticket, and
/// this owner's claims from earlier incarnations. At most `$4` rows past fence `$5`.
/// `$1` test clock, `$2` owner, `$3` incarnation.
pub(crate) const STALE: &str = concat!(
    "WITH t AS (SELECT ",
    now_ms!(),
    r#" AS now)
SELECT r.tenant, r.endpoint, r.key, r.fence, r.fingerprint, r.claimed_at, r.lease_until,
    r.orphan OR (r.owner = $2::text AND r.incarnation < $3::bigint)
FROM {s}.records r, t
WHERE NOT r.completed AND r.fence > $5::bigint AND (r.lease_until <= t.now OR r.orphan
    OR (r.owner = $2::text AND r.incarnation < $3::bigint))
ORDER BY r.fence
LIMIT $4"#
);

/// A reap's release: only the claim the resolver saw (same fence and lease, still in
/// progress). `$1..$3` tenant, endpoint, key, `$4` fence, `$5` lease it had.
pub(crate) const REAP_RELEASE: &str = r#"
DELETE FROM {s}.records r
WHERE r.tenant = $1 AND r.endpoint = $2 AND r.key = $3 AND r.fence = $4
    AND r.expires_at IS NULL AND r.lease_until = $5"#;

/// A reap's completion, under the same condition as [`REAP_RELEASE`]. `$1` test clock, `$2..$4`
/// tenant, endpoint, key, `$5` fence, `$6` lease it had, `$7..$9` status, headers, body, `$10`
/// TTL in ms.
pub(crate) const REAP_COMPLETE: &str = concat!(
    "WITH t AS (SELECT ",
    now_ms!(),
    r#" AS now)
UPDATE {s}.records r SET completed = true, completed_at = t.now, expires_at = t.now + $10::bigint,
    lease_until = NULL, owner = NULL, incarnation = NULL, orphan = false,
    status = $7, headers = $8, body = $9
FROM t
WHERE r.tenant = $2 AND r.endpoint = $3 AND r.key = $4 AND r.fence = $5
    AND r.expires_at IS NULL AND r.lease_until = $6"#
);

/// Deletes up to `$2` expired records, oldest first, skipping rows another session holds.
/// `$1` test clock.
pub(crate) const PURGE: &str = concat!(
    "WITH t AS (SELECT ",
    now_ms!(),
    r#" AS now),
due AS (
    SELECT r.tenant, r.endpoint, r.key, r.fence FROM {s}.records r, t
    WHERE r.completed AND r.expires_at <= t.now
    ORDER BY r.expires_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
DELETE FROM {s}.records r USING due, t
WHERE r.tenant = due.tenant AND r.endpoint = due.endpoint AND r.key = due.key
    AND r.fence = due.fence AND r.completed AND r.expires_at <= t.now"#
);

/// The number of records, expired ones not yet purged included (as the file engine's index
/// counts them). A count: O(records), for `stats`, which operators call now and then.
/// The records, as counted by [`COUNT_RECORDS`]'s triggers (at most 64 rows read), or by a
/// pass over the table where nothing counts them.
pub(crate) const COUNT: &str = "SELECT CASE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_trigger
        WHERE tgrelid = '{s}.records'::regclass AND tgname = 'count_inserted')
    THEN (SELECT coalesce(sum(records), 0) FROM {s}.usage_total WHERE slot >= 0)
    ELSE (SELECT count(*) FROM {s}.records) END::bigint";

/// Whether the records are counted ([`COUNT_RECORDS`] ran).
pub(crate) const COUNTED: &str = "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger
    WHERE tgrelid = '{s}.records'::regclass AND tgname = 'count_inserted')";

/// A census in the database (one pass over the table; no row leaves the server): per tenant
/// and status, the records, their bodies' bytes and the highest fence. The status is the index
/// in `RecordStatus::ALL`, the CASE `Entry::status_at`. `$1` test clock.
pub(crate) const CENSUS: &str = r#"
WITH t AS (SELECT coalesce($1::bigint, (extract(epoch FROM statement_timestamp()) * 1000)::bigint) AS now)
SELECT r.tenant,
    (CASE WHEN r.completed AND r.expires_at > t.now THEN 3
          WHEN r.completed THEN 4
          WHEN r.orphan THEN 2
          WHEN r.lease_until <= t.now THEN 1
          ELSE 0 END)::int AS status,
    count(*)::bigint, coalesce(sum(length(r.body)), 0)::bigint, max(r.fence)
FROM {s}.records r, t
GROUP BY 1, 2"#;

/// The claim not finished that was made first (ties: the lower fence).
pub(crate) const OLDEST_CLAIM: &str = "SELECT tenant, endpoint, key, fence, claimed_at \
    FROM {s}.records WHERE NOT completed ORDER BY claimed_at, fence LIMIT 1";

/// Takes this store's incarnation, durably (see [`CREATE`]).
pub(crate) const INCARNATION: &str =
    "UPDATE {s}.meta SET last_incarnation = nextval('{s}.incarnations') RETURNING last_incarnation";
