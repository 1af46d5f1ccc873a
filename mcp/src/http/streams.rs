//! Where a message for an HTTP client goes: Streamable HTTP has no single stream to the client,
//! but one per POSTed request (open until that request's response) and at most one standalone
//! GET stream per session. A response goes to the stream of its request; a progress
//! notification to the stream of the request whose `progressToken` it names; anything else
//! (server requests such as `roots/list` or sampling, list-changed notifications, logging) to
//! the GET stream when one is open, else to any open request stream, else it is kept (bounded,
//! oldest dropped) until a GET stream opens.

use crate::message::{self, Kind};
use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use tokio::sync::mpsc::{self, UnboundedReceiver, UnboundedSender};

/// How many messages with no stream to go to are kept for the next GET stream.
pub(crate) const KEPT: usize = 256;

/// The open streams of one session, and what waits for one.
#[derive(Default)]
pub(crate) struct Streams {
    /// Requests waiting for their response, by their id as JSON text.
    waiting: HashMap<String, Waiter>,
    /// Progress tokens (as JSON text) → the id (as JSON text) of the request that gave them.
    progress: HashMap<String, String>,
    /// The standalone (GET) stream.
    standalone: Option<UnboundedSender<Value>>,
    /// Messages that found no stream, oldest first.
    kept: VecDeque<Value>,
}

struct Waiter {
    to: UnboundedSender<Value>,
    /// Whether the request's answer is a stream (SSE) that may carry other messages too, or a
    /// single JSON response that carries only its own.
    streamed: bool,
    progress_token: Option<String>,
}

/// Why a request's stream could not be opened.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct AlreadyWaiting;

impl Streams {
    /// Opens the stream of the request `id` (JSON text): it receives the request's response
    /// (and, when `streamed`, its progress and other messages for the client), then closes.
    /// A request whose id is still waiting for its response is refused: its answer could not
    /// be told apart.
    pub(crate) fn open_request(
        &mut self,
        id: String,
        progress_token: Option<String>,
        streamed: bool,
    ) -> Result<UnboundedReceiver<Value>, AlreadyWaiting> {
        if self.waiting.contains_key(&id) {
            return Err(AlreadyWaiting);
        }
        let (to, from) = mpsc::unbounded_channel();
        if let Some(token) = &progress_token {
            self.progress.insert(token.clone(), id.clone());
        }
        self.waiting.insert(
            id,
            Waiter {
                to,
                streamed,
                progress_token,
            },
        );
        Ok(from)
    }

    /// Opens the session's standalone stream, unless one is open already (a client that went
    /// away has closed it). What was kept for it is sent first.
    pub(crate) fn open_standalone(&mut self) -> Option<UnboundedReceiver<Value>> {
        if self.standalone.as_ref().is_some_and(|s| !s.is_closed()) {
            return None;
        }
        let (to, from) = mpsc::unbounded_channel();
        for message in self.kept.drain(..) {
            let _ = to.send(message);
        }
        self.standalone = Some(to);
        Some(from)
    }

    /// Sends `message` (from the gateway, for the client) where it belongs.
    pub(crate) fn deliver(&mut self, message: Value) {
        match message::kind(&message) {
            Kind::Response { id } => {
                // No waiter: the client dropped the request's stream, and with it the answer
                // (a keyed call's result is stored all the same, for the retry).
                if let Some(waiter) = self.waiting.remove(&id.to_string()) {
                    if let Some(token) = &waiter.progress_token {
                        self.progress.remove(token);
                    }
                    let _ = waiter.to.send(message);
                }
            }
            Kind::Notification { method } if method == "notifications/progress" => {
                let token = message["params"]["progressToken"].to_string();
                let waiter = self
                    .progress
                    .get(&token)
                    .and_then(|id| self.waiting.get(id))
                    .filter(|w| w.streamed);
                match waiter {
                    Some(waiter) => {
                        let _ = waiter.to.send(message);
                    }
                    None => self.send_to_whoever_listens(message),
                }
            }
            _ => self.send_to_whoever_listens(message),
        }
    }

    /// A message that belongs to no request: the GET stream, else an open request stream,
    /// else kept.
    fn send_to_whoever_listens(&mut self, message: Value) {
        let message = match &self.standalone {
            Some(standalone) => match standalone.send(message) {
                Ok(()) => return,
                Err(unsent) => unsent.0,
            },
            None => message,
        };
        let mut message = Some(message);
        for waiter in self.waiting.values().filter(|w| w.streamed) {
            match message.take().map(|m| waiter.to.send(m)) {
                Some(Ok(())) | None => return,
                Some(Err(unsent)) => message = Some(unsent.0),
            }
        }
        if let Some(message) = message {
            if self.kept.len() == KEPT {
                self.kept.pop_front();
                eprintln!(
                    "idemdb-mcp: an HTTP session kept {KEPT} messages with no stream open to \
                     send them on; the oldest is dropped"
                );
            }
            self.kept.push_back(message);
        }
    }

    /// Closes every stream (the session ended): a request still waiting ends without its
    /// response.
    pub(crate) fn close_all(&mut self) {
        self.waiting.clear();
        self.progress.clear();
        self.standalone = None;
    }

    /// How many messages are kept for a GET stream.
    #[cfg(test)]
    pub(crate) fn kept(&self) -> usize {
        self.kept.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn drained(from: &mut UnboundedReceiver<Value>) -> Vec<Value> {
        std::iter::from_fn(|| from.try_recv().ok()).collect()
    }

    #[test]
    fn a_response_and_its_progress_go_to_their_request_and_close_its_stream() {
        let mut streams = Streams::default();
        let mut one = streams
            .open_request("1".into(), Some("7".into()), true)
            .unwrap();
        let mut two = streams.open_request("\"b\"".into(), None, true).unwrap();
        let progress = json!({"jsonrpc": "2.0", "method": "notifications/progress",
            "params": {"progressToken": 7, "progress": 1}});
        streams.deliver(progress.clone());
        streams.deliver(json!({"jsonrpc": "2.0", "id": "b", "result": {}}));
        streams.deliver(json!({"jsonrpc": "2.0", "id": 1, "result": {"n": 1}}));
        assert_eq!(
            drained(&mut one),
            [
                progress,
                json!({"jsonrpc": "2.0", "id": 1, "result": {"n": 1}})
            ]
        );
        assert_eq!(
            drained(&mut two),
            [json!({"jsonrpc": "2.0", "id": "b", "result": {}})]
        );
        // Answered: both streams are closed, and a late duplicate goes nowhere.
        assert!(one.is_closed() && two.is_closed());
        streams.deliver(json!({"jsonrpc": "2.0", "id": 1, "result": {}}));
        assert_eq!(streams.kept(), 0);
    }

    #[test]
    fn a_request_id_still_waiting_is_refused() {
        let mut streams = Streams::default();
        let _one = streams.open_request("1".into(), None, true).unwrap();
        assert_eq!(
            streams.open_request("1".into(), None, true).err(),
            Some(AlreadyWaiting)
        );
        streams.deliver(json!({"jsonrpc": "2.0", "id": 1, "result": {}}));
        assert!(streams.open_request("1".into(), None, true).is_ok());
    }

    #[test]
    fn server_requests_go_to_the_get_stream_else_a_request_stream_else_are_kept() {
        let mut streams = Streams::default();
        let roots = json!({"jsonrpc": "2.0", "id": 5, "method": "roots/list"});
        let changed = json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"});

        // Nothing open: kept, then sent first on the GET stream when it opens.
        streams.deliver(roots.clone());
        assert_eq!(streams.kept(), 1);
        let mut get = streams.open_standalone().unwrap();
        assert!(
            streams.open_standalone().is_none(),
            "one GET stream at a time"
        );
        assert_eq!(drained(&mut get), std::slice::from_ref(&roots));

        // A GET stream open: it gets them, not the request streams.
        let mut call = streams.open_request("1".into(), None, true).unwrap();
        streams.deliver(changed.clone());
        assert_eq!(drained(&mut get), std::slice::from_ref(&changed));
        assert!(drained(&mut call).is_empty());

        // The GET stream dropped by the client: a request stream carries them, and a new GET
        // stream may open.
        drop(get);
        streams.deliver(roots.clone());
        assert_eq!(drained(&mut call), std::slice::from_ref(&roots));
        assert!(streams.open_standalone().is_some());
    }

    #[test]
    fn a_json_answer_carries_only_its_response_and_a_dropped_stream_drops_it() {
        let mut streams = Streams::default();
        let mut json_only = streams
            .open_request("1".into(), Some("1".into()), false)
            .unwrap();
        let dropped = streams.open_request("2".into(), None, true).unwrap();
        drop(dropped);
        let log = json!({"jsonrpc": "2.0", "method": "notifications/message", "params": {}});
        streams.deliver(log.clone());
        streams.deliver(json!({"jsonrpc": "2.0", "method": "notifications/progress",
            "params": {"progressToken": 1}}));
        assert!(drained(&mut json_only).is_empty());
        assert_eq!(streams.kept(), 2, "no stream could carry them");
        // The answer to the dropped stream is dropped, not kept, and nothing panics.
        streams.deliver(json!({"jsonrpc": "2.0", "id": 2, "result": {}}));
        assert_eq!(streams.kept(), 2);
        streams.deliver(json!({"jsonrpc": "2.0", "id": 1, "result": {}}));
        assert_eq!(drained(&mut json_only).len(), 1);
    }

    #[test]
    fn what_is_kept_is_bounded_oldest_dropped() {
        let mut streams = Streams::default();
        for n in 0..KEPT + 3 {
            streams.deliver(json!({"jsonrpc": "2.0", "method": "notifications/message",
                "params": {"n": n}}));
        }
        assert_eq!(streams.kept(), KEPT);
        let mut get = streams.open_standalone().unwrap();
        let first = drained(&mut get).remove(0);
        assert_eq!(first["params"]["n"], 3);
    }

    #[test]
    fn closing_ends_every_stream() {
        let mut streams = Streams::default();
        let mut call = streams.open_request("1".into(), None, true).unwrap();
        let mut get = streams.open_standalone().unwrap();
        streams.close_all();
        assert!(call.try_recv().is_err() && call.is_closed());
        assert!(get.try_recv().is_err() && get.is_closed());
    }
}
