//! `idemdb-mcp`: an MCP gateway in front of upstream MCP servers, making agents' tool calls
//! effectively-once with keys the harness gives (issue 29).
//!
//! In progress. What works: `idemdb-mcp serve --store STORE [--tenant T] -- COMMAND ARGS...`
//! speaks MCP on stdio to one client and forwards every message, both ways, to one upstream
//! server run as a child process on stdio (request ids renumbered, cancellations renamed,
//! everything else unchanged); a `tools/call` keyed by the harness (`keyed.rs`) runs once per
//! key through the library's agent gateway. Not yet: a ready `io.idemdb/key`, read-only tools
//! left unkeyed, strict mode, counters, Streamable HTTP (`--listen`), several upstreams
//! (`--config`), PostgreSQL stores.

mod keyed;
mod message;
mod proxy;
mod stdio;

use std::process::ExitCode;

/// How long a duplicate of a keyed call in flight waits for its result, by default, before it
/// is told the step is in progress.
const WAIT_FOR_IN_FLIGHT: std::time::Duration = std::time::Duration::from_secs(30);

const USAGE: &str =
    "usage: idemdb-mcp serve --store STORE [--tenant TENANT] [--wait SECONDS] [--strict] \
                     -- COMMAND [ARG...]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let serve = match parse(&args) {
        Ok(serve) => serve,
        Err(why) => {
            eprintln!("idemdb-mcp: {why}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    // A claim whose call was lost with an upstream is never taken over: its outcome is unknown
    // until an operator (or a reconciler) resolves it.
    let store = match idemdb::Store::builder()
        .stale_policy(idemdb::StalePolicy::Keep)
        .open(&serve.store)
    {
        Ok(store) => store,
        Err(e) => {
            eprintln!("idemdb-mcp: the store {}: {e}", serve.store);
            return ExitCode::from(1);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("idemdb-mcp: {e}");
            return ExitCode::from(1);
        }
    };
    let policy = if serve.strict {
        idemdb::agent::ArgumentPolicy::Strict
    } else {
        idemdb::agent::ArgumentPolicy::ReplayFirst
    };
    let keying = keyed::Keying {
        gateway: idemdb::agent::Gateway::builder(store)
            .wait_for_in_flight(serve.wait)
            .argument_policy(policy)
            .build(),
        tenant: serve.tenant,
        strict: serve.strict,
    };
    let status = runtime.block_on(stdio::serve(&serve.command, Some(keying)));
    match status {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("idemdb-mcp: {e}");
            ExitCode::from(1)
        }
    }
}

/// `serve`'s arguments.
#[derive(Debug, PartialEq)]
struct Serve {
    store: String,
    tenant: String,
    /// How long a duplicate of a keyed call in flight waits for its result.
    wait: std::time::Duration,
    /// `--strict`: see [`keyed::Keying::strict`].
    strict: bool,
    command: Vec<String>,
}

fn parse(args: &[String]) -> Result<Serve, String> {
    let (ours, command) = match args.iter().position(|a| a == "--") {
        Some(at) => (&args[..at], args[at + 1..].to_vec()),
        None => (args, Vec::new()),
    };
    let mut ours = ours.iter();
    if ours.next().map(String::as_str) != Some("serve") {
        return Err("the only command is `serve`".into());
    }
    let (mut store, mut tenant, mut wait) = (None, String::from("default"), WAIT_FOR_IN_FLIGHT);
    let mut strict = false;
    while let Some(arg) = ours.next() {
        let mut value = || {
            ours.next()
                .cloned()
                .ok_or_else(|| format!("{arg} needs a value"))
        };
        match arg.as_str() {
            "--store" => store = Some(value()?),
            "--tenant" => tenant = value()?,
            "--strict" => strict = true,
            "--wait" => {
                let seconds = value()?;
                wait = seconds
                    .parse::<f64>()
                    .ok()
                    .and_then(|s| std::time::Duration::try_from_secs_f64(s).ok())
                    .ok_or_else(|| format!("--wait {seconds}: not a number of seconds"))?;
            }
            "--listen" | "--config" => return Err(format!("{arg} is not offered yet")),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let store = store.ok_or("--store is required")?;
    if command.is_empty() {
        return Err("the upstream server's command goes after `--`".into());
    }
    Ok(Serve {
        store,
        tenant,
        wait,
        strict,
        command,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn serve_takes_a_store_a_tenant_and_the_upstream_command() {
        assert_eq!(
            parse(&args(
                "serve --store s.idem --tenant acme --wait 1.5 --strict -- python server.py --flag"
            )),
            Ok(Serve {
                store: "s.idem".into(),
                tenant: "acme".into(),
                wait: std::time::Duration::from_millis(1500),
                strict: true,
                command: args("python server.py --flag"),
            })
        );
        for (bad, says) in [
            ("", "only command"),
            ("serve -- x", "--store is required"),
            ("serve --store", "needs a value"),
            ("serve --store s", "after `--`"),
            ("serve --store s --nope -- x", "unknown argument"),
            (
                "serve --store s --listen 127.0.0.1:1 -- x",
                "not offered yet",
            ),
            (
                "serve --store s --wait soon -- x",
                "not a number of seconds",
            ),
            ("serve --store s --wait -1 -- x", "not a number of seconds"),
        ] {
            let err = parse(&args(bad)).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }
}
