//! One client's HTTP session: the client's side of a [`Link`] whose messages arrive as POSTs
//! and leave on the session's streams, the tenant it was made for, and how long it has been
//! idle.

use super::streams::Streams;
use crate::keyed::Keying;
use crate::link::{self, Ending, Link, Peer};
use serde_json::Value;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

/// A session: made by an `initialize` POST, ended by `DELETE`, by being idle, or by its
/// upstream ending.
pub(crate) struct Session {
    pub(crate) id: String,
    /// Whom the session's keyed calls act for; every request of the session must name it.
    pub(crate) tenant: String,
    /// Where the client's messages go (the proxy); `None` once the client ended the session.
    to_gateway: Mutex<Option<mpsc::UnboundedSender<Value>>>,
    ended: Mutex<Option<oneshot::Sender<Ending>>>,
    streams: Mutex<Streams>,
    activity: Mutex<Activity>,
}

struct Activity {
    last: Instant,
    /// Streams open to the client (and JSON answers awaited): a session with one is not idle.
    open: usize,
}

/// The session ended: its messages go nowhere.
#[derive(Debug)]
pub(crate) struct Gone;

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Session {
    /// A new session `id` of `tenant`'s, joined to `upstream` by a proxy on a task of its own.
    /// `on_end` runs once the proxy is done (the client ended the session and its keyed calls
    /// finished, or the upstream ended).
    pub(crate) fn start(
        id: String,
        tenant: String,
        upstream: Link,
        keying: Arc<Keying>,
        on_end: impl FnOnce(&Session) + Send + 'static,
    ) -> Arc<Session> {
        let (client, peer) = link::pair();
        let Peer {
            outgoing: mut for_client,
            incoming,
            ended,
        } = peer;
        let session = Arc::new(Session {
            id,
            tenant: tenant.clone(),
            to_gateway: Mutex::new(Some(incoming)),
            ended: Mutex::new(Some(ended)),
            streams: Mutex::new(Streams::default()),
            activity: Mutex::new(Activity {
                last: Instant::now(),
                open: 0,
            }),
        });
        let delivering = Arc::clone(&session);
        tokio::spawn(async move {
            while let Some(message) = for_client.recv().await {
                delivering.streams().deliver(message);
            }
            // The proxy is gone (and every keyed call it ran): nothing more will come.
            delivering.streams().close_all();
        });
        let running = Arc::clone(&session);
        tokio::spawn(async move {
            if let crate::session::Ended::Upstream(ending) =
                crate::session::run(client, upstream, Some(keying), tenant).await
            {
                eprintln!(
                    "idemdb-mcp: the upstream of an HTTP session ended: {}",
                    ending.why
                );
            }
            running.end("the session ended");
            on_end(&running);
        });
        session
    }

    /// The session's streams.
    pub(crate) fn streams(&self) -> MutexGuard<'_, Streams> {
        locked(&self.streams)
    }

    /// Passes a message of the client's to the gateway.
    pub(crate) fn send(&self, message: Value) -> Result<(), Gone> {
        self.touch();
        match &*locked(&self.to_gateway) {
            Some(to) => to.send(message).map_err(|_| Gone),
            None => Err(Gone),
        }
    }

    /// The client is done: the proxy lets keyed calls in flight finish (their results are
    /// stored), then lets go of the upstream.
    pub(crate) fn end(&self, why: &str) {
        locked(&self.to_gateway).take();
        if let Some(ended) = locked(&self.ended).take() {
            let _ = ended.send(Ending::new(why, 0));
        }
    }

    /// Notes a request of the client's.
    pub(crate) fn touch(&self) {
        locked(&self.activity).last = Instant::now();
    }

    /// Notes a stream opened to the client; the session is not idle until it closes.
    pub(crate) fn opened(self: &Arc<Self>) -> OpenStream {
        locked(&self.activity).open += 1;
        OpenStream(Arc::clone(self))
    }

    /// Whether the session had no request and no stream open for `idle`.
    pub(crate) fn idle(&self, idle: Duration) -> bool {
        let activity = locked(&self.activity);
        activity.open == 0 && activity.last.elapsed() >= idle
    }
}

/// A stream open to the client, counted until it is dropped.
pub(crate) struct OpenStream(Arc<Session>);

impl Drop for OpenStream {
    fn drop(&mut self) {
        let mut activity = locked(&self.0.activity);
        activity.open = activity.open.saturating_sub(1);
        activity.last = Instant::now();
    }
}
