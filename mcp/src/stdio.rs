//! MCP on stdio: the client speaks on this process's stdin and stdout, one JSON-RPC message per
//! line (the stdio transport of the MCP specification).

use crate::link::{self, Ending, Link, Peer};
use crate::message;
use crate::upstream::child::write_lines;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

/// The client on this process's stdin and stdout. The link ends when stdin closes. A line that
/// is not JSON is answered with a parse error, as JSON-RPC asks. The task returned ends once
/// every message sent to the client is written and flushed (after the link's senders are
/// dropped): await it before the process exits, or the last answers are lost.
pub(crate) fn client() -> (Link, tokio::task::JoinHandle<()>) {
    let (link, peer) = link::pair();
    let Peer {
        outgoing,
        incoming,
        ended,
    } = peer;
    let writer = tokio::spawn(write_lines(outgoing, tokio::io::stdout()));
    let answer = link.outgoing.downgrade();
    tokio::spawn(async move {
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<Value>(&line) {
                Ok(message) => {
                    let _ = incoming.send(message);
                }
                Err(e) => {
                    if let Some(answer) = answer.upgrade() {
                        let _ = answer.send(message::error(
                            &Value::Null,
                            -32700,
                            &format!("parse error: {e}"),
                        ));
                    }
                }
            }
        }
        drop(incoming);
        let _ = ended.send(Ending::new("the client closed stdin", 0));
    });
    (link, writer)
}
