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
                    // Keyed calls in flight are told their outcome is unknown once their
                    // claims are marked so: let those answers reach the client first.
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
    Ended::Client
}
