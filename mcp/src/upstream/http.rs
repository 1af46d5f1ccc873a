//! An upstream at a Streamable HTTP URL (the MCP specification's HTTP transport) as a [`Link`].
//!
//! Each message is POSTed (`Accept: application/json, text/event-stream`); a request's answer
//! comes back as a JSON body or on an SSE stream, with any requests and notifications the server
//! sends meanwhile. The `Mcp-Session-Id` the initialize answer gives is sent on every later
//! message, with `MCP-Protocol-Version` once it is negotiated. After initialization a GET
//! stream carries the server's own messages, if it offers one (405 says it does not). When the
//! gateway lets go of the link, the session is DELETEd.
//!
//! Each message gets a connection of its own (HTTP/1.1; a streamed answer holds its connection
//! anyway): a refused connection proves the message never reached the server, so a request's
//! failure can be told apart: [`message::error`] (surely not sent) or [`message::lost`] (may
//! have acted). Not done: stream resumption (`Last-Event-ID`), TLS.

use crate::link::{self, Ending, Link, Peer};
use crate::message::{self, Kind, UPSTREAM_GONE};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ACCEPT, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinSet;

/// The largest message (a JSON body, or one SSE event's data) read from an upstream.
const MAX_MESSAGE: usize = 16 << 20;
/// How long connecting may take: the upstreams are on this host or near it.
const CONNECT: Duration = Duration::from_secs(10);
/// How long the session's DELETE may take when the link is let go.
const CLOSE: Duration = Duration::from_secs(2);
const SESSION_ID: &str = "mcp-session-id";
const PROTOCOL_VERSION: &str = "mcp-protocol-version";

/// Links to the Streamable HTTP endpoint `url` (`http://` only). Nothing is sent until the
/// gateway sends its first message. The link ends when the gateway lets go of it (after the
/// session's DELETE), or when the server is gone: its session expired (404) or its address
/// refuses connections.
///
/// # Errors
/// `url` is not an `http://` URL with a host.
pub(crate) fn connect(url: &str) -> Result<Link, String> {
    let endpoint = Endpoint::parse(url)?;
    let (link, peer) = link::pair();
    tokio::spawn(run(Arc::new(endpoint), peer));
    Ok(link)
}

/// Where the upstream listens.
struct Endpoint {
    url: String,
    host: String,
    port: u16,
    /// The `Host` header.
    authority: String,
    /// The request target.
    path: String,
}

impl Endpoint {
    fn parse(url: &str) -> Result<Endpoint, String> {
        let uri: Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
        if uri.scheme_str() != Some("http") {
            return Err(format!("{url}: only http:// URLs are offered"));
        }
        let authority = uri
            .authority()
            .ok_or_else(|| format!("{url}: no host"))?
            .clone();
        let host = authority.host().trim_matches(['[', ']']).to_owned();
        if host.is_empty() {
            return Err(format!("{url}: no host"));
        }
        Ok(Endpoint {
            url: url.to_owned(),
            host,
            port: authority.port_u16().unwrap_or(80),
            authority: authority.to_string(),
            path: uri
                .path_and_query()
                .map_or("/".to_owned(), |p| p.as_str().to_owned()),
        })
    }
}

/// What the server gave the session.
#[derive(Default)]
struct Session {
    id: Option<HeaderValue>,
    version: Option<HeaderValue>,
}

/// Why a message did not get an HTTP response.
enum Unsent {
    /// It surely never reached the server (the connection was refused or failed first).
    Surely(String),
    /// It may have reached the server.
    Maybe(String),
}

/// What one exchange needs: the endpoint, the session, and where the server's messages go.
#[derive(Clone)]
struct Exchange {
    endpoint: Arc<Endpoint>,
    session: Arc<Mutex<Session>>,
    to_gateway: UnboundedSender<Value>,
}

async fn run(endpoint: Arc<Endpoint>, peer: Peer) {
    let Peer {
        mut outgoing,
        incoming,
        ended,
    } = peer;
    let exchange = Exchange {
        endpoint,
        session: Arc::default(),
        to_gateway: incoming,
    };
    let mut requests = JoinSet::new();
    let mut listener = None;
    let mut gone = None;
    while gone.is_none() {
        tokio::select! {
            message = outgoing.recv() => {
                let Some(message) = message else { break };
                match message::kind(&message) {
                    // Its answer carries the session id every later message needs.
                    Kind::Request { id, method } if method == "initialize" => {
                        gone = exchange.request(id, &method, message).await.err();
                    }
                    Kind::Request { id, method } => {
                        let exchange = exchange.clone();
                        requests.spawn(async move { exchange.request(id, &method, message).await });
                    }
                    // Notifications and answers go in order: each is accepted before the next.
                    Kind::Notification { method } => {
                        let delivered = exchange.deliver(&message).await;
                        if method == "notifications/initialized" && delivered.is_ok() {
                            listener = Some(tokio::spawn(exchange.clone().listen()));
                        }
                        gone = delivered.err();
                    }
                    Kind::Response { .. } | Kind::Other => gone = exchange.deliver(&message).await.err(),
                }
            }
            Some(done) = requests.join_next(), if !requests.is_empty() => {
                if let Ok(Err(why)) = done {
                    gone = Some(why);
                }
            }
        }
    }
    // Requests still in flight are given up: whoever sent them hears that the upstream ended
    // (and may have acted). Those never POSTed surely did not reach it: they are told so.
    requests.abort_all();
    outgoing.close();
    while let Ok(message) = outgoing.try_recv() {
        if let Kind::Request { id, .. } = message::kind(&message) {
            let why = format!("the upstream at {} has ended", exchange.endpoint.url);
            let _ = exchange
                .to_gateway
                .send(message::error(&id, UPSTREAM_GONE, &why));
        }
    }
    if let Some(listener) = listener {
        listener.abort();
    }
    let session_id = exchange.session().id.clone();
    if let (None, Some(_)) = (&gone, session_id) {
        let _ = tokio::time::timeout(CLOSE, exchange.send(Method::DELETE, None)).await;
    }
    let why = gone.unwrap_or_else(|| "the gateway closed its session".into());
    drop(exchange);
    while requests.join_next().await.is_some() {}
    let _ = ended.send(Ending::new(format!("the HTTP upstream ended: {why}"), 1));
}

impl Exchange {
    fn session(&self) -> std::sync::MutexGuard<'_, Session> {
        self.session
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn initialized(&self) -> bool {
        self.session().version.is_some()
    }

    /// Sends one HTTP request (a POST of `body`, or a GET or DELETE without one) with the
    /// session's headers, on a connection of its own.
    async fn send(
        &self,
        method: Method,
        body: Option<Vec<u8>>,
    ) -> Result<Response<Incoming>, Unsent> {
        let endpoint = &self.endpoint;
        let address = (endpoint.host.as_str(), endpoint.port);
        let stream = match tokio::time::timeout(CONNECT, TcpStream::connect(address)).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => return Err(Unsent::Surely(e.to_string())),
            Err(_) => return Err(Unsent::Surely("connecting timed out".into())),
        };
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| Unsent::Surely(e.to_string()))?;
        tokio::spawn(connection);
        let accept = if method == Method::GET {
            "text/event-stream"
        } else {
            "application/json, text/event-stream"
        };
        let mut request = Request::builder()
            .method(method)
            .uri(endpoint.path.as_str())
            .header(HOST, endpoint.authority.as_str())
            .header(ACCEPT, accept);
        if body.is_some() {
            request = request.header(CONTENT_TYPE, "application/json");
        }
        {
            let session = self.session();
            if let Some(id) = &session.id {
                request = request.header(SESSION_ID, id.clone());
            }
            if let Some(version) = &session.version {
                request = request.header(PROTOCOL_VERSION, version.clone());
            }
        }
        let request = request
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| Unsent::Surely(e.to_string()))?;
        sender
            .send_request(request)
            .await
            .map_err(|e| Unsent::Maybe(e.to_string()))
    }

    /// POSTs a request of the gateway's and passes on what comes back, its answer last. A
    /// request that gets no answer is answered here: [`message::error`] if it surely never
    /// reached the server, else [`message::lost`]. `Err`: the server is gone (every later
    /// message would fail too).
    async fn request(&self, id: Value, method: &str, message: Value) -> Result<(), String> {
        let url = &self.endpoint.url;
        let response = match self
            .send(Method::POST, Some(message.to_string().into_bytes()))
            .await
        {
            Ok(response) => response,
            Err(Unsent::Surely(why)) => {
                let why = format!("the upstream at {url} could not be reached: {why}");
                let _ = self
                    .to_gateway
                    .send(message::error(&id, UPSTREAM_GONE, &why));
                return if self.initialized() { Err(why) } else { Ok(()) };
            }
            Err(Unsent::Maybe(why)) => {
                let why = format!("the upstream at {url} failed mid-request: {why}");
                let _ = self.to_gateway.send(message::lost(&id, &why));
                return Ok(());
            }
        };
        let status = response.status();
        if status == StatusCode::NOT_FOUND && self.session().id.is_some() {
            let why = format!("the upstream at {url} no longer knows this session (404)");
            let _ = self
                .to_gateway
                .send(message::error(&id, UPSTREAM_GONE, &why));
            return Err(why);
        }
        if method == "initialize" && status.is_success() {
            if let Some(session_id) = response.headers().get(SESSION_ID) {
                self.session().id = Some(session_id.clone());
            }
        }
        let mut answered = false;
        let read = self
            .read_messages(response, |message| {
                if matches!(message::kind(message), Kind::Response { id: ref theirs } if *theirs == id)
                {
                    answered = true;
                    if method == "initialize" {
                        self.note_version(message);
                    }
                }
            })
            .await;
        if answered {
            return Ok(());
        }
        let why = match read {
            Err(why) => why,
            Ok(()) if status.is_client_error() => {
                // The server refused the request as it stood: it did not act on it.
                let why = format!("the upstream at {url} answered HTTP {status}");
                let _ = self
                    .to_gateway
                    .send(message::error(&id, UPSTREAM_GONE, &why));
                return Ok(());
            }
            Ok(()) if status.is_success() => "its answer stream ended without the answer".into(),
            Ok(()) => format!("HTTP {status}"),
        };
        let why = format!("the upstream at {url} did not answer: {why}");
        let _ = self.to_gateway.send(message::lost(&id, &why));
        Ok(())
    }

    /// Notes the protocol version an initialize answer settled on.
    fn note_version(&self, answer: &Value) {
        let version = answer["result"]["protocolVersion"].as_str();
        if let Some(version) = version.and_then(|v| HeaderValue::from_str(v).ok()) {
            self.session().version = Some(version);
        }
    }

    /// POSTs a notification or an answer; it is accepted with 202 (any messages a body
    /// carries are passed on). `Err`: the server is gone.
    async fn deliver(&self, message: &Value) -> Result<(), String> {
        let url = &self.endpoint.url;
        match self
            .send(Method::POST, Some(message.to_string().into_bytes()))
            .await
        {
            Ok(response) => {
                let status = response.status();
                if status == StatusCode::NOT_FOUND && self.session().id.is_some() {
                    return Err(format!(
                        "the upstream at {url} no longer knows this session (404)"
                    ));
                }
                if !status.is_success() {
                    eprintln!("idemdb-mcp: the upstream at {url} refused a message: HTTP {status}");
                } else if let Err(why) = self.read_messages(response, |_| {}).await {
                    eprintln!("idemdb-mcp: the upstream at {url}: {why}");
                }
                Ok(())
            }
            Err(Unsent::Surely(why)) if self.initialized() => {
                Err(format!("the upstream at {url} could not be reached: {why}"))
            }
            Err(Unsent::Surely(why) | Unsent::Maybe(why)) => {
                eprintln!("idemdb-mcp: a message to the upstream at {url} failed: {why}");
                Ok(())
            }
        }
    }

    /// The GET stream of the server's own messages, while the server keeps it open.
    async fn listen(self) {
        loop {
            let Ok(response) = self.send(Method::GET, None).await else {
                return;
            };
            if response.status() != StatusCode::OK {
                return; // 405: the server offers no such stream.
            }
            if let Err(why) = self.read_messages(response, |_| {}).await {
                eprintln!("idemdb-mcp: the upstream at {}: {why}", self.endpoint.url);
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Passes on every message of a response's body (JSON, a JSON batch, or an SSE stream),
    /// showing each to `seen` first. `Err`: the body broke off, or was not MCP.
    async fn read_messages(
        &self,
        response: Response<Incoming>,
        mut seen: impl FnMut(&Value),
    ) -> Result<(), String> {
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        let mut body = response.into_body();
        let mut pass = |message: Value| {
            let messages = match message {
                Value::Array(batch) => batch,
                one => vec![one],
            };
            for message in messages {
                seen(&message);
                let _ = self.to_gateway.send(message);
            }
        };
        if content_type.starts_with("text/event-stream") {
            let mut events = Events::default();
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| format!("its stream broke off: {e}"))?;
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                for data in events.feed(&data)? {
                    match serde_json::from_str(&data) {
                        Ok(message) => pass(message),
                        Err(e) => eprintln!("idemdb-mcp: an upstream's event is not JSON ({e})"),
                    }
                }
            }
            return Ok(());
        }
        let mut bytes = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| format!("its answer broke off: {e}"))?;
            if let Ok(data) = frame.into_data() {
                if bytes.len() + data.len() > MAX_MESSAGE {
                    return Err(format!("its answer is larger than {MAX_MESSAGE} bytes"));
                }
                bytes.extend_from_slice(&data);
            }
        }
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(());
        }
        match serde_json::from_slice(&bytes) {
            Ok(message) => {
                pass(message);
                Ok(())
            }
            Err(e) => Err(format!("its answer is not JSON ({e})")),
        }
    }
}

/// Server-sent events, parsed as the bytes come: the data of each `message` event.
#[derive(Default)]
struct Events {
    /// Bytes of a line not ended yet.
    line: Vec<u8>,
    /// The event being read: its type and data lines.
    kind: String,
    data: String,
    has_data: bool,
}

impl Events {
    /// Takes the next bytes of the stream; returns the data of the events they complete.
    fn feed(&mut self, bytes: &[u8]) -> Result<Vec<String>, String> {
        let mut done = Vec::new();
        for &byte in bytes {
            if byte != b'\n' {
                self.line.push(byte);
                if self.line.len() + self.data.len() > MAX_MESSAGE {
                    return Err(format!("an event is larger than {MAX_MESSAGE} bytes"));
                }
                continue;
            }
            if self.line.last() == Some(&b'\r') {
                self.line.pop();
            }
            let line = String::from_utf8_lossy(&std::mem::take(&mut self.line)).into_owned();
            if line.is_empty() {
                let kind = std::mem::take(&mut self.kind);
                let data = std::mem::take(&mut self.data);
                if std::mem::take(&mut self.has_data) && (kind.is_empty() || kind == "message") {
                    done.push(data);
                }
                continue;
            }
            let (field, value) = match line.split_once(':') {
                Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
                None => (line.as_str(), ""),
            };
            match field {
                "data" => {
                    if self.has_data {
                        self.data.push('\n');
                    }
                    self.data.push_str(value);
                    self.has_data = true;
                }
                "event" => self.kind = value.to_owned(),
                _ => {} // A comment (empty field), an id, a retry: not used.
            }
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_parsed_whatever_the_chunks() {
        let stream = b": hi\r\nevent: message\r\nid: 1\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\n\
                       event: ping\ndata: x\n\ndata:{\"b\":2}\n\nretry: 5\n\n";
        for size in [1, 3, stream.len()] {
            let mut events = Events::default();
            let mut got = Vec::new();
            for chunk in stream.chunks(size) {
                got.extend(events.feed(chunk).unwrap());
            }
            assert_eq!(got, ["{\"a\":\n1}", "{\"b\":2}"], "chunks of {size}");
        }
    }

    #[test]
    fn a_huge_event_is_refused() {
        let mut events = Events::default();
        let line = vec![b'x'; MAX_MESSAGE + 1];
        assert!(events.feed(b"data: ").is_ok());
        assert!(events.feed(&line).is_err());
    }

    #[test]
    fn endpoints_are_http_urls_with_a_host() {
        let e = Endpoint::parse("http://127.0.0.1:8000/mcp?x=1").unwrap();
        assert_eq!(
            (
                e.host.as_str(),
                e.port,
                e.authority.as_str(),
                e.path.as_str()
            ),
            ("127.0.0.1", 8000, "127.0.0.1:8000", "/mcp?x=1")
        );
        let e = Endpoint::parse("http://[::1]/").unwrap();
        assert_eq!((e.host.as_str(), e.port), ("::1", 80));
        assert!(Endpoint::parse("https://h/mcp").is_err());
        assert!(Endpoint::parse("nonsense").is_err());
    }

    /// A server that reads the request and hangs up without answering: the request may have
    /// acted, so it is lost (a keyed call's outcome unknown), never a plain error.
    #[tokio::test]
    async fn a_request_whose_server_hangs_up_is_lost() {
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = socket.read(&mut buf).await;
        });
        let mut link = connect(&format!("http://127.0.0.1:{port}/mcp")).unwrap();
        link.outgoing
            .send(serde_json::json!({"jsonrpc": "2.0", "id": 7, "method": "initialize", "params": {}}))
            .unwrap();
        let answer = link.incoming.recv().await.unwrap();
        assert_eq!(answer["id"], 7);
        assert!(message::is_lost(&answer), "{answer}");
    }

    /// A server that refuses connections: a request surely never reached it, so it is answered
    /// with a plain error, not as lost.
    #[tokio::test]
    async fn a_refused_connection_is_a_request_that_never_left() {
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let mut link = connect(&format!("http://127.0.0.1:{port}/mcp")).unwrap();
        link.outgoing
            .send(serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}))
            .unwrap();
        let answer = link.incoming.recv().await.unwrap();
        assert_eq!(answer["id"], 1);
        assert_eq!(answer["error"]["code"], UPSTREAM_GONE);
        assert!(!message::is_lost(&answer), "{answer}");
    }
}
