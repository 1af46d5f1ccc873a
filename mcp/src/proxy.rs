//! The gateway's routing: every message from the client (downstream) goes to the server
//! (upstream) and back, with request ids renumbered on the way so that the gateway can tell
//! whose answer is whose, and cancellations of requests renamed to match.
//!
//! Ids: each request the client sends gets an id of the gateway's own toward the server
//! (`client_requests` maps it back); each request the server sends the client (sampling, roots,
//! elicitation, pings) gets one of the gateway's own toward the client (`server_requests`).
//! Nothing else is changed: a method the gateway does not know, a field it does not know, a
//! progress token (the client's own, carried in the request's `_meta`) go through as they are.

use crate::message::{self, Kind};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Mutex;
use tokio::sync::mpsc::UnboundedSender;

/// The JSON-RPC code for an error of the gateway's own (the server-error range).
pub(crate) const UPSTREAM_GONE: i64 = -32000;

/// One client, one server, and the requests in flight between them.
pub(crate) struct Proxy {
    upstream: UnboundedSender<Value>,
    downstream: UnboundedSender<Value>,
    maps: Mutex<Maps>,
}

#[derive(Default)]
struct Maps {
    next: u64,
    /// Gateway id toward the server → the client's id, for the client's requests in flight.
    client_requests: HashMap<u64, Value>,
    /// The client's id (as JSON text) → the gateway's id toward the server.
    client_ids: HashMap<String, u64>,
    /// Gateway id toward the client → the server's id, for the server's requests in flight.
    server_requests: HashMap<u64, Value>,
    /// The server's id (as JSON text) → the gateway's id toward the client.
    server_ids: HashMap<String, u64>,
}

impl Maps {
    fn next_id(&mut self) -> u64 {
        self.next += 1;
        self.next
    }
}

impl Proxy {
    pub(crate) fn new(
        upstream: UnboundedSender<Value>,
        downstream: UnboundedSender<Value>,
    ) -> Proxy {
        Proxy {
            upstream,
            downstream,
            maps: Mutex::new(Maps::default()),
        }
    }

    fn maps(&self) -> std::sync::MutexGuard<'_, Maps> {
        self.maps
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A message from the client.
    pub(crate) fn client_sent(&self, mut message: Value) {
        match message::kind(&message) {
            Kind::Request { id, .. } => {
                let ours = {
                    let mut maps = self.maps();
                    let ours = maps.next_id();
                    maps.client_ids.insert(id.to_string(), ours);
                    maps.client_requests.insert(ours, id);
                    ours
                };
                message["id"] = Value::from(ours);
                let _ = self.upstream.send(message);
            }
            Kind::Notification { method } if method == "notifications/cancelled" => {
                let theirs = message["params"]["requestId"].to_string();
                let Some(ours) = self.maps().client_ids.get(&theirs).copied() else {
                    return; // Already answered, or never sent: nothing to cancel.
                };
                message["params"]["requestId"] = Value::from(ours);
                let _ = self.upstream.send(message);
            }
            Kind::Response { id } => {
                let server_id = id
                    .as_u64()
                    .and_then(|ours| self.maps().server_requests.remove(&ours));
                let Some(server_id) = server_id else {
                    return; // An answer to no request of the server's.
                };
                self.maps().server_ids.remove(&server_id.to_string());
                message["id"] = server_id;
                let _ = self.upstream.send(message);
            }
            Kind::Notification { .. } | Kind::Other => {
                let _ = self.upstream.send(message);
            }
        }
    }

    /// A message from the server.
    pub(crate) fn server_sent(&self, mut message: Value) {
        match message::kind(&message) {
            Kind::Response { id } => {
                let client_id = id
                    .as_u64()
                    .and_then(|ours| self.maps().client_requests.remove(&ours));
                let Some(client_id) = client_id else {
                    return; // An answer to no request of the client's.
                };
                self.maps().client_ids.remove(&client_id.to_string());
                message["id"] = client_id;
                let _ = self.downstream.send(message);
            }
            Kind::Request { id, .. } => {
                let ours = {
                    let mut maps = self.maps();
                    let ours = maps.next_id();
                    maps.server_ids.insert(id.to_string(), ours);
                    maps.server_requests.insert(ours, id);
                    ours
                };
                message["id"] = Value::from(ours);
                let _ = self.downstream.send(message);
            }
            Kind::Notification { method } if method == "notifications/cancelled" => {
                let theirs = message["params"]["requestId"].to_string();
                let Some(ours) = self.maps().server_ids.get(&theirs).copied() else {
                    return;
                };
                message["params"]["requestId"] = Value::from(ours);
                let _ = self.downstream.send(message);
            }
            Kind::Notification { .. } | Kind::Other => {
                let _ = self.downstream.send(message);
            }
        }
    }

    /// The server is gone: every request of the client's still in flight is answered with an
    /// error saying so.
    pub(crate) fn server_gone(&self, why: &str) {
        let pending: Vec<Value> = {
            let mut maps = self.maps();
            maps.client_ids.clear();
            maps.client_requests.drain().map(|(_, id)| id).collect()
        };
        for id in pending {
            let _ = self.downstream.send(message::error(
                &id,
                UPSTREAM_GONE,
                &format!("the upstream server ended: {why}"),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tokio::sync::mpsc;

    /// A client request and a server request cross, each with an id the other side also uses;
    /// both answers reach the side that asked, under its own id, and a cancellation is renamed.
    #[test]
    fn ids_are_renumbered_both_ways_and_cancellations_follow() {
        let (up_tx, mut up) = mpsc::unbounded_channel();
        let (down_tx, mut down) = mpsc::unbounded_channel();
        let proxy = Proxy::new(up_tx, down_tx);

        proxy.client_sent(
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "x"}}),
        );
        let sent = up.try_recv().unwrap();
        let ours = sent["id"].clone();
        assert_eq!(sent["params"], json!({"name": "x"}));

        proxy.server_sent(json!({"jsonrpc": "2.0", "id": 1, "method": "roots/list"}));
        let asked = down.try_recv().unwrap();
        assert_eq!(asked["method"], "roots/list");
        let their_ask = asked["id"].clone();

        proxy.client_sent(json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1, "reason": "timeout"}}));
        let cancel = up.try_recv().unwrap();
        assert_eq!(cancel["params"]["requestId"], ours);
        assert_eq!(cancel["params"]["reason"], "timeout");

        proxy.client_sent(json!({"jsonrpc": "2.0", "id": their_ask, "result": {"roots": []}}));
        assert_eq!(
            up.try_recv().unwrap(),
            json!({"jsonrpc": "2.0", "id": 1, "result": {"roots": []}})
        );

        proxy.server_sent(
            json!({"jsonrpc": "2.0", "id": ours, "result": {"content": [], "extra": true}}),
        );
        assert_eq!(
            down.try_recv().unwrap(),
            json!({"jsonrpc": "2.0", "id": 1, "result": {"content": [], "extra": true}})
        );
        // Answered: a late cancellation and a repeated answer go nowhere.
        proxy.client_sent(json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}));
        proxy.server_sent(json!({"jsonrpc": "2.0", "id": ours, "result": {}}));
        assert!(up.try_recv().is_err());
        assert!(down.try_recv().is_err());
    }

    #[test]
    fn a_server_that_ends_fails_the_requests_in_flight() {
        let (up_tx, _up) = mpsc::unbounded_channel();
        let (down_tx, mut down) = mpsc::unbounded_channel();
        let proxy = Proxy::new(up_tx, down_tx);
        proxy.client_sent(json!({"jsonrpc": "2.0", "id": "a", "method": "tools/list"}));
        proxy.server_gone("exit status 1");
        let answer = down.try_recv().unwrap();
        assert_eq!(answer["id"], "a");
        assert_eq!(answer["error"]["code"], UPSTREAM_GONE);
    }
}
