//! Waiting without polling: `wait` is woken when the record it waits for stops being in
//! progress, by this replica's own batches directly and by the others' through PostgreSQL's
//! `LISTEN`/`NOTIFY`.
//!
//! One connection per store (beside the pool) listens on the schema's channel and sends this
//! replica's notifications. Two kinds go over the channel:
//!
//! - `w<token>:<ms>`: a waiter wants to hear of its key's change for the next `<ms>`. Every
//!   replica's listener notes it.
//! - `c<token>`: the key changed. A replica sends it only for a key some waiter wants, after
//!   the change committed: a replica without waiters sends nothing, so completions cost nothing
//!   more when nobody waits (a notification for every completion cost 15% of one caller's
//!   claim + complete, measured).
//!
//! The batches hand changed keys over and go on: a notification never delays a caller or a
//! batch's connection. The notifying statement sets `synchronous_commit = off` for its own
//! transaction: a notification is a hint, and a durable one would make every notifying
//! transaction wait for a WAL flush while it holds the server's one notification lock.
//!
//! Why no wake is lost: a waiter registers here, then sends its `w` and waits for that to
//! commit, then reads the record. A change committed before the read is seen by the read. A
//! change committed after it is committed after the `w`; the completing replica sends a `c` if
//! its listener received the `w` before the change was handed over, which the delay of a
//! notification's delivery can upset: so a waiter's first pause after its `w` is short
//! ([`FIRST_LOOK`]), and after that it reads again every [`LISTENING_POLL`] in case a
//! notification was lost with a connection. While the listener is down (connecting, or behind
//! a transaction pooler, where a `LISTEN` would stay on a shared session), waiters poll as
//! before, and every waiter is woken when it comes back.
//!
//! A token is 16 hex digits of the SHA-256 of the key's columns. Another key with the same
//! token wakes a waiter for nothing; it reads, and waits again.

use super::connect::Database;
use super::rows::{db_error, Target};
use crate::error::Result;
use crate::sync::{Arc, AtomicBool, Mutex, Ordering};
use futures_channel::oneshot;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Notify};

/// How often a waiter reads the record while the listener listens: the safety net for a
/// notification lost with a connection.
pub(crate) const LISTENING_POLL: Duration = Duration::from_secs(2);

/// A waiter's first pause after its `w`: longer than a notification takes to be delivered.
pub(crate) const FIRST_LOOK: Duration = Duration::from_millis(50);

/// The longest a `w` asks for: a longer wait asks again, [`WANT_MARGIN`] before it runs out.
pub(crate) const WANT_SPAN: Duration = Duration::from_secs(600);
pub(crate) const WANT_MARGIN: Duration = Duration::from_secs(5);

/// The most payloads one notifying statement carries.
const MAX_PER_STATEMENT: usize = 1024;

/// A key's token, as the channel's payloads carry it: its columns, each after its length.
pub(crate) fn token(target: &Target) -> u64 {
    let mut hash = Sha256::new();
    for part in [
        &target.tenant[..],
        &target.endpoint[..],
        target.key.as_bytes(),
    ] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part);
    }
    first_eight(&hash.finalize())
}

fn first_eight(digest: &[u8]) -> u64 {
    u64::from_be_bytes(digest[..8].try_into().expect("8 of 32 bytes"))
}

/// The channel of a schema: its name may be 63 bytes, a channel's at most 63, so a hash.
fn channel(schema: &str) -> String {
    format!("idemdb_{:016x}", first_eight(&Sha256::digest(schema)))
}

/// What the listener sends for this replica.
enum Outgoing {
    /// `c<token>`.
    Changed(u64),
    /// `w<token>:<ms>`, answered once committed.
    Want(u64, Duration, oneshot::Sender<()>),
}

/// The waiters of a store, by token, what the other replicas' waiters want, and the way to the
/// listener.
pub(crate) struct Wakes {
    waiters: Mutex<HashMap<u64, (Arc<Notify>, usize)>>,
    /// Tokens waiters anywhere want to hear of, until when (as this listener heard it).
    wanted: Mutex<HashMap<u64, Instant>>,
    /// Whether notifications from other replicas reach this one now.
    listening: AtomicBool,
    /// To the listener; `None` when nothing listens (a transaction pooler).
    outgoing: Option<mpsc::UnboundedSender<Outgoing>>,
}

/// A waiter's registration: woken when its key changes; unregistered when dropped.
pub(crate) struct Watch<'w> {
    wakes: &'w Wakes,
    token: u64,
    notify: Arc<Notify>,
}

impl Watch<'_> {
    /// Whether a wake-up by notification is to be expected: if not, the waiter polls.
    pub(crate) fn listening(&self) -> bool {
        self.wakes.listening.load(Ordering::Acquire)
    }

    /// The future a change wakes: take it before reading the record.
    pub(crate) fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }

    /// Tells every replica this waiter wants its key's change for `how_long`; returns once
    /// that is committed (or at once when nothing listens). Whether it was sent: if not, the
    /// waiter polls.
    pub(crate) async fn want(&self, how_long: Duration) -> bool {
        let Some(outgoing) = &self.wakes.outgoing else {
            return false;
        };
        if !self.listening() {
            return false;
        }
        let (tx, rx) = oneshot::channel();
        if outgoing
            .send(Outgoing::Want(self.token, how_long, tx))
            .is_err()
        {
            return false;
        }
        rx.await.is_ok()
    }
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        let mut waiters = self.wakes.waiters.lock();
        if let Some((_, count)) = waiters.get_mut(&self.token) {
            *count -= 1;
            if *count == 0 {
                waiters.remove(&self.token);
            }
        }
    }
}

impl Wakes {
    /// Wakes that no other replica's change reaches (waiters poll, and this replica's own
    /// changes wake them).
    pub(crate) fn local() -> Wakes {
        Wakes {
            waiters: Mutex::new(HashMap::new()),
            wanted: Mutex::new(HashMap::new()),
            listening: AtomicBool::new(false),
            outgoing: None,
        }
    }

    /// Registers a waiter for `target`.
    pub(crate) fn watch(&self, target: &Target) -> Watch<'_> {
        let token = token(target);
        let notify = {
            let mut waiters = self.waiters.lock();
            let entry = waiters
                .entry(token)
                .or_insert_with(|| (Arc::new(Notify::new()), 0));
            entry.1 += 1;
            Arc::clone(&entry.0)
        };
        Watch {
            wakes: self,
            token,
            notify,
        }
    }

    /// Keys whose records stopped being in progress here (committed): wakes this replica's
    /// waiters, and has the listener tell the others' that want them.
    pub(crate) fn changed<'k>(&self, targets: impl Iterator<Item = &'k Target>) {
        if self.waiters.lock().is_empty() && self.wanted.lock().is_empty() {
            return;
        }
        for target in targets {
            let token = token(target);
            self.wake(token);
            let wanted = self
                .wanted
                .lock()
                .get(&token)
                .is_some_and(|until| *until > Instant::now());
            if let (true, Some(outgoing)) = (wanted, &self.outgoing) {
                let _ = outgoing.send(Outgoing::Changed(token));
            }
        }
    }

    fn wake(&self, token: u64) {
        if let Some((notify, _)) = self.waiters.lock().get(&token) {
            notify.notify_waiters();
        }
    }

    fn wake_all(&self) {
        for (notify, _) in self.waiters.lock().values() {
            notify.notify_waiters();
        }
    }

    /// A payload the listener received.
    fn heard(&self, payload: &str) {
        match parse(payload) {
            Some(Heard::Changed(token)) => self.wake(token),
            Some(Heard::Want(token, how_long)) => {
                let now = Instant::now();
                let mut wanted = self.wanted.lock();
                if wanted.len() >= 1024 {
                    wanted.retain(|_, until| *until > now);
                }
                if let Some(until) = now.checked_add(how_long) {
                    let entry = wanted.entry(token).or_insert(until);
                    *entry = (*entry).max(until);
                }
            }
            None => {}
        }
    }
}

/// The wakes of a store whose listener [`listen`] runs (spawn it on the engine's runtime).
pub(crate) fn listening() -> (Arc<Wakes>, Listener) {
    let (tx, rx) = mpsc::unbounded_channel();
    let wakes = Arc::new(Wakes {
        waiters: Mutex::new(HashMap::new()),
        wanted: Mutex::new(HashMap::new()),
        listening: AtomicBool::new(false),
        outgoing: Some(tx),
    });
    (wakes, Listener(rx))
}

/// What the listener takes to send.
pub(crate) struct Listener(mpsc::UnboundedReceiver<Outgoing>);

/// The listener: connects, listens on the schema's channel, notes what it hears, and sends
/// what this replica's waiters and batches hand over. Reconnects after a pause (growing from
/// 100 ms to 5 s) whenever its connection ends; runs until the engine's runtime ends.
pub(crate) async fn listen(
    database: Database,
    schema: String,
    wakes: Arc<Wakes>,
    Listener(mut outgoing): Listener,
) {
    let channel = channel(&schema);
    let mut pause = Duration::from_millis(100);
    loop {
        if let Ended::StoreGone = session(&database, &channel, &wakes, &mut outgoing).await {
            return;
        }
        wakes.listening.store(false, Ordering::Release);
        // Their notifications may have been lost with the connection: everyone reads again
        // (and polls until the listener is back).
        wakes.wake_all();
        // What was handed over meanwhile is dropped (a waiter's `want` answers false).
        while outgoing.try_recv().is_ok() {}
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(5));
    }
}

/// Why a listening session ended.
enum Ended {
    StoreGone,
    /// Its connection failed (or could not be made).
    Connection,
}

/// One listening session, until its connection fails or the store is gone.
async fn session(
    database: &Database,
    channel: &str,
    wakes: &Wakes,
    outgoing: &mut mpsc::UnboundedReceiver<Outgoing>,
) -> Ended {
    let (notices_tx, mut notices) = mpsc::unbounded_channel();
    let Ok(client) = database.connect_listening(notices_tx).await else {
        return Ended::Connection;
    };
    if client
        .batch_execute(&format!("LISTEN \"{channel}\""))
        .await
        .is_err()
    {
        return Ended::Connection;
    }
    wakes.listening.store(true, Ordering::Release);
    // What changed while nothing listened is read again by every waiter.
    wakes.wake_all();
    let send = format!(
        "SELECT set_config('synchronous_commit', 'off', true), \
         (SELECT count(pg_notify('{channel}', p)) FROM unnest($1::text[]) p)"
    );
    loop {
        tokio::select! {
            notice = notices.recv() => match notice {
                Some(payload) => wakes.heard(&payload),
                None => return Ended::Connection,
            },
            first = outgoing.recv() => {
                let Some(first) = first else { return Ended::StoreGone };
                let mut payloads = Vec::new();
                let mut answers = Vec::new();
                let mut next = Some(first);
                while let Some(item) = next.take() {
                    match item {
                        Outgoing::Changed(token) => payloads.push(format!("c{token:x}")),
                        Outgoing::Want(token, how_long, answer) => {
                            payloads.push(format!("w{token:x}:{}", how_long.as_millis()));
                            answers.push(answer);
                        }
                    }
                    if payloads.len() < MAX_PER_STATEMENT {
                        next = outgoing.try_recv().ok();
                    }
                }
                if notify(&client, &send, &payloads).await.is_err() {
                    return Ended::Connection;
                }
                for answer in answers {
                    let _ = answer.send(());
                }
            }
        }
    }
}

async fn notify(client: &tokio_postgres::Client, send: &str, payloads: &[String]) -> Result<()> {
    client
        .query_typed(
            send,
            &[(&payloads, tokio_postgres::types::Type::TEXT_ARRAY)],
        )
        .await
        .map_err(db_error)
        .map(drop)
}

/// A payload, read.
#[derive(Debug, PartialEq)]
enum Heard {
    Changed(u64),
    Want(u64, Duration),
}

fn parse(payload: &str) -> Option<Heard> {
    let hex = |s: &str| u64::from_str_radix(s, 16).ok();
    if let Some(rest) = payload.strip_prefix('c') {
        return hex(rest).map(Heard::Changed);
    }
    let (token, ms) = payload.strip_prefix('w')?.split_once(':')?;
    Some(Heard::Want(
        hex(token)?,
        Duration::from_millis(ms.parse().ok()?),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_read_back_as_they_are_written() {
        let target = Target {
            tenant: b"acme".to_vec(),
            endpoint: b"POST /pay".to_vec(),
            key: "k".into(),
        };
        for token in [0u64, 1, 0xff, u64::MAX, 1 << 63, token(&target)] {
            assert_eq!(parse(&format!("c{token:x}")), Some(Heard::Changed(token)));
            assert_eq!(
                parse(&format!("w{token:x}:1500")),
                Some(Heard::Want(token, Duration::from_millis(1500)))
            );
        }
        for bad in ["", "c", "cxyz", "w1", "w1:x", "w:5", "x12"] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
        assert_eq!(channel("idemdb").len(), "idemdb_".len() + 16);
    }

    #[test]
    fn a_change_is_sent_only_for_a_token_someone_wants() {
        let (wakes, Listener(mut outgoing)) = listening();
        let target = |key: &str| Target {
            tenant: b"t".to_vec(),
            endpoint: b"e".to_vec(),
            key: key.into(),
        };
        wakes.changed([target("a"), target("b")].iter());
        assert!(outgoing.try_recv().is_err(), "nobody wants a or b");
        wakes.heard(&format!("w{:x}:60000", token(&target("b"))));
        wakes.changed([target("a"), target("b")].iter());
        match outgoing.try_recv() {
            Ok(Outgoing::Changed(t)) => assert_eq!(t, token(&target("b"))),
            _ => panic!("b's change is sent"),
        }
        assert!(outgoing.try_recv().is_err(), "and only b's");
    }
}
