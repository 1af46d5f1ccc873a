//! The stdio transport's framing: one JSON-RPC message per line, both ways (the client on this
//! process's stdin and stdout, an upstream on a child's).

use serde_json::Value;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// Reads messages, one per line, into `incoming` until the input ends (or `incoming` is
/// closed). Blank lines are skipped; a line that is not JSON goes to `bad` with why.
pub(crate) async fn read_lines(
    input: impl AsyncBufRead + Unpin,
    incoming: &mpsc::UnboundedSender<Value>,
    mut bad: impl FnMut(serde_json::Error),
) {
    let mut lines = input.lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Value>(&line) {
            Ok(message) => {
                if incoming.send(message).is_err() {
                    return;
                }
            }
            Err(e) => bad(e),
        }
    }
}

/// Writes each message as one line, flushing after each, until the channel closes (then the
/// writer is dropped: a child's stdin closes).
pub(crate) async fn write_lines(
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
