//! `idemdb resolve`: the operator's reconcile for one stuck claim.

use crate::open::Target;
use crate::output::{relative, Exit, Failure, Out, Outcome};
use clap::{ArgGroup, Args};
use idemdb::{EntryState, Resolution, Response, Scope};
use serde_json::json;
use std::path::PathBuf;
use std::time::SystemTime;

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("outcome").required(true).args(["release", "complete"])))]
pub(crate) struct ResolveArgs {
    /// A store file, or a postgres:// URL.
    store: String,
    tenant: String,
    endpoint: String,
    key: String,
    /// The fence of the claim to resolve (`idemdb list` shows it): a newer attempt of the key
    /// has another, and is left alone.
    #[arg(long)]
    fence: u64,
    /// The side effect did not happen: free the key, so the client's retry runs it.
    #[arg(long)]
    release: bool,
    /// The side effect happened: store this HTTP status, so retries replay it.
    #[arg(long, value_name = "STATUS", value_parser = clap::value_parser!(u16).range(100..=599))]
    complete: Option<u16>,
    /// The stored response's body, read from this file (default: empty).
    #[arg(long, requires = "complete", conflicts_with = "release")]
    body: Option<PathBuf>,
    /// A stored response header, `Name: value` (repeat for several).
    #[arg(long = "header", value_name = "NAME:VALUE", requires = "complete", conflicts_with = "release", value_parser = parse_header)]
    headers: Vec<(String, String)>,
}

impl ResolveArgs {
    pub(crate) fn store(&self) -> &str {
        &self.store
    }
}

fn parse_header(text: &str) -> Result<(String, String), String> {
    let (name, value) = text
        .split_once(':')
        .ok_or_else(|| format!("{text:?} is not `Name: value`"))?;
    let name = name.trim();
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!("{name:?} is not a header name"));
    }
    Ok((name.to_ascii_lowercase(), value.trim().to_owned()))
}

pub(crate) fn resolve(target: &Target, args: &ResolveArgs, out: &Out) -> Outcome {
    let resolution = match args.complete {
        Some(status) => {
            let body = match &args.body {
                Some(path) => std::fs::read(path).map_err(|e| {
                    Failure::new(Exit::Usage, format!("--body {}: {e}", path.display()))
                })?,
                None => Vec::new(),
            };
            let mut response = Response::new(status, body);
            for (name, value) in &args.headers {
                response = response.with_header(name.clone(), value.clone());
            }
            Resolution::Complete(response)
        }
        None => Resolution::Release,
    };
    let store = target.open(out)?;
    let scope = Scope::new(args.tenant.clone(), args.endpoint.clone());
    scope
        .validate()
        .and_then(|()| idemdb::validate_key(&args.key))?;
    let resolved = store.resolve(&scope, &args.key, args.fence, resolution.clone())?;
    let done = match &resolution {
        Resolution::Complete(r) => format!("completed with status {}", r.status()),
        _ => "released".to_owned(),
    };
    if resolved {
        if out.json {
            out.json(&json!({ "resolved": true, "fence": args.fence, "outcome": done }));
        } else {
            println!(
                "{:?}/{:?}/{} fence {}: {done}",
                args.tenant, args.endpoint, args.key, args.fence
            );
        }
        return Ok(());
    }
    // Nothing changed: say why.
    let now = SystemTime::now();
    let why = match store.get(&scope, &args.key)? {
        None => {
            return Err(Failure::new(
                Exit::NoRecord,
                format!(
                    "no record of {:?}/{:?}/{}: nothing to resolve",
                    args.tenant, args.endpoint, args.key
                ),
            ))
        }
        Some(entry) if entry.fence > args.fence => format!(
            "the key's record has fence {}, not {}: a newer attempt holds it; list it again \
             before resolving",
            entry.fence, args.fence
        ),
        Some(entry) if entry.fence != args.fence => format!(
            "the key's record has fence {}, not {}: no claim of the key ever had that fence",
            entry.fence, args.fence
        ),
        Some(entry) => match entry.state {
            EntryState::Completed { .. } => "the claim is already completed".to_owned(),
            EntryState::InProgress { lease_deadline, .. } => format!(
                "the claim is live: its holder's lease runs out {}; wait for it, or stop its \
                 holder, then resolve",
                relative(lease_deadline, now)
            ),
        },
    };
    Err(Failure::new(
        Exit::Refused,
        format!("nothing changed: {why}"),
    ))
}
