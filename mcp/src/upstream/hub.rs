//! The hub: several upstream links presented as one [`Link`], so that the proxy, keying and
//! sessions work with several upstreams unchanged.
//!
//! Toward the client, tools and prompts are named `NAME__tool` (the prefix is stripped toward
//! the upstream); resources keep their URIs and are routed by them, to the upstream whose
//! `resources/list` or `resources/templates/list` listed them. `initialize` goes to every
//! upstream and its answer unites their capabilities under the gateway's own `serverInfo`; the
//! four lists fan out, every page of each upstream is gathered, and one merged list is answered
//! (without a cursor). `tools/call`, `prompts/get`, `completion/complete` and the resource
//! requests are routed by name or URI; `ping` is answered here; `logging/setLevel` and
//! notifications go to all. Requests an upstream sends the client get hub ids, and their
//! answers go back to the upstream that asked.
//!
//! Ids: every request sent to an upstream gets a hub id (`calls` says whose answer it is), and
//! every request an upstream sends the client gets one too (`asks`). An upstream that ends has
//! its requests in flight answered with [`message::lost`] (a keyed call among them has an
//! unknown outcome); a later request routed to it gets a plain [`message::error`] at once (it
//! never reached an upstream). The others keep working; the hub's link ends when all ended.

use crate::config::SEPARATOR;
use crate::link::{self, Ending, Link, Peer};
use crate::message::{self, Kind, UPSTREAM_GONE};
use serde_json::{json, Map, Value};
use std::collections::{HashMap, HashSet};
use std::time::Duration;
use tokio::sync::mpsc::{self, UnboundedSender};
use tokio::task::JoinHandle;

const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;
/// MCP's code for a resource no server has.
const RESOURCE_NOT_FOUND: i64 = -32002;
/// The most pages gathered from one upstream for one list: a server whose cursors never end
/// must not hold the hub forever.
const MAX_PAGES: usize = 1000;
/// How long the upstreams get to end (a child to exit, an HTTP session to be deleted) once the
/// gateway let go of the hub.
const CLOSING: Duration = Duration::from_secs(5);

/// Presents `upstreams` (each by its name) as one link. The handle finishes once the hub is
/// done: all upstreams ended, or the gateway let go of the link and the upstreams were given
/// [`CLOSING`] to end.
pub(crate) fn start(upstreams: Vec<(String, Link)>) -> (Link, JoinHandle<()>) {
    let (link, peer) = link::pair();
    let (events_tx, events) = mpsc::unbounded_channel();
    let mut entries = Vec::new();
    for (index, (name, upstream)) in upstreams.into_iter().enumerate() {
        let Link {
            outgoing,
            mut incoming,
            ended,
        } = upstream;
        let events = events_tx.clone();
        tokio::spawn(async move {
            while let Some(message) = incoming.recv().await {
                let _ = events.send(Event::Message(index, message));
            }
            let ending = ended
                .await
                .unwrap_or_else(|_| Ending::new("the upstream ended", 1));
            let _ = events.send(Event::Ended(index, ending));
        });
        entries.push(Upstream {
            name,
            to: Some(outgoing),
            capabilities: None,
            resources: HashSet::new(),
            templates: Vec::new(),
        });
    }
    drop(events_tx);
    let done = tokio::spawn(run(entries, peer, events));
    (link, done)
}

/// What an upstream's reader tells the hub.
enum Event {
    Message(usize, Value),
    Ended(usize, Ending),
}

/// One upstream, as the hub knows it.
struct Upstream {
    name: String,
    /// `None` once it ended.
    to: Option<UnboundedSender<Value>>,
    /// What its initialize answer offered.
    capabilities: Option<Value>,
    /// The URIs its `resources/list` gave, and the URI templates of its
    /// `resources/templates/list`.
    resources: HashSet<String>,
    templates: Vec<String>,
}

/// What an answer from an upstream is for.
struct Call {
    upstream: usize,
    to: Answer,
}

enum Answer {
    /// The client's request, routed to one upstream: its answer goes back under this id.
    Client(Value),
    /// One upstream's part of a gathered request.
    Part { gather: u64, method: String },
}

/// A request fanned out to several upstreams, answered once all have.
struct Gather {
    client_id: Value,
    list: List,
    /// Parts not answered yet.
    waiting: usize,
    /// Each upstream's items (lists) or result (initialize), in the upstreams' order.
    gathered: Vec<Vec<Value>>,
    pages: Vec<usize>,
    /// The first error an upstream answered.
    error: Option<Value>,
    answered: usize,
}

/// The requests that fan out.
#[derive(Clone, Copy, PartialEq)]
enum List {
    Initialize,
    Tools,
    Prompts,
    Resources,
    Templates,
    SetLevel,
}

impl List {
    fn of(method: &str) -> Option<List> {
        Some(match method {
            "initialize" => List::Initialize,
            "tools/list" => List::Tools,
            "prompts/list" => List::Prompts,
            "resources/list" => List::Resources,
            "resources/templates/list" => List::Templates,
            "logging/setLevel" => List::SetLevel,
            _ => return None,
        })
    }

    /// The capability an upstream must offer to be asked (`None`: all are asked).
    fn capability(self) -> Option<&'static str> {
        match self {
            List::Initialize => None,
            List::Tools => Some("tools"),
            List::Prompts => Some("prompts"),
            List::Resources | List::Templates => Some("resources"),
            List::SetLevel => Some("logging"),
        }
    }

    /// The member of a result that holds the list's items.
    fn member(self) -> Option<&'static str> {
        match self {
            List::Tools => Some("tools"),
            List::Prompts => Some("prompts"),
            List::Resources => Some("resources"),
            List::Templates => Some("resourceTemplates"),
            List::Initialize | List::SetLevel => None,
        }
    }
}

struct Hub {
    upstreams: Vec<Upstream>,
    /// Messages to the gateway (the proxy); `None` once every upstream ended.
    to_client: Option<UnboundedSender<Value>>,
    next: u64,
    /// Hub id toward an upstream → what its answer is for.
    calls: HashMap<u64, Call>,
    /// The client's id (as JSON text) → the hub id its routed request went under.
    client_ids: HashMap<String, u64>,
    gathers: HashMap<u64, Gather>,
    /// Hub id toward the client → the upstream that asked, and its id.
    asks: HashMap<u64, (usize, Value)>,
    /// (upstream, its id as JSON text) → the hub id toward the client.
    ask_ids: HashMap<(usize, String), u64>,
}

async fn run(upstreams: Vec<Upstream>, peer: Peer, mut events: mpsc::UnboundedReceiver<Event>) {
    let Peer {
        mut outgoing,
        incoming,
        ended,
    } = peer;
    let mut hub = Hub {
        upstreams,
        to_client: Some(incoming),
        next: 0,
        calls: HashMap::new(),
        client_ids: HashMap::new(),
        gathers: HashMap::new(),
        asks: HashMap::new(),
        ask_ids: HashMap::new(),
    };
    let mut last = Ending::new("no upstream", 1);
    loop {
        tokio::select! {
            message = outgoing.recv() => match message {
                Some(message) => hub.client_sent(message),
                None => break,
            },
            event = events.recv() => match event {
                Some(Event::Message(index, message)) => hub.upstream_sent(index, message),
                Some(Event::Ended(index, ending)) => {
                    hub.upstream_ended(index, &ending.why);
                    last = ending;
                }
                None => {
                    hub.to_client = None;
                    let why = format!("every upstream ended (the last: {})", last.why);
                    let _ = ended.send(Ending::new(why, last.code));
                    return;
                }
            },
        }
    }
    // The gateway let go: the upstreams are told (a child's stdin closes, an HTTP session is
    // deleted) and given a while to end.
    for upstream in &mut hub.upstreams {
        upstream.to = None;
    }
    let _ = tokio::time::timeout(CLOSING, async { while events.recv().await.is_some() {} }).await;
}

impl Hub {
    fn next_id(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    fn answer(&self, message: Value) {
        if let Some(to_client) = &self.to_client {
            let _ = to_client.send(message);
        }
    }

    fn error(&self, id: &Value, code: i64, why: &str) {
        self.answer(message::error(id, code, why));
    }

    /// Sends `message` to upstream `index`; `false` if it has ended.
    fn send(&self, index: usize, message: Value) -> bool {
        self.upstreams[index]
            .to
            .as_ref()
            .is_some_and(|to| to.send(message).is_ok())
    }

    /// A message from the client (through the proxy).
    fn client_sent(&mut self, mut message: Value) {
        match message::kind(&message) {
            Kind::Request { id, method } => self.client_request(id, &method, message),
            Kind::Notification { method } if method == "notifications/cancelled" => {
                let theirs = message["params"]["requestId"].to_string();
                let Some(&ours) = self.client_ids.get(&theirs) else {
                    return; // Answered, gathered, or never sent.
                };
                let Some(upstream) = self.calls.get(&ours).map(|c| c.upstream) else {
                    return;
                };
                if set_request_id(&mut message, ours) {
                    self.send(upstream, message);
                }
            }
            Kind::Notification { .. } => {
                for index in 0..self.upstreams.len() {
                    self.send(index, message.clone());
                }
            }
            Kind::Response { id } => {
                let Some((upstream, theirs)) = id.as_u64().and_then(|ours| self.asks.remove(&ours))
                else {
                    return; // An answer to no upstream's request.
                };
                self.ask_ids.remove(&(upstream, theirs.to_string()));
                message["id"] = theirs;
                self.send(upstream, message);
            }
            Kind::Other => {
                eprintln!("idemdb-mcp: the hub dropped a message that is no JSON-RPC message");
            }
        }
    }

    fn client_request(&mut self, id: Value, method: &str, mut message: Value) {
        if method == "ping" {
            return self.answer(json!({"jsonrpc": "2.0", "id": id, "result": {}}));
        }
        // Tasks (2025-11-25) name a task by the server's own id, and the hub cannot tell which
        // upstream's it is: not offered, and `initialize`'s answer does not offer them.
        if method.starts_with("tasks/") {
            return self.error(
                &id,
                METHOD_NOT_FOUND,
                "tasks are not offered by this gateway",
            );
        }
        let routed_by_params = matches!(
            method,
            "tools/call"
                | "prompts/get"
                | "completion/complete"
                | "resources/read"
                | "resources/subscribe"
                | "resources/unsubscribe"
        );
        // Routing renames within params: they must be an object (a peer's odd message must
        // not reach an index that panics).
        if routed_by_params && !message["params"].is_object() {
            return self.error(&id, INVALID_PARAMS, "params must be an object");
        }
        if let Some(list) = List::of(method) {
            if list.member().is_some() && !message["params"]["cursor"].is_null() {
                return self.error(
                    &id,
                    INVALID_PARAMS,
                    "this gateway answers whole lists: it gives no cursor to page with",
                );
            }
            return self.gather(id, list, &message);
        }
        let routed = match method {
            "tools/call" | "prompts/get" => self.by_name(&mut message["params"]["name"]),
            "completion/complete" => match message["params"]["ref"]["type"].as_str() {
                Some("ref/prompt") => self.by_name(&mut message["params"]["ref"]["name"]),
                Some("ref/resource") => self.by_uri(&message["params"]["ref"]["uri"]),
                _ => Err((
                    INVALID_PARAMS,
                    "a completion's ref must be ref/prompt or ref/resource".into(),
                )),
            },
            "resources/read" | "resources/subscribe" | "resources/unsubscribe" => {
                self.by_uri(&message["params"]["uri"])
            }
            _ => Err((
                METHOD_NOT_FOUND,
                format!("{method}: not offered by this gateway across several upstreams"),
            )),
        };
        match routed {
            Ok(upstream) => self.route(upstream, id, message),
            Err((code, why)) => self.error(&id, code, &why),
        }
    }

    /// The upstream a `NAME__name` belongs to; the name is stripped of its prefix in place.
    fn by_name(&self, name: &mut Value) -> Result<usize, (i64, String)> {
        let full = name.as_str().unwrap_or_default().to_owned();
        let found = full.split_once(SEPARATOR).and_then(|(prefix, own)| {
            let index = self.upstreams.iter().position(|u| u.name == prefix)?;
            Some((index, own.to_owned()))
        });
        let Some((index, own)) = found else {
            return Err((
                INVALID_PARAMS,
                format!("{full:?}: no upstream of this gateway has it (names are UPSTREAM__name)"),
            ));
        };
        *name = Value::from(own);
        Ok(index)
    }

    /// The upstream that listed the resource `uri`: by its resources, then its templates, and
    /// when a single upstream offers resources at all, that one.
    fn by_uri(&self, uri: &Value) -> Result<usize, (i64, String)> {
        let uri = uri.as_str().unwrap_or_default();
        let listed = self
            .upstreams
            .iter()
            .position(|u| u.resources.contains(uri))
            .or_else(|| {
                self.upstreams
                    .iter()
                    .position(|u| u.templates.iter().any(|t| template_matches(t, uri)))
            });
        if let Some(index) = listed {
            return Ok(index);
        }
        let offering: Vec<usize> = (0..self.upstreams.len())
            .filter(|&i| {
                self.upstreams[i]
                    .capabilities
                    .as_ref()
                    .is_some_and(|c| c.get("resources").is_some())
            })
            .collect();
        match offering[..] {
            [only] => Ok(only),
            _ => Err((
                RESOURCE_NOT_FOUND,
                format!("{uri:?}: no upstream listed this resource"),
            )),
        }
    }

    /// Sends the client's request to one upstream under a hub id.
    fn route(&mut self, upstream: usize, id: Value, mut message: Value) {
        if self.upstreams[upstream].to.is_none() {
            let why = format!("the upstream {} has ended", self.upstreams[upstream].name);
            return self.error(&id, UPSTREAM_GONE, &why);
        }
        let ours = self.next_id();
        message["id"] = Value::from(ours);
        self.client_ids.insert(id.to_string(), ours);
        self.calls.insert(
            ours,
            Call {
                upstream,
                to: Answer::Client(id.clone()),
            },
        );
        if !self.send(upstream, message) {
            // Its link closed before the hub heard it ended: the request never left.
            self.calls.remove(&ours);
            self.client_ids.remove(&id.to_string());
            let why = format!("the upstream {} has ended", self.upstreams[upstream].name);
            self.error(&id, UPSTREAM_GONE, &why);
        }
    }

    /// Fans a request out to every live upstream that offers what it asks for.
    fn gather(&mut self, id: Value, list: List, message: &Value) {
        let asked: Vec<usize> = (0..self.upstreams.len())
            .filter(|&i| {
                let upstream = &self.upstreams[i];
                upstream.to.is_some()
                    && match (list.capability(), &upstream.capabilities) {
                        (Some(capability), Some(offered)) => offered.get(capability).is_some(),
                        _ => true,
                    }
            })
            .collect();
        let method = message["method"].as_str().unwrap_or_default().to_owned();
        let gather = self.next_id();
        self.gathers.insert(
            gather,
            Gather {
                client_id: id,
                list,
                waiting: 0,
                gathered: vec![Vec::new(); self.upstreams.len()],
                pages: vec![0; self.upstreams.len()],
                error: None,
                answered: 0,
            },
        );
        for index in asked {
            let mut part = message.clone();
            if list.member().is_some() {
                // Each upstream pages on its own; the client's params (a `_meta`) go along.
                if let Some(params) = part.get_mut("params").and_then(Value::as_object_mut) {
                    params.remove("cursor");
                }
            }
            self.ask_part(gather, index, &method, part);
        }
        self.finish_if_done(gather);
    }

    /// Sends one upstream its part of a gathered request.
    fn ask_part(&mut self, gather: u64, upstream: usize, method: &str, mut part: Value) {
        let ours = self.next_id();
        part["id"] = Value::from(ours);
        if !self.send(upstream, part) {
            return;
        }
        self.calls.insert(
            ours,
            Call {
                upstream,
                to: Answer::Part {
                    gather,
                    method: method.to_owned(),
                },
            },
        );
        if let Some(gathering) = self.gathers.get_mut(&gather) {
            gathering.waiting += 1;
        }
    }

    /// A message from upstream `index`.
    fn upstream_sent(&mut self, index: usize, mut message: Value) {
        match message::kind(&message) {
            Kind::Response { id } => {
                let Some(call) = id.as_u64().and_then(|ours| self.calls.remove(&ours)) else {
                    return; // An answer to no request of the hub's.
                };
                match call.to {
                    Answer::Client(client_id) => {
                        self.client_ids.remove(&client_id.to_string());
                        message["id"] = client_id;
                        self.answer(message);
                    }
                    Answer::Part { gather, method } => {
                        self.part_answered(gather, index, &method, &message)
                    }
                }
            }
            Kind::Request { id, .. } => {
                let ours = self.next_id();
                self.ask_ids.insert((index, id.to_string()), ours);
                self.asks.insert(ours, (index, id));
                message["id"] = Value::from(ours);
                self.answer(message);
            }
            Kind::Notification { method } if method == "notifications/cancelled" => {
                let theirs = message["params"]["requestId"].to_string();
                let Some(ours) = self.ask_ids.remove(&(index, theirs)) else {
                    return;
                };
                self.asks.remove(&ours);
                if set_request_id(&mut message, ours) {
                    self.answer(message);
                }
            }
            // Progress (the client's own tokens), logging, list_changed, resource updates.
            Kind::Notification { .. } => self.answer(message),
            Kind::Other => {
                let name = &self.upstreams[index].name;
                eprintln!(
                    "idemdb-mcp: the upstream {name} sent a message that is no JSON-RPC message"
                );
            }
        }
    }

    /// Upstream `index` answered its part of `gather`: its items are kept (named for the
    /// client), and its next page asked for.
    fn part_answered(&mut self, gather: u64, index: usize, method: &str, answer: &Value) {
        let Some(list) = self.gathers.get(&gather).map(|g| g.list) else {
            return;
        };
        let mut next_page = None;
        if let Some(error) = answer.get("error") {
            let name = &self.upstreams[index].name;
            eprintln!("idemdb-mcp: the upstream {name} answered {method} with an error: {error}");
            if let Some(gathering) = self.gathers.get_mut(&gather) {
                gathering.error.get_or_insert_with(|| error.clone());
            }
        } else {
            let result = &answer["result"];
            let items = self.take_items(index, list, result);
            let Some(gathering) = self.gathers.get_mut(&gather) else {
                return;
            };
            gathering.gathered[index].extend(items);
            gathering.pages[index] += 1;
            match result["nextCursor"].as_str() {
                Some(cursor) if !cursor.is_empty() && gathering.pages[index] < MAX_PAGES => {
                    next_page = Some(cursor.to_owned());
                }
                _ => gathering.answered += 1,
            }
        }
        if let Some(gathering) = self.gathers.get_mut(&gather) {
            gathering.waiting -= 1;
        }
        if let Some(cursor) = next_page {
            let page =
                json!({"jsonrpc": "2.0", "id": 0, "method": method, "params": {"cursor": cursor}});
            self.ask_part(gather, index, method, page);
        }
        self.finish_if_done(gather);
    }

    /// The items of one page of upstream `index`'s answer, as the client sees them; notes what
    /// the hub routes by (capabilities, resource URIs and templates).
    fn take_items(&mut self, index: usize, list: List, result: &Value) -> Vec<Value> {
        let upstream = &mut self.upstreams[index];
        let Some(member) = list.member() else {
            if list == List::Initialize {
                upstream.capabilities = Some(result["capabilities"].clone());
                return vec![result.clone()];
            }
            return Vec::new();
        };
        let mut items = result[member].as_array().cloned().unwrap_or_default();
        for item in &mut items {
            match list {
                List::Tools | List::Prompts => {
                    if let Some(name) = item["name"].as_str() {
                        item["name"] = Value::from(format!("{}{SEPARATOR}{name}", upstream.name));
                    }
                }
                List::Resources => {
                    if let Some(uri) = item["uri"].as_str() {
                        upstream.resources.insert(uri.to_owned());
                    }
                }
                List::Templates => {
                    if let Some(template) = item["uriTemplate"].as_str() {
                        if !upstream.templates.iter().any(|t| t == template) {
                            upstream.templates.push(template.to_owned());
                        }
                    }
                }
                List::Initialize | List::SetLevel => {}
            }
        }
        items
    }

    /// Answers a gathered request once every part is in.
    fn finish_if_done(&mut self, gather: u64) {
        if self.gathers.get(&gather).is_none_or(|g| g.waiting > 0) {
            return;
        }
        let Some(gathering) = self.gathers.remove(&gather) else {
            return;
        };
        let id = &gathering.client_id;
        if gathering.answered == 0 {
            if let Some(error) = gathering.error {
                return self.answer(json!({"jsonrpc": "2.0", "id": id, "error": error}));
            }
            if gathering.list == List::Initialize {
                return self.error(id, UPSTREAM_GONE, "no upstream of this gateway answered");
            }
        }
        let result = match gathering.list {
            List::Initialize => self.initialized(&gathering.gathered),
            List::SetLevel => json!({}),
            list => {
                let items: Vec<Value> = gathering.gathered.into_iter().flatten().collect();
                json!({ list.member().unwrap_or_default(): items })
            }
        };
        self.answer(json!({"jsonrpc": "2.0", "id": id, "result": result}));
    }

    /// The hub's initialize answer: the upstreams' capabilities united, the lowest protocol
    /// version they agreed to (dates compare as text), and the gateway's own `serverInfo`.
    fn initialized(&self, results: &[Vec<Value>]) -> Value {
        let mut version: Option<&str> = None;
        let mut capabilities = Map::new();
        let mut instructions = Vec::new();
        for (index, result) in results.iter().enumerate() {
            let Some(result) = result.first() else {
                continue;
            };
            if let Some(theirs) = result["protocolVersion"].as_str() {
                version = Some(version.map_or(theirs, |v| v.min(theirs)));
            }
            if let Some(text) = result["instructions"].as_str() {
                instructions.push(format!("{}: {text}", self.upstreams[index].name));
            }
            let offered = &result["capabilities"];
            for (capability, flags) in [
                ("tools", &["listChanged"][..]),
                ("prompts", &["listChanged"]),
                ("resources", &["subscribe", "listChanged"]),
                ("logging", &[]),
                ("completions", &[]),
            ] {
                if offered.get(capability).is_none() {
                    continue;
                }
                let united = capabilities.entry(capability).or_insert_with(|| json!({}));
                for &flag in flags {
                    if offered[capability][flag] == Value::Bool(true) {
                        united[flag] = Value::Bool(true);
                    }
                }
            }
        }
        let mut result = json!({
            "protocolVersion": version,
            "capabilities": capabilities,
            "serverInfo": {"name": "idemdb-mcp", "version": env!("CARGO_PKG_VERSION")},
        });
        if !instructions.is_empty() {
            result["instructions"] = Value::from(instructions.join("\n\n"));
        }
        result
    }

    /// Upstream `index` ended: its requests in flight are answered as lost, its parts of
    /// gathered requests count as answered with nothing, and what it asked the client is
    /// forgotten.
    fn upstream_ended(&mut self, index: usize, why: &str) {
        let name = self.upstreams[index].name.clone();
        eprintln!("idemdb-mcp: the upstream {name} ended: {why}");
        self.upstreams[index].to = None;
        let ours: Vec<u64> = self
            .calls
            .iter()
            .filter(|(_, call)| call.upstream == index)
            .map(|(&ours, _)| ours)
            .collect();
        let why = format!("the upstream {name} ended: {why}");
        for ours in ours {
            let Some(call) = self.calls.remove(&ours) else {
                continue;
            };
            match call.to {
                Answer::Client(client_id) => {
                    self.client_ids.remove(&client_id.to_string());
                    self.answer(message::lost(&client_id, &why));
                }
                Answer::Part { gather, .. } => {
                    if let Some(gathering) = self.gathers.get_mut(&gather) {
                        gathering.waiting -= 1;
                    }
                    self.finish_if_done(gather);
                }
            }
        }
        self.asks.retain(|_, (upstream, _)| *upstream != index);
        self.ask_ids.retain(|(upstream, _), _| *upstream != index);
    }
}

/// Renames the request a cancellation is of; `false` if its params are not an object.
fn set_request_id(cancellation: &mut Value, id: u64) -> bool {
    match cancellation
        .get_mut("params")
        .and_then(Value::as_object_mut)
    {
        Some(params) => {
            params.insert("requestId".into(), Value::from(id));
            true
        }
        None => false,
    }
}

/// Whether `uri` is one of the URIs an RFC 6570 `template` makes: its literal parts in order,
/// each `{...}` standing for any text.
fn template_matches(template: &str, uri: &str) -> bool {
    let mut literals = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        literals.push(&rest[..open]);
        match rest[open..].find('}') {
            Some(close) => rest = &rest[open + close + 1..],
            None => return false,
        }
    }
    let last = rest;
    let Some((first, middle)) = literals.split_first() else {
        return template == uri;
    };
    let Some(mut remaining) = uri.strip_prefix(first) else {
        return false;
    };
    for literal in middle {
        match remaining.find(literal) {
            Some(at) => remaining = &remaining[at + literal.len()..],
            None => return false,
        }
    }
    remaining.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc::UnboundedReceiver;

    /// A fake upstream: what the hub sends it, and its side of the link.
    struct Fake {
        from_hub: UnboundedReceiver<Value>,
        to_hub: Option<UnboundedSender<Value>>,
        ended: Option<tokio::sync::oneshot::Sender<Ending>>,
    }

    impl Fake {
        async fn next(&mut self) -> Value {
            self.from_hub
                .recv()
                .await
                .expect("a message for the upstream")
        }
        fn say(&self, message: Value) {
            self.to_hub.as_ref().unwrap().send(message).unwrap();
        }
        fn end(&mut self) {
            self.to_hub = None;
            let _ = self.ended.take().unwrap().send(Ending::new("killed", 9));
        }
    }

    fn hub(names: &[&str]) -> (Link, Vec<Fake>) {
        let mut links = Vec::new();
        let mut fakes = Vec::new();
        for name in names {
            let (link, peer) = link::pair();
            links.push((name.to_string(), link));
            fakes.push(Fake {
                from_hub: peer.outgoing,
                to_hub: Some(peer.incoming),
                ended: Some(peer.ended),
            });
        }
        (start(links).0, fakes)
    }

    fn request(id: u64, method: &str, params: Value) -> Value {
        json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
    }

    #[tokio::test]
    async fn initialize_unites_and_lists_merge_every_page_with_prefixed_names() {
        let (mut link, mut fakes) = hub(&["a", "b"]);
        link.outgoing
            .send(request(
                1,
                "initialize",
                json!({"protocolVersion": "2025-11-25"}),
            ))
            .unwrap();
        for (fake, caps, version) in fakes
            .iter_mut()
            .zip([
                json!({"tools": {"listChanged": true}}),
                json!({"tools": {}, "resources": {"subscribe": true}}),
            ])
            .zip(["2025-11-25", "2025-06-18"])
            .map(|((f, c), v)| (f, c, v))
        {
            let asked = fake.next().await;
            assert_eq!(asked["params"]["protocolVersion"], "2025-11-25");
            fake.say(json!({"jsonrpc": "2.0", "id": asked["id"], "result": {
                "protocolVersion": version, "capabilities": caps, "serverInfo": {"name": "x"}}}));
        }
        let answer = link.incoming.recv().await.unwrap();
        assert_eq!(answer["id"], 1);
        assert_eq!(answer["result"]["protocolVersion"], "2025-06-18");
        assert_eq!(answer["result"]["serverInfo"]["name"], "idemdb-mcp");
        assert_eq!(
            answer["result"]["capabilities"],
            json!({"tools": {"listChanged": true}, "resources": {"subscribe": true}})
        );

        link.outgoing
            .send(request(2, "tools/list", json!({})))
            .unwrap();
        let first = fakes[0].next().await;
        fakes[0].say(json!({"jsonrpc": "2.0", "id": first["id"], "result": {
            "tools": [{"name": "x", "annotations": {"readOnlyHint": true}}], "nextCursor": "p2"}}));
        let second = fakes[0].next().await;
        assert_eq!(second["params"]["cursor"], "p2");
        fakes[0].say(
            json!({"jsonrpc": "2.0", "id": second["id"], "result": {"tools": [{"name": "y"}]}}),
        );
        let other = fakes[1].next().await;
        fakes[1].say(
            json!({"jsonrpc": "2.0", "id": other["id"], "result": {"tools": [{"name": "x"}]}}),
        );
        let list = link.incoming.recv().await.unwrap();
        assert_eq!(
            list,
            json!({"jsonrpc": "2.0", "id": 2, "result": {"tools": [
                {"name": "a__x", "annotations": {"readOnlyHint": true}}, {"name": "a__y"}, {"name": "b__x"}]}})
        );

        // A call is routed by its prefix, stripped toward the upstream, answered under the
        // client's id; ping is the hub's own.
        link.outgoing
            .send(request(
                3,
                "tools/call",
                json!({"name": "b__x", "arguments": {}}),
            ))
            .unwrap();
        let call = fakes[1].next().await;
        assert_eq!(call["params"]["name"], "x");
        link.outgoing.send(request(4, "ping", json!({}))).unwrap();
        assert_eq!(link.incoming.recv().await.unwrap()["id"], 4);
        fakes[1].say(json!({"jsonrpc": "2.0", "id": call["id"], "result": {"content": []}}));
        assert_eq!(link.incoming.recv().await.unwrap()["id"], 3);
        link.outgoing
            .send(request(5, "tools/call", json!({"name": "c__x"})))
            .unwrap();
        assert_eq!(
            link.incoming.recv().await.unwrap()["error"]["code"],
            INVALID_PARAMS
        );
        link.outgoing
            .send(request(6, "tasks/list", json!({})))
            .unwrap();
        assert_eq!(
            link.incoming.recv().await.unwrap()["error"]["code"],
            METHOD_NOT_FOUND
        );
    }

    #[tokio::test]
    async fn an_upstream_that_ends_loses_its_calls_in_flight_and_refuses_later_ones() {
        let (mut link, mut fakes) = hub(&["a", "b"]);
        link.outgoing
            .send(request(1, "tools/call", json!({"name": "a__pay"})))
            .unwrap();
        let sent = fakes[0].next().await;
        // An upstream's request to the client, answered back to it under its own id.
        fakes[1].say(json!({"jsonrpc": "2.0", "id": "r1", "method": "roots/list"}));
        let ask = link.incoming.recv().await.unwrap();
        link.outgoing
            .send(json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"roots": []}}))
            .unwrap();
        assert_eq!(fakes[1].next().await["id"], "r1");

        fakes[0].end();
        let lost = link.incoming.recv().await.unwrap();
        assert_eq!(lost["id"], 1);
        assert!(message::is_lost(&lost), "{lost}");
        link.outgoing
            .send(request(2, "tools/call", json!({"name": "a__pay"})))
            .unwrap();
        let refused = link.incoming.recv().await.unwrap();
        assert_eq!(refused["error"]["code"], UPSTREAM_GONE);
        assert!(!message::is_lost(&refused), "{refused}");
        assert!(sent["id"].is_u64());

        link.outgoing
            .send(request(3, "tools/call", json!({"name": "b__x"})))
            .unwrap();
        let call = fakes[1].next().await;
        fakes[1].say(json!({"jsonrpc": "2.0", "id": call["id"], "result": {}}));
        assert_eq!(link.incoming.recv().await.unwrap()["id"], 3);

        fakes[1].end();
        assert!(link.incoming.recv().await.is_none());
        assert_eq!(link.ended.await.unwrap().code, 9);
    }

    /// Found with the Python SDK's server: a `tools/list` without params reached the upstreams
    /// with `"params": null`, which that server never answered, so the merged list never came.
    /// And odd params from a peer are refused, never indexed into.
    #[tokio::test]
    async fn requests_keep_their_params_as_they_came_and_odd_ones_are_refused() {
        let (mut link, mut fakes) = hub(&["a"]);
        link.outgoing
            .send(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
            .unwrap();
        let asked = fakes[0].next().await;
        assert!(asked.get("params").is_none(), "{asked}");
        for (id, method) in [
            (2, "tools/call"),
            (3, "resources/read"),
            (4, "completion/complete"),
        ] {
            link.outgoing.send(request(id, method, json!(5))).unwrap();
            let refused = link.incoming.recv().await.unwrap();
            assert_eq!(refused["error"]["code"], INVALID_PARAMS, "{refused}");
        }
        fakes[0].say(json!({"jsonrpc": "2.0", "id": null, "method": "roots/list"}));
        let ask = link.incoming.recv().await.unwrap();
        fakes[0].say(json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": 5}));
        link.outgoing
            .send(json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": [1]}))
            .unwrap();
        fakes[0].say(json!({"jsonrpc": "2.0", "id": asked["id"], "result": {"tools": []}}));
        let list = link.incoming.recv().await.unwrap();
        assert_eq!(list["result"], json!({"tools": []}), "{list} (after {ask})");
    }

    #[test]
    fn templates_match_their_uris() {
        assert!(template_matches(
            "test://static/resource/{id}",
            "test://static/resource/7"
        ));
        assert!(template_matches(
            "file:///{dir}/{name}.txt",
            "file:///a/b.txt"
        ));
        assert!(!template_matches(
            "file:///{dir}/{name}.txt",
            "file:///a/b.md"
        ));
        assert!(!template_matches("test://x/{id}", "other://x/1"));
        assert!(template_matches("plain://uri", "plain://uri"));
        assert!(!template_matches("broken://{x", "broken://x"));
    }
}
