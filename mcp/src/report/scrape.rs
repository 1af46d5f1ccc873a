//! `/metrics` over HTTP: the Prometheus text of the recorder, for `--metrics IP:PORT`.
//!
//! A scrape is one small GET; the endpoint answers it and closes the connection (HTTP/1.1 with
//! `Connection: close`, which every scraper accepts), so the whole protocol it needs is a
//! request line. Anything else gets a plain HTTP error: a head over 8 KiB 431, a line that is not
//! HTTP/1.x 400, another path 404, another method 405. A peer that sends nothing is dropped
//! after 10 s (its answer written and its connection closed within that), and at most 32 connections are served at once (more are closed at once), so a
//! flood of connections holds a bounded amount of memory.

use metrics_exporter_prometheus::PrometheusHandle;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The largest request head read.
const MAX_HEAD: usize = 8 * 1024;
/// The most read and dropped after an HTTP error, before closing.
const MAX_DRAIN: usize = 64 * 1024;
/// How long a connection may take to send its request head.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once.
const MAX_CONNECTIONS: usize = 32;
/// How often histogram samples are folded in when nobody scrapes (the exporter's own default):
/// without it, samples recorded between scrapes pile up in memory.
const UPKEEP: Duration = Duration::from_secs(5);

/// A bound, not yet served, `/metrics` listener.
pub(super) struct Endpoint {
    listener: std::net::TcpListener,
    handle: PrometheusHandle,
}

impl Endpoint {
    /// Binds `address` (port 0: a free port, printed when served).
    pub(super) fn bind(address: SocketAddr, handle: PrometheusHandle) -> Result<Endpoint, String> {
        let listener = std::net::TcpListener::bind(address)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|e| format!("--metrics {address}: {e}"))?;
        Ok(Endpoint { listener, handle })
    }

    /// Serves `/metrics` on the current tokio runtime, and says where on stderr.
    pub(super) fn serve(self) -> Result<(), String> {
        let address = self.listener.local_addr().map_err(|e| e.to_string())?;
        let listener = TcpListener::from_std(self.listener).map_err(|e| e.to_string())?;
        let handle = Arc::new(self.handle);
        let upkeep = Arc::clone(&handle);
        tokio::spawn(async move {
            let mut every = tokio::time::interval(UPKEEP);
            loop {
                every.tick().await;
                upkeep.run_upkeep();
            }
        });
        tokio::spawn(accept(listener, handle));
        eprintln!("idemdb-mcp: metrics on http://{address}/metrics");
        Ok(())
    }
}

async fn accept(listener: TcpListener, handle: Arc<PrometheusHandle>) {
    let serving = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // Out of descriptors, or a connection reset before it was taken: try the next.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let Ok(permit) = Arc::clone(&serving).try_acquire_owned() else {
            continue; // Dropped: closed at once.
        };
        let handle = Arc::clone(&handle);
        tokio::spawn(async move {
            let _ = tokio::time::timeout(READ_TIMEOUT, answer(stream, &handle)).await;
            drop(permit);
        });
    }
}

async fn answer(mut stream: TcpStream, handle: &PrometheusHandle) {
    let mut head = Vec::with_capacity(1024);
    let mut buffer = [0u8; 1024];
    let request = loop {
        if let Some(end) = end_of_head(&head) {
            break request(&head[..end]);
        }
        if head.len() > MAX_HEAD {
            break Err(Refusal::TOO_LARGE);
        }
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => return, // Gone before asking anything.
            Ok(n) => head.extend_from_slice(&buffer[..n]),
        }
    };
    let refused = request.is_err();
    let response = match request {
        Ok(Scrape { head_only }) => {
            let body = handle.render();
            let mut response = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            if !head_only {
                response.push_str(&body);
            }
            response
        }
        Err(Refusal { status, allow }) => {
            let body = format!("{status}\n");
            let allow = if allow { "Allow: GET, HEAD\r\n" } else { "" };
            format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\n{allow}\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
        }
    };
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
    if refused {
        // What the peer sent past the head (an oversize head, a body) is read and dropped
        // until it closes: closing with unread input would reset the connection, and the peer
        // could lose the answer. Bounded by the caller's timeout, and in size here.
        let mut left = MAX_DRAIN;
        while let Ok(n @ 1..) = stream.read(&mut buffer).await {
            left = left.saturating_sub(n);
            if left == 0 {
                break;
            }
        }
    }
}

/// Where a request head ends (its blank line), if it has.
fn end_of_head(bytes: &[u8]) -> Option<usize> {
    bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .or_else(|| bytes.windows(2).position(|w| w == b"\n\n"))
}

/// A request for the metrics.
#[derive(Debug, PartialEq)]
struct Scrape {
    /// `HEAD`: the headers without the body.
    head_only: bool,
}

/// A request answered with an HTTP error.
#[derive(Debug, PartialEq)]
struct Refusal {
    status: &'static str,
    /// Whether to say which methods are allowed (405).
    allow: bool,
}

impl Refusal {
    const BAD: Refusal = Refusal::new("400 Bad Request");
    const NOT_FOUND: Refusal = Refusal::new("404 Not Found");
    const METHOD: Refusal = Refusal {
        status: "405 Method Not Allowed",
        allow: true,
    };
    const TOO_LARGE: Refusal = Refusal::new("431 Request Header Fields Too Large");

    const fn new(status: &'static str) -> Refusal {
        Refusal {
            status,
            allow: false,
        }
    }
}

/// What a request head (up to its blank line) asks for: only its request line matters.
fn request(head: &[u8]) -> Result<Scrape, Refusal> {
    let line_end = head.iter().position(|&b| b == b'\n').unwrap_or(head.len());
    let line = std::str::from_utf8(&head[..line_end]).map_err(|_| Refusal::BAD)?;
    let mut parts = line.trim_end_matches('\r').split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Refusal::BAD);
    };
    if !version.starts_with("HTTP/1.") || method.is_empty() || !target.starts_with('/') {
        return Err(Refusal::BAD);
    }
    let path = target.split('?').next().unwrap_or(target);
    if path != "/metrics" {
        return Err(Refusal::NOT_FOUND);
    }
    match method {
        "GET" => Ok(Scrape { head_only: false }),
        "HEAD" => Ok(Scrape { head_only: true }),
        _ => Err(Refusal::METHOD),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_get_or_head_of_metrics_is_answered_and_odd_requests_get_http_errors() {
        let get = Ok(Scrape { head_only: false });
        assert_eq!(request(b"GET /metrics HTTP/1.1\r\nHost: x"), get);
        assert_eq!(request(b"GET /metrics?name[]=x HTTP/1.0"), get);
        assert_eq!(
            request(b"HEAD /metrics HTTP/1.1"),
            Ok(Scrape { head_only: true })
        );
        for (head, refusal) in [
            (&b"GET / HTTP/1.1"[..], Refusal::NOT_FOUND),
            (b"GET /metrics/x HTTP/1.1", Refusal::NOT_FOUND),
            (b"POST /metrics HTTP/1.1", Refusal::METHOD),
            (b"GET /metrics", Refusal::BAD),
            (b"GET /metrics HTTP/2", Refusal::BAD),
            (b"GET  /metrics HTTP/1.1", Refusal::BAD),
            (b"GET /metrics HTTP/1.1 extra", Refusal::BAD),
            (b"GET metrics HTTP/1.1", Refusal::BAD),
            (b"\xff\xfe /metrics HTTP/1.1", Refusal::BAD),
            (b"", Refusal::BAD),
        ] {
            assert_eq!(
                request(head),
                Err(refusal),
                "{:?}",
                String::from_utf8_lossy(head)
            );
        }
    }

    #[test]
    fn a_head_ends_at_its_blank_line() {
        assert_eq!(end_of_head(b"GET / HTTP/1.1\r\nA: b\r\n\r\nbody"), Some(20));
        assert_eq!(end_of_head(b"GET / HTTP/1.0\n\n"), Some(14));
        assert_eq!(end_of_head(b"GET / HTTP/1.1\r\nA: b\r\n"), None);
    }
}
