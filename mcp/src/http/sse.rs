//! A stream to the client as server-sent events: each message one `message` event, in order,
//! until the channel closes. No event ids are sent: the gateway offers no resumption
//! (`Last-Event-ID`), so a client that loses a stream retries the request instead (a keyed
//! call's result is stored for that retry).

use super::session::OpenStream;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use serde_json::Value;
use std::convert::Infallible;
use std::time::Duration;
use tokio::sync::mpsc::UnboundedReceiver;

/// How often an idle standalone stream gets a comment line, so that a client gone without
/// closing its connection is noticed (a write fails) and its session can go idle.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The messages `from` receives, as an SSE response; `open` counts the stream as open for as
/// long as the response body lives.
pub(crate) fn events(
    from: UnboundedReceiver<Value>,
    open: OpenStream,
    keep_alive: bool,
) -> Response {
    let events = stream::unfold((from, open), |(mut from, open)| async move {
        let message = from.recv().await?;
        let event = Event::default().event("message").data(message.to_string());
        Some((Ok::<_, Infallible>(event), (from, open)))
    });
    if keep_alive {
        Sse::new(events)
            .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
            .into_response()
    } else {
        Sse::new(events).into_response()
    }
}
