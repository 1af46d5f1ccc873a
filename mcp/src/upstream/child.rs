//! An upstream server run as a child process on stdio: one JSON-RPC message per line on its
//! stdin and stdout (the stdio transport of the MCP specification). The child inherits the
//! environment and stderr, and is killed if the gateway ends first.

use crate::lines::{read_lines, write_lines};
use crate::link::{self, Ending, Link, Peer};
use tokio::io::BufReader;
use tokio::process::Command;

/// Starts `command` (with `env` added to the inherited environment) and links to it. The link
/// ends when the child's stdout closes; its [`Ending`] carries the child's exit status. Closing
/// the link's outgoing side closes the child's stdin, which tells an MCP server to end.
///
/// # Errors
/// The command could not be started.
pub(crate) fn start(command: &[String], env: &[(String, String)]) -> std::io::Result<Link> {
    let (program, args) = command
        .split_first()
        .ok_or_else(|| std::io::Error::other("no upstream command"))?;
    let mut child = Command::new(program)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| std::io::Error::new(e.kind(), format!("starting {program}: {e}")))?;
    let (stdin, stdout) = match (child.stdin.take(), child.stdout.take()) {
        (Some(stdin), Some(stdout)) => (stdin, stdout),
        _ => return Err(std::io::Error::other("the child's stdio was not piped")),
    };
    let (link, peer) = link::pair();
    let Peer {
        outgoing,
        incoming,
        ended,
    } = peer;
    let writer = tokio::spawn(write_lines(outgoing, stdin));
    tokio::spawn(async move {
        read_lines(BufReader::new(stdout), &incoming, |e| {
            eprintln!("idemdb-mcp: the upstream sent a line that is not JSON ({e})")
        })
        .await;
        writer.abort();
        let ending = match child.wait().await {
            Ok(status) => Ending::new(
                status.to_string(),
                status
                    .code()
                    .and_then(|c| u8::try_from(c).ok())
                    .unwrap_or(1),
            ),
            Err(e) => Ending::new(e.to_string(), 1),
        };
        drop(incoming);
        let _ = ended.send(ending);
    });
    Ok(link)
}
