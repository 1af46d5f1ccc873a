//! The gateway's routing: every message from the client (downstream) goes to the server
//! (upstream) and back, with request ids renumbered on the way so that the gateway can tell
//! whose answer is whose, and cancellations of requests renamed to match.
//!
//! Ids: each request the client sends gets an id of the gateway's own toward the server
//! (`client_requests` maps it back); each request the server sends the client (sampling, roots,
//! elicitation, pings) gets one of the gateway's own toward the client (`server_requests`).
//! Nothing else is changed: a method the gateway does not know, a field it does not know, a
//! progress token (the client's own, carried in the request's `_meta`) go through as they are.

use crate::keyed::{self, Keying, Upstream};
use crate::message::{self, Kind};
use crate::report::{self, Counted};
use idemdb::agent::ToolCallKey;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::Notify;

use crate::message::UPSTREAM_GONE;

/// A keyed call's end, counted when dropped.
struct Settled<'a>(&'a Proxy);

impl Drop for Settled<'_> {
    fn drop(&mut self) {
        self.0.keyed_in_flight.fetch_sub(1, Ordering::AcqRel);
        self.0.keyed_settled.notify_one();
    }
}

/// One client, one server, and the requests in flight between them.
pub(crate) struct Proxy {
    upstream: UnboundedSender<Value>,
    downstream: UnboundedSender<Value>,
    maps: Mutex<Maps>,
    /// How calls are keyed (`None`: a plain proxy).
    keyed: Option<Arc<Keying>>,
    /// Whom this client's keyed calls act for.
    tenant: String,
    /// Keyed calls started and not yet answered to the client.
    keyed_in_flight: AtomicUsize,
    /// Told each time a keyed call is answered.
    keyed_settled: Notify,
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
    /// Gateway id toward the server → the keyed call waiting for that answer.
    keyed: HashMap<u64, std::sync::mpsc::Sender<Value>>,
    /// Gateway ids of the client's `tools/list` requests in flight: their answers say which
    /// tools are read-only.
    tool_lists: std::collections::HashSet<u64>,
    /// The tools the upstream marks `readOnlyHint: true`.
    hinted_read_only: std::collections::HashSet<String>,
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
        keyed: Option<Arc<Keying>>,
        tenant: String,
    ) -> Proxy {
        Proxy {
            upstream,
            downstream,
            maps: Mutex::new(Maps::default()),
            keyed,
            tenant,
            keyed_in_flight: AtomicUsize::new(0),
            keyed_settled: Notify::new(),
        }
    }

    /// How many keyed calls are started and not yet answered.
    pub(crate) fn keyed_in_flight(&self) -> usize {
        self.keyed_in_flight.load(Ordering::Acquire)
    }

    /// Returns once a keyed call was answered since the last time it returned.
    pub(crate) async fn keyed_settled(&self) {
        self.keyed_settled.notified().await;
    }

    fn maps(&self) -> std::sync::MutexGuard<'_, Maps> {
        self.maps
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A message from the client.
    pub(crate) fn client_sent(self: &Arc<Self>, mut message: Value) {
        match message::kind(&message) {
            Kind::Request { id, method } if method == "tools/call" && self.keyed.is_some() => {
                let tool = message["params"]["name"].as_str().unwrap_or("").to_owned();
                if self.read_only(&tool) {
                    report::count(Counted::ReadOnly, &self.tenant, &tool, None);
                    return self.forward_request(id, message);
                }
                match keyed::key_of(&message["params"]) {
                    Ok(Some(key)) => self.keyed_call(id, key, message),
                    Ok(None) if self.keyed.as_ref().is_some_and(|k| k.strict) => {
                        report::count(Counted::Refused, &self.tenant, &tool, None);
                        let _ = self.downstream.send(message::error(
                            &id,
                            keyed::INVALID_PARAMS,
                            "strict mode: this tool's calls must be keyed by the harness \
                             (_meta io.idemdb/task and io.idemdb/step)",
                        ));
                    }
                    Ok(None) => {
                        report::count(Counted::Unkeyed, &self.tenant, &tool, None);
                        self.forward_request(id, message)
                    }
                    Err(why) => {
                        report::count(Counted::Refused, &self.tenant, &tool, None);
                        let _ =
                            self.downstream
                                .send(message::error(&id, keyed::INVALID_PARAMS, &why));
                    }
                }
            }
            Kind::Request { id, .. } => self.forward_request(id, message),
            Kind::Notification { method } if method == "notifications/cancelled" => {
                let Some(theirs) = message::cancelled_request(&message) else {
                    return; // Malformed: there is nothing it could cancel.
                };
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

    /// Whether a call of `tool` is left unkeyed (it has no side effect to do once): by the
    /// gateway's rules, and what the upstream's `tools/list` said of it.
    fn read_only(&self, tool: &str) -> bool {
        let hinted = self.maps().hinted_read_only.contains(tool);
        self.keyed
            .as_ref()
            .is_some_and(|k| k.rules.read_only(tool, hinted))
    }

    /// A request of the client's, forwarded under an id of the gateway's.
    fn forward_request(&self, id: Value, mut message: Value) {
        let ours = {
            let mut maps = self.maps();
            let ours = maps.next_id();
            if message["method"] == "tools/list" {
                maps.tool_lists.insert(ours);
            }
            maps.client_ids.insert(id.to_string(), ours);
            maps.client_requests.insert(ours, id);
            ours
        };
        message["id"] = Value::from(ours);
        let _ = self.upstream.send(message);
    }

    /// A keyed `tools/call`, run through the gateway on a blocking thread (the store's calls
    /// block): claimed, then forwarded, then stored, then answered. The client's cancellation
    /// of it is not forwarded (its id is not in `client_ids`): a call already forwarded runs
    /// to its end, and its result is stored for the retry.
    fn keyed_call(self: &Arc<Self>, id: Value, key: ToolCallKey, message: Value) {
        let Some(keying) = self.keyed.clone() else {
            return;
        };
        let proxy = Arc::clone(self);
        self.keyed_in_flight.fetch_add(1, Ordering::AcqRel);
        tokio::task::spawn_blocking(move || {
            // Settled however this ends, a panic included: a session waits for it to end.
            let _settled = Settled(&proxy);
            let params = message["params"].clone();
            let started = std::time::Instant::now();
            let forward = |key: &str, attempt: &idemdb::Attempt| {
                let (tx, rx) = std::sync::mpsc::channel();
                let ours = {
                    let mut maps = proxy.maps();
                    let ours = maps.next_id();
                    maps.keyed.insert(ours, tx);
                    ours
                };
                let mut forwarded = message.clone();
                forwarded["id"] = Value::from(ours);
                if !forwarded["params"]["_meta"].is_object() {
                    forwarded["params"]["_meta"] = serde_json::json!({});
                }
                forwarded["params"]["_meta"][keyed::KEY] = Value::from(key);
                if proxy.upstream.send(forwarded).is_err() {
                    // The upstream's link is closed: the call never reached it.
                    proxy.maps().keyed.remove(&ours);
                    return Upstream::Answered(message::error(
                        &Value::from(ours),
                        UPSTREAM_GONE,
                        "the upstream server has ended",
                    ));
                }
                keyed::await_answer(&rx, attempt, keying.renew_every())
            };
            let (reply, counted) = keyed::call(&keying, &proxy.tenant, &key, &id, &params, forward);
            let waited = (counted != Counted::Executed).then(|| started.elapsed());
            report::count_keyed(counted, &proxy.tenant, &key, waited);
            let _ = proxy.downstream.send(reply);
        });
    }

    /// A message from the server.
    pub(crate) fn server_sent(&self, mut message: Value) {
        match message::kind(&message) {
            Kind::Response { id } => {
                let waiting = id.as_u64().and_then(|ours| self.maps().keyed.remove(&ours));
                if let Some(waiting) = waiting {
                    let _ = waiting.send(message);
                    return;
                }
                if let Some(ours) = id.as_u64() {
                    self.note_tools(ours, &message);
                }
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
                let Some(theirs) = message::cancelled_request(&message) else {
                    return;
                };
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

    /// Notes which tools an answer to a `tools/list` says are read-only (page by page).
    fn note_tools(&self, ours: u64, response: &Value) {
        let mut maps = self.maps();
        if !maps.tool_lists.remove(&ours) {
            return;
        }
        for tool in response["result"]["tools"].as_array().into_iter().flatten() {
            let Some(name) = tool["name"].as_str() else {
                continue;
            };
            if tool["annotations"]["readOnlyHint"] == Value::Bool(true) {
                maps.hinted_read_only.insert(name.to_owned());
            } else {
                maps.hinted_read_only.remove(name);
            }
        }
    }

    /// The server is gone: every request of the client's still in flight is answered with an
    /// error saying so.
    pub(crate) fn server_gone(&self, why: &str) {
        let pending: Vec<Value> = {
            let mut maps = self.maps();
            // Keyed calls in flight hear that their answer is lost.
            maps.keyed.clear();
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
        let proxy = Arc::new(Proxy::new(up_tx, down_tx, None, "t".into()));

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

    /// A tool the upstream's `tools/list` marks read-only is forwarded as it is, keys or not.
    #[test]
    fn a_read_only_tool_is_never_keyed() {
        let (up_tx, mut up) = mpsc::unbounded_channel();
        let (down_tx, _down) = mpsc::unbounded_channel();
        let store = idemdb::Store::in_memory().unwrap();
        let proxy = Arc::new(Proxy::new(
            up_tx,
            down_tx,
            Some(Arc::new(Keying {
                gateway: idemdb::agent::Gateway::new(store),
                rules: Default::default(),
                strict: false,
            })),
            "t".into(),
        ));
        proxy.client_sent(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}));
        let ours = up.try_recv().unwrap()["id"].clone();
        proxy.server_sent(json!({"jsonrpc": "2.0", "id": ours, "result": {"tools": [
            {"name": "peek", "annotations": {"readOnlyHint": true}},
            {"name": "pay", "annotations": {"readOnlyHint": false}},
        ]}}));
        let meta = json!({"io.idemdb/task": "t", "io.idemdb/step": 1});
        proxy.client_sent(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "peek", "arguments": {}, "_meta": meta}}));
        let sent = up.try_recv().unwrap();
        assert_eq!(sent["params"]["name"], "peek");
        assert!(
            sent["params"]["_meta"].get("io.idemdb/key").is_none(),
            "{sent}"
        );
    }

    /// Strict mode: a call of a keyed tool without a key is refused, and a retry of a step with
    /// other arguments is refused; neither reaches the upstream.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn strict_mode_refuses_unkeyed_calls_and_changed_arguments() {
        let (up_tx, mut up) = mpsc::unbounded_channel();
        let (down_tx, mut down) = mpsc::unbounded_channel();
        let proxy = Arc::new(Proxy::new(
            up_tx,
            down_tx,
            Some(Arc::new(Keying {
                gateway: idemdb::agent::Gateway::builder(idemdb::Store::in_memory().unwrap())
                    .argument_policy(idemdb::agent::ArgumentPolicy::Strict)
                    .build(),
                rules: Default::default(),
                strict: true,
            })),
            "t".into(),
        ));
        let call = |id: u64, amount: u64, meta: Value| {
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": "pay", "arguments": {"amount": amount}, "_meta": meta}})
        };
        let meta = json!({"io.idemdb/task": "t", "io.idemdb/step": 1});

        proxy.client_sent(call(1, 5, json!({})));
        let refused = down.recv().await.unwrap();
        assert_eq!(refused["error"]["code"], keyed::INVALID_PARAMS, "{refused}");

        proxy.client_sent(call(2, 5, meta.clone()));
        let forwarded = up.recv().await.unwrap();
        assert_eq!(forwarded["params"]["_meta"]["io.idemdb/key"], "tc1:t:1:pay");
        proxy.server_sent(json!({"jsonrpc": "2.0", "id": forwarded["id"],
            "result": {"content": [{"type": "text", "text": "paid"}]}}));
        let answered = down.recv().await.unwrap();
        assert_eq!(answered["id"], 2);
        assert_eq!(answered["result"]["content"][0]["text"], "paid");

        proxy.client_sent(call(3, 6, meta));
        let mismatch = down.recv().await.unwrap();
        assert_eq!(mismatch["id"], 3);
        assert_eq!(
            mismatch["error"]["code"],
            keyed::INVALID_PARAMS,
            "{mismatch}"
        );
        assert!(up.try_recv().is_err(), "nothing else reached the upstream");
    }

    /// Odd messages from either side, in any order, never panic the proxy. A cancellation
    /// whose `params` was a string, sent while a request with id `null` was in flight, panicked
    /// it (the renamed id was written into the string).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hostile_messages_never_panic_the_proxy() {
        let (up_tx, _up) = mpsc::unbounded_channel();
        let (down_tx, _down) = mpsc::unbounded_channel();
        let proxy = Arc::new(Proxy::new(
            up_tx,
            down_tx,
            Some(Arc::new(Keying {
                gateway: idemdb::agent::Gateway::new(idemdb::Store::in_memory().unwrap()),
                rules: Default::default(),
                strict: false,
            })),
            "t".into(),
        ));
        let hostile = [
            json!({"jsonrpc": "2.0", "id": null, "method": "tools/list"}),
            json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": "x"}),
            json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": [1]}),
            json!({"jsonrpc": "2.0", "method": "notifications/cancelled"}),
            json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": {"a": 1}}}),
            json!({"jsonrpc": "2.0", "id": {"a": 1}, "method": "tools/call", "params": "x"}),
            json!({"jsonrpc": "2.0", "id": [1], "method": "tools/call", "params": {"name": 7}}),
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "x", "_meta": "m"}}),
            json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"_meta": {"io.idemdb/task": "t", "io.idemdb/step": 1}}}),
            json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "x", "_meta": {"io.idemdb/task": [], "io.idemdb/step": {}}}}),
            json!({"jsonrpc": "2.0", "id": 1, "result": "not an object"}),
            json!({"jsonrpc": "2.0", "id": "nobody", "error": 5}),
            json!({"jsonrpc": "2.0", "id": 1, "result": {"tools": "no"}}),
            json!({"jsonrpc": "2.0", "id": 1, "result": {"tools": [1, {"name": 2}, {"annotations": 3}]}}),
            json!({"jsonrpc": "2.0", "id": null, "method": "roots/list", "params": 1}),
            json!([1, 2, 3]),
            json!("text"),
            json!(null),
            json!({}),
        ];
        for message in &hostile {
            proxy.client_sent(message.clone());
            proxy.server_sent(message.clone());
        }
        for message in hostile.iter().rev() {
            proxy.server_sent(message.clone());
            proxy.client_sent(message.clone());
        }
        proxy.server_gone("the test ended");
    }

    /// A keyed call whose upstream's link is already closed never reached it: it is answered
    /// -32000 and its key released, so the retry through a live upstream runs the tool (it is
    /// neither replayed nor told the outcome is unknown).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_keyed_call_that_never_reached_its_upstream_releases_its_key() {
        let keying = Arc::new(Keying {
            gateway: idemdb::agent::Gateway::builder(
                idemdb::Store::builder()
                    .stale_policy(idemdb::StalePolicy::Keep)
                    .in_memory()
                    .unwrap(),
            )
            .build(),
            rules: Default::default(),
            strict: false,
        });
        let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "pay", "arguments": {}, "_meta": {"io.idemdb/task": "t", "io.idemdb/step": 1}}});

        let (closed_tx, closed) = mpsc::unbounded_channel();
        drop(closed);
        let (down_tx, mut down) = mpsc::unbounded_channel();
        let gone = Arc::new(Proxy::new(
            closed_tx,
            down_tx,
            Some(Arc::clone(&keying)),
            "t".into(),
        ));
        gone.client_sent(call.clone());
        let refused = down.recv().await.unwrap();
        assert_eq!(refused["error"]["code"], UPSTREAM_GONE, "{refused}");

        let (up_tx, mut up) = mpsc::unbounded_channel();
        let (down_tx, mut down) = mpsc::unbounded_channel();
        let live = Arc::new(Proxy::new(up_tx, down_tx, Some(keying), "t".into()));
        live.client_sent(call);
        let forwarded = up.recv().await.expect("the retry reaches the upstream");
        live.server_sent(
            json!({"jsonrpc": "2.0", "id": forwarded["id"], "result": {"content": []}}),
        );
        let answered = down.recv().await.unwrap();
        assert!(
            answered["result"]["_meta"].get(keyed::REPLAYED).is_none(),
            "{answered}"
        );
    }

    #[test]
    fn a_server_that_ends_fails_the_requests_in_flight() {
        let (up_tx, _up) = mpsc::unbounded_channel();
        let (down_tx, mut down) = mpsc::unbounded_channel();
        let proxy = Arc::new(Proxy::new(up_tx, down_tx, None, "t".into()));
        proxy.client_sent(json!({"jsonrpc": "2.0", "id": "a", "method": "tools/list"}));
        proxy.server_gone("exit status 1");
        let answer = down.try_recv().unwrap();
        assert_eq!(answer["id"], "a");
        assert_eq!(answer["error"]["code"], UPSTREAM_GONE);
    }
}
