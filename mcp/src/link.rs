//! A link: one side of a conversation in JSON-RPC messages, as the gateway sees it. The client
//! (on stdio, or an HTTP session) is a link; so is each upstream server (a child process, a
//! Streamable HTTP URL, or several of them behind the hub). The proxy joins a client's link to
//! an upstream's, and never learns which transport either one runs on.

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

/// Messages to a peer and from it, and how it ended.
pub(crate) struct Link {
    /// Messages for the peer. Dropping every sender tells the peer this side is done (a child's
    /// stdin is closed, an HTTP session ends).
    pub(crate) outgoing: mpsc::UnboundedSender<Value>,
    /// Messages from the peer; `None` once it ended.
    pub(crate) incoming: mpsc::UnboundedReceiver<Value>,
    /// Why the peer ended, told once `incoming` is closed.
    pub(crate) ended: oneshot::Receiver<Ending>,
}

/// How a peer ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ending {
    /// In words, for the errors of the requests it leaves unanswered.
    pub(crate) why: String,
    /// The exit code to end with, when the peer was a process whose end ends the gateway.
    pub(crate) code: u8,
}

impl Ending {
    pub(crate) fn new(why: impl Into<String>, code: u8) -> Ending {
        Ending {
            why: why.into(),
            code,
        }
    }
}

/// The other end of a [`Link`]: what a transport holds to feed it.
pub(crate) struct Peer {
    /// Messages the gateway sends to this peer.
    pub(crate) outgoing: mpsc::UnboundedReceiver<Value>,
    /// Where this peer's messages go.
    pub(crate) incoming: mpsc::UnboundedSender<Value>,
    /// Told once, when the peer ends (dropping it unsent reads as an ending without a reason).
    pub(crate) ended: oneshot::Sender<Ending>,
}

/// A new link and the peer end a transport drives.
pub(crate) fn pair() -> (Link, Peer) {
    let (to_peer, from_gateway) = mpsc::unbounded_channel();
    let (to_gateway, from_peer) = mpsc::unbounded_channel();
    let (ended_tx, ended_rx) = oneshot::channel();
    (
        Link {
            outgoing: to_peer,
            incoming: from_peer,
            ended: ended_rx,
        },
        Peer {
            outgoing: from_gateway,
            incoming: to_gateway,
            ended: ended_tx,
        },
    )
}
