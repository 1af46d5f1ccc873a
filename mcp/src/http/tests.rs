//! The endpoint from outside, over TCP with raw HTTP/1.1, in front of an in-memory upstream:
//! hostile requests never panic and change nothing, and a session's messages reach the right
//! streams.

use super::*;
use crate::link::{self, Peer};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TENANT: &str = "x-idemdb-tenant";

/// An upstream that answers every request with its method, and a `tools/call` also with a
/// progress notification (to the call's token) and a log message first. Counts the upstreams
/// whose input closed (the gateway let go of them).
fn upstream(closed: Arc<AtomicUsize>) -> std::io::Result<Link> {
    let (link, peer) = link::pair();
    let Peer {
        mut outgoing,
        incoming,
        ended,
    } = peer;
    tokio::spawn(async move {
        while let Some(message) = outgoing.recv().await {
            let (Some(id), Some(method)) = (message.get("id"), message["method"].as_str()) else {
                continue;
            };
            if method == "tools/call" {
                let token = message["params"]["_meta"]["progressToken"].clone();
                let _ = incoming.send(json!({"jsonrpc": "2.0", "method": "notifications/progress",
                    "params": {"progressToken": token, "progress": 1}}));
                let _ = incoming.send(json!({"jsonrpc": "2.0", "method": "notifications/message",
                    "params": {"level": "info", "data": "logged"}}));
            }
            let _ =
                incoming.send(json!({"jsonrpc": "2.0", "id": id, "result": {"method": method}}));
        }
        closed.fetch_add(1, Ordering::SeqCst);
        let _ = ended.send(link::Ending::new("input closed", 0));
    });
    Ok(link)
}

struct Served {
    addr: SocketAddr,
    endpoint: Arc<endpoint::Endpoint>,
    closed: Arc<AtomicUsize>,
}

async fn served(max_sessions: usize, session_idle: Duration) -> Served {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let settings = Http {
        listen: addr,
        tenant_header: TENANT.into(),
        allowed_origins: vec![],
        max_sessions,
        session_idle,
    };
    let keying = Arc::new(Keying {
        gateway: idemdb::agent::Gateway::new(idemdb::Store::in_memory().unwrap()),
        rules: Default::default(),
        strict: false,
    });
    let closed = Arc::new(AtomicUsize::new(0));
    let counting = Arc::clone(&closed);
    let start: StartUpstream = Arc::new(move || upstream(Arc::clone(&counting)));
    let endpoint = endpoint(addr, &settings, keying, start);
    let app = app(Arc::clone(&endpoint));
    tokio::spawn(async move { axum::serve(listener, app).await });
    Served {
        addr,
        endpoint,
        closed,
    }
}

/// Sends a raw request and reads the whole answer (the connection is closed after it).
async fn raw(addr: SocketAddr, head: &str, body: &[u8]) -> (u16, String) {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let mut request = format!(
        "{head}\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    tcp.write_all(&request).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut answer))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, answer)
}

async fn post(addr: SocketAddr, headers: &str, body: &Value) -> (u16, String) {
    let head = format!("POST /mcp HTTP/1.1\r\n{TENANT}: acme\r\n{headers}");
    raw(addr, head.trim_end(), body.to_string().as_bytes()).await
}

fn session_of(answer: &str) -> String {
    answer
        .lines()
        .find_map(|l| l.strip_prefix("mcp-session-id: "))
        .expect("a session id")
        .trim()
        .to_owned()
}

async fn initialize(addr: SocketAddr) -> String {
    let (status, answer) = post(
        addr,
        "",
        &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    session_of(&answer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_are_refused_with_a_clear_error_and_change_nothing() {
    let s = served(4, Duration::from_secs(600)).await;
    let huge = "h".repeat(200_000);
    for (head, body, status, says) in [
        ("", b"{not json".to_vec(), 400, "-32700"),
        ("", b"".to_vec(), 400, "-32700"),
        (
            "",
            br#"[{"jsonrpc":"2.0","id":1,"method":"initialize"}]"#.to_vec(),
            400,
            "batches",
        ),
        ("", br#""initialize""#.to_vec(), 400, "-32600"),
        (
            "",
            br#"{"jsonrpc":"2.0","id":{"a":1},"method":"initialize"}"#.to_vec(),
            400,
            "id must be",
        ),
        (
            "",
            br#"{"jsonrpc":"2.0","id":[1],"method":"initialize"}"#.to_vec(),
            400,
            "id must be",
        ),
        (
            "",
            br#"{"jsonrpc":"2.0","id":null,"method":"initialize"}"#.to_vec(),
            400,
            "id must be",
        ),
        (
            "",
            br#"{"jsonrpc":"2.0","id":1,"method":7}"#.to_vec(),
            400,
            "-32600",
        ),
        (
            "",
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#.to_vec(),
            400,
            "Mcp-Session-Id",
        ),
        (
            "mcp-session-id: nope\r\n",
            br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#.to_vec(),
            404,
            "no such session",
        ),
        (
            "mcp-protocol-version: 2026-07-28\r\n",
            br#"{"jsonrpc":"2.0","id":1,"method":"initialize"}"#.to_vec(),
            400,
            "MCP-Protocol-Version",
        ),
        (
            "accept: image/png\r\n",
            br#"{"jsonrpc":"2.0","id":1,"method":"initialize"}"#.to_vec(),
            406,
            "accept",
        ),
        (
            "origin: http://evil.example\r\n",
            br#"{"jsonrpc":"2.0","id":1,"method":"initialize"}"#.to_vec(),
            403,
            "Origin",
        ),
    ] {
        let head = format!("POST /mcp HTTP/1.1\r\n{TENANT}: acme\r\n{head}");
        let (got, answer) = raw(s.addr, head.trim_end(), &body).await;
        assert_eq!(got, status, "{}: {answer}", String::from_utf8_lossy(&body));
        assert!(answer.contains(says), "{answer}");
    }
    let init = br#"{"jsonrpc":"2.0","id":1,"method":"initialize"}"#;
    for head in [
        "POST /mcp HTTP/1.1".to_owned(),
        format!("POST /mcp HTTP/1.1\r\n{TENANT}: "),
        format!("POST /mcp HTTP/1.1\r\n{TENANT}: {}", "t".repeat(256)),
        format!("POST /mcp HTTP/1.1\r\n{TENANT}: {huge}"),
        format!("POST /mcp HTTP/1.1\r\n{TENANT}: acme\r\nmcp-session-id: {huge}"),
    ] {
        let (got, answer) = raw(s.addr, &head, init).await;
        assert!(
            [400, 404, 431].contains(&got),
            "{}: {got} {answer}",
            &head[..head.len().min(80)]
        );
    }
    let (got, _) = raw(s.addr, &format!("PUT /mcp HTTP/1.1\r\n{TENANT}: acme"), b"").await;
    assert_eq!(got, 405);
    assert_eq!(
        s.endpoint.sessions.len(),
        0,
        "no refused request made a session"
    );

    // The endpoint still works, and odd but well-formed messages reach the upstream.
    let session = initialize(s.addr).await;
    let in_session = format!("mcp-session-id: {session}\r\n");
    for odd in [
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": "x"}),
        json!({"jsonrpc": "2.0", "id": "3", "method": "tools/call", "params": {"_meta": 5}}),
        json!({"jsonrpc": "2.0", "id": 4.5, "method": "x", "params": [1]}),
    ] {
        let (got, answer) = post(s.addr, &in_session, &odd).await;
        assert_eq!(got, 200, "{answer}");
        assert!(answer.contains("\"result\""), "{answer}");
    }
    let (got, answer) = post(
        s.addr,
        &in_session,
        &json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": "x"}),
    )
    .await;
    assert_eq!(got, 202, "{answer}");
    assert_eq!(s.endpoint.sessions.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_messages_reach_their_streams_and_delete_lets_the_upstream_go() {
    let s = served(4, Duration::from_secs(600)).await;
    let session = initialize(s.addr).await;
    let in_session = format!("mcp-session-id: {session}\r\n");

    // The standalone stream, read as it comes.
    let mut get = TcpStream::connect(s.addr).await.unwrap();
    let head = format!(
        "GET /mcp HTTP/1.1\r\nHost: x\r\n{TENANT}: acme\r\n{in_session}accept: text/event-stream\r\n\r\n"
    );
    get.write_all(head.as_bytes()).await.unwrap();
    let (second, _) = raw(
        s.addr,
        &format!("GET /mcp HTTP/1.1\r\n{TENANT}: acme\r\nmcp-session-id: {session}"),
        b"",
    )
    .await;
    assert_eq!(second, 409, "one standalone stream at a time");
    let (other_tenant, _) = raw(
        s.addr,
        &format!("GET /mcp HTTP/1.1\r\n{TENANT}: other\r\nmcp-session-id: {session}"),
        b"",
    )
    .await;
    assert_eq!(other_tenant, 403);

    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "x", "_meta": {"progressToken": "tok"}}});
    let (got, answer) = post(s.addr, &in_session, &call).await;
    assert_eq!(got, 200, "{answer}");
    let progress = answer.find("notifications/progress").expect(&answer);
    let response = answer.find("\"id\":7").expect(&answer);
    assert!(
        progress < response,
        "progress first, then the response: {answer}"
    );
    assert!(
        !answer.contains("logged"),
        "the log went to the GET stream: {answer}"
    );

    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !String::from_utf8_lossy(&seen).contains("logged") {
        let mut buf = [0u8; 4096];
        let n = tokio::time::timeout_at(deadline, get.read(&mut buf))
            .await
            .expect("the log on the GET stream")
            .unwrap();
        assert!(n > 0, "the GET stream ended early");
        seen.extend_from_slice(&buf[..n]);
    }

    let delete = format!("DELETE /mcp HTTP/1.1\r\n{TENANT}: acme\r\nmcp-session-id: {session}");
    assert_eq!(raw(s.addr, &delete, b"").await.0, 200);
    assert_eq!(raw(s.addr, &delete, b"").await.0, 404);
    let (after, _) = post(s.addr, &in_session, &call).await;
    assert_eq!(after, 404);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while s.closed.load(Ordering::SeqCst) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the upstream was let go"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_bounded_and_an_idle_one_ends() {
    let s = served(1, Duration::from_millis(300)).await;
    let session = initialize(s.addr).await;
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}});
    let (full, answer) = post(s.addr, "", &init).await;
    assert_eq!(full, 503, "{answer}");
    tokio::time::sleep(Duration::from_millis(900)).await;
    let ping = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"});
    let (gone, answer) = post(s.addr, &format!("mcp-session-id: {session}\r\n"), &ping).await;
    assert_eq!(gone, 404, "{answer}");
    assert_eq!(
        s.closed.load(Ordering::SeqCst),
        1,
        "its upstream was let go"
    );
    initialize(s.addr).await;
}
