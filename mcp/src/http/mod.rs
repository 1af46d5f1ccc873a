//! MCP's Streamable HTTP transport toward the client (`--listen`): the gateway at `/mcp` on the
//! address given, one session per `initialize`, each with an upstream of its own and the
//! tenant named by a request header. `endpoint` answers the requests, after `checks` (origin,
//! tenant, protocol version, session id); `sessions` holds the live `session`s; `streams`
//! routes each message for a client to the right one of its streams, sent as `sse`.

mod checks;
mod endpoint;
mod refusal;
mod session;
mod sessions;
mod sse;
mod streams;
#[cfg(test)]
mod tests;

use crate::args::Http;
use crate::keyed::Keying;
use crate::link::Link;
use std::sync::Arc;

/// Starts an upstream for a new session.
pub(crate) type StartUpstream = Arc<dyn Fn() -> std::io::Result<Link> + Send + Sync>;

/// Serves MCP on `settings.listen` until the process ends, each session's upstream started by
/// `start`. Once listening, says so on stderr (with the port, when 0 was given).
///
/// # Errors
/// The address could not be bound, or the listener failed.
pub(crate) async fn serve(
    settings: &Http,
    keying: Arc<Keying>,
    start: StartUpstream,
) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .map_err(|e| format!("--listen {}: {e}", settings.listen))?;
    let listening = listener.local_addr().map_err(|e| e.to_string())?;
    eprintln!("idemdb-mcp: listening on http://{listening}/mcp");
    run(listener, settings, keying, start)
        .await
        .map_err(|e| format!("--listen {listening}: {e}"))
}

/// Serves MCP on `listener`.
async fn run(
    listener: tokio::net::TcpListener,
    settings: &Http,
    keying: Arc<Keying>,
    start: StartUpstream,
) -> std::io::Result<()> {
    let endpoint = endpoint(listener.local_addr()?, settings, keying, start);
    axum::serve(listener, app(endpoint)).await
}

/// The endpoint of a listener on `listening`, its idle sessions swept on a task of their own
/// (for as long as the endpoint lives).
fn endpoint(
    listening: std::net::SocketAddr,
    settings: &Http,
    keying: Arc<Keying>,
    start: StartUpstream,
) -> Arc<endpoint::Endpoint> {
    let sessions = sessions::Sessions::new(settings.max_sessions);
    let idle = settings.session_idle;
    let sweeping = Arc::downgrade(&sessions);
    tokio::spawn(async move {
        let mut every = tokio::time::interval(sessions::sweep_every(idle));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            match sweeping.upgrade() {
                Some(sessions) => sessions.sweep(idle),
                None => return,
            }
        }
    });
    Arc::new(endpoint::Endpoint {
        sessions,
        origins: checks::Origins::new(listening, &settings.allowed_origins),
        tenant_header: settings.tenant_header.clone(),
        keying,
        start,
    })
}

fn app(endpoint: Arc<endpoint::Endpoint>) -> axum::Router {
    axum::Router::new()
        .route("/mcp", axum::routing::any(endpoint::answer))
        .with_state(endpoint)
}
