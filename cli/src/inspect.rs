//! Reading a store: `stats`, `list`, `get`.

use crate::open::Target;
use crate::output::{bytes, hex, relative, span, timestamp, Exit, Failure, Out, Outcome, Table};
use clap::Args;
use idemdb::{Entry, EntryState, Query, RecordStatus, Scope};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::{Instant, SystemTime};

/// `idemdb stats`.
pub(crate) fn stats(target: &Target, out: &Out) -> Outcome {
    let started = Instant::now();
    let store = target.open(out)?;
    let opened = started.elapsed();
    // On a file, a scan of every record; on PostgreSQL, counted in the database.
    let bar = out.progress("counting", None);
    let tally = store.census()?;
    bar.finish_and_clear();
    let scanned = tally.records();
    let elapsed = started.elapsed();
    let now = SystemTime::now();
    let (file, journal) = match target.path() {
        Some(path) => {
            let journal = {
                let mut name = path.as_os_str().to_owned();
                name.push("-journal");
                std::path::PathBuf::from(name)
            };
            let size = |p: &std::path::Path| std::fs::metadata(p).map(|m| m.len()).ok();
            (size(path), size(&journal))
        }
        None => (None, None),
    };
    let status_counts: Vec<(&str, u64)> = RecordStatus::ALL
        .iter()
        .zip(tally.by_status())
        .map(|(s, n)| (s.as_str(), n))
        .collect();
    if out.json {
        let tenants: Value = tally
            .by_tenant
            .iter()
            .map(|(t, counts)| {
                let by: serde_json::Map<String, Value> = RecordStatus::ALL
                    .iter()
                    .zip(counts)
                    .map(|(s, n)| (s.as_str().to_owned(), json!(n)))
                    .collect();
                (t.clone(), Value::Object(by))
            })
            .collect::<serde_json::Map<_, _>>()
            .into();
        out.json(&json!({
            "store": target.store,
            "records": scanned,
            "by_status": status_counts.iter().copied().collect::<BTreeMap<_, _>>(),
            "by_tenant": tenants,
            "highest_fence": tally.highest_fence,
            "response_bytes": tally.response_bytes,
            "file_bytes": file,
            "journal_bytes": journal,
            "oldest_claim": tally.oldest_claim.as_ref().map(|o| json!({
                "tenant": o.scope.tenant(), "endpoint": o.scope.endpoint(), "key": o.key,
                "fence": o.fence, "claimed_at": timestamp(o.claimed_at),
                "age_seconds": now.duration_since(o.claimed_at).map_or(0, |d| d.as_secs()),
            })),
            "open_seconds": opened.as_secs_f64(),
            "seconds": elapsed.as_secs_f64(),
        }));
        return Ok(());
    }
    let mut t = Table::new(&["records", "count"]);
    for (s, n) in &status_counts {
        t.row(vec![(*s).to_owned(), n.to_string()]);
    }
    t.row(vec!["total".into(), scanned.to_string()]);
    t.print();
    println!();
    let mut t = Table::new(&[
        "tenant",
        "in-progress",
        "stale",
        "orphan",
        "completed",
        "expired",
    ]);
    for (tenant, counts) in &tally.by_tenant {
        let mut row = vec![format!("{tenant:?}")];
        row.extend(counts.iter().map(u64::to_string));
        t.row(row);
    }
    t.print();
    println!();
    let mut t = Table::pairs();
    let size = |b: Option<u64>| b.map_or("-".to_owned(), |b| format!("{b} bytes"));
    t.row(vec!["store file".into(), size(file)]);
    t.row(vec!["journal".into(), size(journal)]);
    t.row(vec![
        "responses".into(),
        format!("{} bytes", tally.response_bytes),
    ]);
    t.row(vec![
        "highest fence".into(),
        tally.highest_fence.to_string(),
    ]);
    t.row(vec![
        "oldest claim".into(),
        tally.oldest_claim.as_ref().map_or("none".into(), |o| {
            format!(
                "{:?}/{:?}/{} fence {}, claimed {}",
                o.scope.tenant(),
                o.scope.endpoint(),
                o.key,
                o.fence,
                relative(o.claimed_at, now)
            )
        }),
    ]);
    t.row(vec![
        "took".into(),
        format!("{} (open {})", span(elapsed), span(opened)),
    ]);
    t.print();
    Ok(())
}

/// `idemdb list`.
#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    /// A store file, or a postgres:// URL.
    store: String,
    /// Only records with this status (repeat for several).
    #[arg(long, value_parser = clap::value_parser!(RecordStatusArg))]
    state: Vec<RecordStatusArg>,
    /// Only this tenant's records.
    #[arg(long)]
    tenant: Option<String>,
    /// Only this endpoint's records.
    #[arg(long)]
    endpoint: Option<String>,
    /// Only records claimed longer ago than this (90s, 15m, 2h, 1d, 1h30m).
    #[arg(long, value_parser = crate::output::parse_duration)]
    older_than: Option<std::time::Duration>,
    /// At most this many records.
    #[arg(long, default_value_t = 100)]
    limit: usize,
}

impl ListArgs {
    pub(crate) fn store(&self) -> &str {
        &self.store
    }
}

/// A status as `--state` spells it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecordStatusArg(RecordStatus);

impl std::str::FromStr for RecordStatusArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(RecordStatusArg)
    }
}

pub(crate) fn list(target: &Target, args: &ListArgs, out: &Out) -> Outcome {
    let store = target.open(out)?;
    let mut query = Query::all().limit(args.limit);
    for s in &args.state {
        query = query.status(s.0);
    }
    if let Some(t) = &args.tenant {
        query = query.tenant(t.clone());
    }
    if let Some(e) = &args.endpoint {
        query = query.endpoint(e.clone());
    }
    let now = SystemTime::now();
    if let Some(age) = args.older_than {
        query = query.claimed_before(now.checked_sub(age).unwrap_or(SystemTime::UNIX_EPOCH));
    }
    let records = store.list(&query)?;
    if out.json {
        let rows: Vec<Value> = records
            .iter()
            .map(|r| record_json(&r.scope, &r.key, r.status, &r.entry, false))
            .collect();
        out.json(&Value::Array(rows));
        return Ok(());
    }
    let mut t = Table::new(&[
        "fence", "status", "tenant", "endpoint", "key", "claimed", "until", "http", "body",
    ]);
    for r in &records {
        let (until, http, body) = match &r.entry.state {
            EntryState::InProgress { lease_deadline, .. } => (
                format!("lease {}", relative(*lease_deadline, now)),
                "-".into(),
                "-".into(),
            ),
            EntryState::Completed {
                expires_at,
                response,
            } => (
                format!("expires {}", relative(*expires_at, now)),
                response.status().to_string(),
                format!("{} B", response.body().len()),
            ),
        };
        t.row(vec![
            r.entry.fence.to_string(),
            r.status.to_string(),
            r.scope.tenant().to_owned(),
            r.scope.endpoint().to_owned(),
            r.key.clone(),
            relative(r.entry.claimed_at, now),
            until,
            http,
            body,
        ]);
    }
    t.print();
    if records.len() == args.limit {
        eprintln!("(the first {} records; --limit N for more)", args.limit);
    }
    Ok(())
}

/// `idemdb get`.
#[derive(Debug, Args)]
pub(crate) struct GetArgs {
    /// A store file, or a postgres:// URL.
    store: String,
    tenant: String,
    endpoint: String,
    key: String,
}

impl GetArgs {
    pub(crate) fn store(&self) -> &str {
        &self.store
    }
}

pub(crate) fn get(target: &Target, args: &GetArgs, out: &Out) -> Outcome {
    let store = target.open(out)?;
    let scope = Scope::new(args.tenant.clone(), args.endpoint.clone());
    let Some(entry) = store.get(&scope, &args.key)? else {
        return Err(Failure::new(
            Exit::NoRecord,
            format!(
                "no record of {:?}/{:?}/{} (never claimed, released, or expired)",
                args.tenant, args.endpoint, args.key
            ),
        ));
    };
    let now = SystemTime::now();
    let status = entry.status_at(now);
    if out.json {
        out.json(&record_json(&scope, &args.key, status, &entry, true));
        return Ok(());
    }
    let mut t = Table::pairs();
    t.row(vec!["tenant".into(), format!("{:?}", scope.tenant())]);
    t.row(vec!["endpoint".into(), format!("{:?}", scope.endpoint())]);
    t.row(vec!["key".into(), args.key.clone()]);
    t.row(vec!["status".into(), status.to_string()]);
    t.row(vec!["fence".into(), entry.fence.to_string()]);
    t.row(vec![
        "fingerprint".into(),
        hex(entry.fingerprint.as_bytes()),
    ]);
    let when = |at: SystemTime| format!("{} ({})", timestamp(at), relative(at, now));
    t.row(vec!["claimed".into(), when(entry.claimed_at)]);
    match &entry.state {
        EntryState::InProgress { lease_deadline, .. } => {
            t.row(vec!["lease until".into(), when(*lease_deadline)]);
            t.print();
        }
        EntryState::Completed {
            expires_at,
            response,
        } => {
            t.row(vec!["expires".into(), when(*expires_at)]);
            t.row(vec!["http status".into(), response.status().to_string()]);
            for (name, value) in response.headers() {
                let (encoding, text) = bytes(value);
                let shown = if encoding == "utf-8" {
                    text
                } else {
                    format!("{text} (base64)")
                };
                t.row(vec!["header".into(), format!("{name}: {shown}")]);
            }
            let (encoding, _) = bytes(response.body());
            t.row(vec![
                "body".into(),
                format!("{} bytes, {encoding}:", response.body().len()),
            ]);
            t.print();
            println!("{}", bytes(response.body()).1);
        }
    }
    Ok(())
}

/// A record as JSON; with `body`, its response's headers and body in full.
fn record_json(scope: &Scope, key: &str, status: RecordStatus, entry: &Entry, body: bool) -> Value {
    let mut v = json!({
        "tenant": scope.tenant(),
        "endpoint": scope.endpoint(),
        "key": key,
        "status": status.as_str(),
        "fence": entry.fence,
        "fingerprint": hex(entry.fingerprint.as_bytes()),
        "claimed_at": timestamp(entry.claimed_at),
    });
    let fields = v.as_object_mut().expect("an object");
    match &entry.state {
        EntryState::InProgress { lease_deadline, .. } => {
            fields.insert("lease_until".into(), json!(timestamp(*lease_deadline)));
        }
        EntryState::Completed {
            expires_at,
            response,
        } => {
            fields.insert("expires_at".into(), json!(timestamp(*expires_at)));
            fields.insert("http_status".into(), json!(response.status()));
            fields.insert("body_bytes".into(), json!(response.body().len()));
            if body {
                let encoded = |b: &[u8]| {
                    let (encoding, text) = bytes(b);
                    json!({ "encoding": encoding, "text": text })
                };
                let headers: Vec<Value> = response
                    .headers()
                    .iter()
                    .map(|(n, v)| json!({ "name": n, "value": encoded(v) }))
                    .collect();
                fields.insert("headers".into(), Value::Array(headers));
                fields.insert("body".into(), encoded(response.body()));
            }
        }
    }
    v
}
