//! A session: one client joined to one upstream through a [`Proxy`], until one of them ends.

use crate::keyed::Keying;
use crate::link::{Ending, Link};
use crate::proxy::Proxy;
use std::sync::Arc;

/// Which side ended the session.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    /// The client went away. Keyed calls already forwarded were let finish (their results are
    /// stored for the retry) before the upstream's link was dropped.
    Client,
    /// The upstream ended: every request in flight was answered with an error saying so.
    Upstream(Ending),
}

/// Runs a session: every message of `client`'s goes to the proxy and on to `upstream`, and
/// back. `keying` is `None` for a plain proxy; `tenant` is whom the session's keyed calls act
/// for.
pub(crate) async fn run(
    client: Link,
    upstream: Link,
    keying: Option<Arc<Keying>>,
    tenant: String,
) -> Ended {
    let Link {
        outgoing: to_client,
        incoming: mut from_client,
        ended: _,
    } = client;
    let Link {
        outgoing: to_upstream,
        incoming: mut from_upstream,
        ended: upstream_ended,
    } = upstream;
    let proxy = Arc::new(Proxy::new(to_upstream, to_client, keying, tenant));
    loop {
        tokio::select! {
            message = from_client.recv() => match message {
                Some(message) => proxy.client_sent(message),
                None => break,
            },
            message = from_upstream.recv() => match message {
                Some(message) => proxy.server_sent(message),
                None => {
                    let ending = upstream_ended
                        .await
                        .unwrap_or_else(|_| Ending::new("the upstream ended", 1));
                    proxy.server_gone(&ending.why);
                    // Keyed calls in flight were told their answer is lost: let them store
                    // that and answer the client before the session ends.
                    while proxy.keyed_in_flight() > 0 {
                        proxy.keyed_settled().await;
                    }
                    return Ended::Upstream(ending);
                }
            },
        }
    }
    // The client is gone. Keyed calls in flight still wait for the upstream's answers, to
    // store them: keep reading until none is left (or the upstream ends), then let go of the
    // upstream (its sender drops with the last reference to the proxy).
    while proxy.keyed_in_flight() > 0 {
        tokio::select! {
            message = from_upstream.recv() => match message {
                Some(message) => proxy.server_sent(message),
                None => {
                    proxy.server_gone("the upstream ended");
                    break;
                }
            },
            () = proxy.keyed_settled() => {}
        }
    }
    // Closing the upstream's link asks it to end (a child's stdin closes, as the MCP stdio
    // transport's shutdown says); give it a moment to do so before it is killed.
    drop(proxy);
    let _ = tokio::time::timeout(UPSTREAM_SHUTDOWN, async {
        while from_upstream.recv().await.is_some() {}
    })
    .await;
    Ended::Client
}

/// How long an upstream gets to end by itself once its client is gone.
const UPSTREAM_SHUTDOWN: std::time::Duration = std::time::Duration::from_secs(5);
