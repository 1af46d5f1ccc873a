//! `idemdb-mcp`: an MCP gateway in front of upstream MCP servers, making agents' tool calls
//! effectively-once with keys the harness gives (issue 29).
//!
//! The parts, each a file: `args` (the command line), `link` (a conversation in JSON-RPC
//! messages, whatever its transport), `stdio` (the client on stdio), `http` (clients on
//! Streamable HTTP, `--listen`), `upstream` (the servers
//! behind the gateway), `session` (a client joined to an upstream), `proxy` (the routing and
//! renumbering between them), `keyed` (a `tools/call` run once per key through the library's
//! agent gateway), `rules` (which tools are keyed), `report` (counts of outcomes).

mod args;
mod http;
mod keyed;
mod link;
mod message;
mod proxy;
mod report;
mod rules;
mod session;
mod stdio;
mod upstream;

use args::{Serve, Upstreams};
use std::process::ExitCode;
use std::sync::Arc;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let serve = match args::parse(&args) {
        Ok(serve) => serve,
        Err(why) => {
            eprintln!("idemdb-mcp: {why}\n{}", args::USAGE);
            return ExitCode::from(2);
        }
    };
    match run(serve) {
        Ok(code) => ExitCode::from(code),
        Err(why) => {
            eprintln!("idemdb-mcp: {why}");
            ExitCode::from(1)
        }
    }
}

fn run(serve: Serve) -> Result<u8, String> {
    // Before the store opens: it registers its metrics with the recorder installed then.
    let reporting = report::start(serve.metrics)?;
    let store = open_store(&serve)?;
    let policy = if serve.strict {
        idemdb::agent::ArgumentPolicy::Strict
    } else {
        idemdb::agent::ArgumentPolicy::ReplayFirst
    };
    let keying = Arc::new(keyed::Keying {
        gateway: idemdb::agent::Gateway::builder(store)
            .wait_for_in_flight(serve.wait)
            .argument_policy(policy)
            .build(),
        rules: rules::ToolRules::default(),
        strict: serve.strict,
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    {
        // `/metrics` is served on the runtime whichever transport the client uses.
        let _runtime = runtime.enter();
        reporting.serve()?;
    }
    let Upstreams::Command(command) = &serve.upstream else {
        return Err("--config is not offered yet".into());
    };
    if let Some(settings) = &serve.http {
        let command = command.clone();
        let start: http::StartUpstream = Arc::new(move || upstream::child::start(&command, &[]));
        return runtime
            .block_on(http::serve(settings, keying, start))
            .map(|()| 0);
    }
    runtime.block_on(async {
        let upstream = upstream::child::start(command, &[]).map_err(|e| e.to_string())?;
        let (client, written) = stdio::client();
        let ended = session::run(client, upstream, Some(keying), serve.tenant.clone()).await;
        // The last answers reach the client before the process ends.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), written).await;
        match ended {
            session::Ended::Client => Ok(0),
            session::Ended::Upstream(ending) => Ok(ending.code),
        }
    })
}

/// The store `--store` names: a file, or a PostgreSQL database (feature `postgres`). A claim
/// whose call was lost with an upstream is never taken over by the store: its outcome is
/// unknown until an operator (or a reconciler) resolves it.
fn open_store(serve: &Serve) -> Result<idemdb::Store, String> {
    let builder = idemdb::Store::builder()
        .stale_policy(idemdb::StalePolicy::Keep)
        .lease(serve.lease);
    let store =
        if serve.store.starts_with("postgres://") || serve.store.starts_with("postgresql://") {
            connect(builder, &serve.store)
        } else {
            builder.open(&serve.store).map_err(|e| e.to_string())
        };
    store.map_err(|e| format!("the store {}: {e}", redacted(&serve.store)))
}

#[cfg(feature = "postgres")]
fn connect(builder: idemdb::StoreBuilder, url: &str) -> Result<idemdb::Store, String> {
    builder.connect(url).map_err(|e| e.to_string())
}

#[cfg(not(feature = "postgres"))]
fn connect(_: idemdb::StoreBuilder, _: &str) -> Result<idemdb::Store, String> {
    Err("this idemdb-mcp was built without the `postgres` feature".into())
}

/// A store's name as it may be printed: a URL's password hidden.
fn redacted(store: &str) -> String {
    match (store.find("://"), store.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &store[scheme + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &store[..scheme + 3], &store[at..]),
                None => store.to_owned(),
            }
        }
        _ => store.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_stores_password_is_never_printed() {
        assert_eq!(
            super::redacted("postgres://app:s3cret@db:5432/idem"),
            "postgres://app:***@db:5432/idem"
        );
        assert_eq!(
            super::redacted("postgres://app@db/idem"),
            "postgres://app@db/idem"
        );
        assert_eq!(super::redacted("gateway.idem"), "gateway.idem");
    }
}
