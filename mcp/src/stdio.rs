//! MCP on stdio: the client speaks on this process's stdin and stdout, one JSON-RPC message per
//! line (the stdio transport of the MCP specification).

use crate::lines::{read_lines, write_lines};
use crate::link::{self, Ending, Link, Peer};
use crate::message;
use serde_json::Value;
use tokio::io::BufReader;

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
        let stdin = BufReader::new(tokio::io::stdin());
        read_lines(stdin, &incoming, |e| {
            if let Some(answer) = answer.upgrade() {
                let error = message::error(&Value::Null, -32700, &format!("parse error: {e}"));
                let _ = answer.send(error);
            }
        })
        .await;
        drop(incoming);
        let _ = ended.send(Ending::new("the client closed stdin", 0));
    });
    (link, writer)
}
