//! `idemdb-mcp`: an MCP gateway in front of upstream MCP servers, making agents' tool calls
//! effectively-once with keys the harness gives ([docs/mcp.md](../../docs/mcp.md)).
//!
//! The parts, each a file or folder:
//!
//! | part | what it is |
//! | --- | --- |
//! | `args` | the command line |
//! | `link` | a conversation in JSON-RPC messages, whatever its transport |
//! | `lines` | the stdio transport's framing, one message per line |
//! | `stdio` | the client on stdin and stdout |
//! | `http/` | clients on Streamable HTTP (`--listen`): sessions, checks, streams |
//! | `upstream/` | the servers behind the gateway: a child process, a Streamable HTTP URL, the hub of several |
//! | `config` | several upstreams, in a host's `mcpServers` JSON (`--config`) |
//! | `session` | a client joined to an upstream |
//! | `proxy` | the routing and id renumbering between them |
//! | `keyed` | a `tools/call` run once per key through the library's agent gateway |
//! | `rules` | which tools are keyed, which upstreams honour the key |
//! | `report/` | counts and events of outcomes (features `metrics`, `tracing`) |

mod args;
mod config;
#[cfg(test)]
mod hostile;
mod http;
mod keyed;
mod lines;
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
    let config = match &serve.upstream {
        Upstreams::Config(path) => Some(config::load(path)?),
        Upstreams::Command(_) => None,
    };
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
        rules: config
            .as_ref()
            .map(config::Config::rules)
            .unwrap_or_default(),
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
    if let Some(config) = config {
        let config = Arc::new(config);
        if let Some(settings) = &serve.http {
            // Each HTTP session gets upstreams of its own, joined by a hub of its own.
            let start: http::StartUpstream = Arc::new(move || {
                let (hub, _done) = start_hub(&config).map_err(std::io::Error::other)?;
                Ok(hub)
            });
            return runtime
                .block_on(http::serve(settings, keying, start))
                .map(|()| 0);
        }
        return runtime.block_on(serve_config(&config, keying, serve.tenant.clone()));
    }
    let Upstreams::Command(command) = &serve.upstream else {
        return Err("no upstream given".into());
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

/// Serves the client on stdio in front of the config's upstreams, joined by the hub. Once the
/// session is over, the last answers are written and the hub is given its while to let the
/// upstreams end (an HTTP upstream's session is deleted).
async fn serve_config(
    config: &config::Config,
    keying: Arc<keyed::Keying>,
    tenant: String,
) -> Result<u8, String> {
    let (hub, done) = start_hub(config)?;
    let (client, written) = stdio::client();
    let ended = session::run(client, hub, Some(keying), tenant).await;
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), written).await;
    let _ = done.await;
    match ended {
        session::Ended::Client => Ok(0),
        session::Ended::Upstream(ending) => Ok(ending.code),
    }
}

/// Starts the config's upstreams (children, HTTP links) and joins them in a hub.
fn start_hub(config: &config::Config) -> Result<(link::Link, tokio::task::JoinHandle<()>), String> {
    let mut links = Vec::new();
    for upstream in &config.upstreams {
        let link = match &upstream.transport {
            config::Transport::Command { command, env } => {
                upstream::child::start(command, env).map_err(|e| e.to_string())
            }
            config::Transport::Http { url } => upstream::http::connect(url),
        }
        .map_err(|e| format!("the upstream {}: {e}", upstream.name))?;
        links.push((upstream.name.clone(), link));
    }
    Ok(upstream::hub::start(links))
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
