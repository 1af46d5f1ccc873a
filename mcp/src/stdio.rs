//! MCP on stdio: the client speaks on this process's stdin and stdout, the upstream server on
//! a child process's; one JSON-RPC message per line (the stdio transport of the MCP
//! specification). The child inherits the environment and stderr.

use crate::message;
use crate::proxy::Proxy;
use serde_json::Value;
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::process::Command;
use tokio::sync::mpsc;

/// Serves one client on stdio in front of `command`, until the client closes stdin (then the
/// upstream's stdin is closed and it is waited for) or the upstream ends (then every request
/// in flight is answered with an error). Returns the exit code to end with.
pub(crate) async fn serve(
    command: &[String],
    keyed: Option<crate::keyed::Keying>,
) -> std::io::Result<u8> {
    let (program, args) = command
        .split_first()
        .ok_or_else(|| std::io::Error::other("no upstream command"))?;
    let mut child = Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| std::io::Error::new(e.kind(), format!("starting {program}: {e}")))?;
    let (child_in, child_out) = (
        child.stdin.take().expect("piped"),
        child.stdout.take().expect("piped"),
    );
    let (up_tx, up_rx) = mpsc::unbounded_channel();
    let (down_tx, down_rx) = mpsc::unbounded_channel();
    let proxy = Arc::new(Proxy::new(up_tx, down_tx.clone(), keyed));

    let to_upstream = tokio::spawn(write_lines(up_rx, child_in));
    let to_client = tokio::spawn(write_lines(down_rx, tokio::io::stdout()));
    let mut from_upstream = {
        let proxy = Arc::clone(&proxy);
        tokio::spawn(async move {
            let mut lines = BufReader::new(child_out).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                match serde_json::from_str::<Value>(&line) {
                    Ok(message) => proxy.server_sent(message),
                    Err(e) => {
                        eprintln!("idemdb-mcp: the upstream sent a line that is not JSON ({e})")
                    }
                }
            }
        })
    };
    let mut from_client = {
        let proxy = Arc::clone(&proxy);
        let down_tx = down_tx.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(tokio::io::stdin()).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if line.trim().is_empty() {
                    continue;
                }
                match serde_json::from_str::<Value>(&line) {
                    Ok(message) => proxy.client_sent(message),
                    Err(e) => {
                        let _ = down_tx.send(message::error(
                            &Value::Null,
                            -32700,
                            &format!("parse error: {e}"),
                        ));
                    }
                }
            }
        })
    };

    tokio::select! {
        _ = &mut from_upstream => {
            let status = child.wait().await?;
            proxy.server_gone(&status.to_string());
            // Let the errors reach the client, then end as the upstream did.
            drop(proxy);
            drop(down_tx);
            from_client.abort();
            let _ = to_client.await;
            Ok(status.code().and_then(|c| u8::try_from(c).ok()).unwrap_or(1))
        }
        _ = &mut from_client => {
            // The client is gone: the upstream's stdin closes, and it ends (as the MCP stdio
            // transport's shutdown says), or is killed when this process ends.
            drop(proxy);
            to_upstream.abort();
            let status = child.wait().await?;
            Ok(status.code().and_then(|c| u8::try_from(c).ok()).unwrap_or(0))
        }
    }
}

/// Writes each message as one line, flushing after each, until the channel closes.
async fn write_lines(
    mut messages: mpsc::UnboundedReceiver<Value>,
    mut out: impl AsyncWrite + Unpin,
) {
    while let Some(message) = messages.recv().await {
        let mut line = message.to_string();
        line.push('\n');
        if out.write_all(line.as_bytes()).await.is_err() || out.flush().await.is_err() {
            return;
        }
    }
}
