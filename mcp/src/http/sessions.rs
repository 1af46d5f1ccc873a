//! The HTTP sessions of a gateway, by id: made by `initialize` (at most `--max-sessions` at
//! once), found by the `Mcp-Session-Id` header, ended by `DELETE`, by the idle sweep, or when
//! their upstream ends.

use super::session::Session;
use super::StartUpstream;
use crate::keyed::Keying;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Every live session.
pub(crate) struct Sessions {
    live: Mutex<HashMap<String, Arc<Session>>>,
    max: usize,
}

/// Why a session could not be made.
#[derive(Debug)]
pub(crate) enum NotMade {
    /// `--max-sessions` are live.
    Full,
    /// The upstream would not start.
    Upstream(std::io::Error),
    /// The operating system gave no random bytes for an id.
    NoRandomness,
}

impl Sessions {
    pub(crate) fn new(max: usize) -> Arc<Sessions> {
        Arc::new(Sessions {
            live: Mutex::new(HashMap::new()),
            max,
        })
    }

    fn live(&self) -> MutexGuard<'_, HashMap<String, Arc<Session>>> {
        self.live
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Makes a session of `tenant`'s with a fresh upstream. The lock is held while the
    /// upstream starts, so that `--max-sessions` is never exceeded by `initialize`s at once.
    pub(crate) fn make(
        self: &Arc<Self>,
        tenant: String,
        start: &StartUpstream,
        keying: &Arc<Keying>,
    ) -> Result<Arc<Session>, NotMade> {
        let mut live = self.live();
        if live.len() >= self.max {
            return Err(NotMade::Full);
        }
        let id = new_id().ok_or(NotMade::NoRandomness)?;
        let upstream = start().map_err(NotMade::Upstream)?;
        let sessions = Arc::downgrade(self);
        let session = Session::start(id.clone(), tenant, upstream, Arc::clone(keying), move |s| {
            if let Some(sessions) = sessions.upgrade() {
                sessions.forget(&s.id);
            }
        });
        live.insert(id, Arc::clone(&session));
        Ok(session)
    }

    /// The live session `id`.
    pub(crate) fn get(&self, id: &str) -> Option<Arc<Session>> {
        self.live().get(id).cloned()
    }

    /// Ends the session `id` (it is unknown from now on); `false` if there was none.
    pub(crate) fn end(&self, id: &str, why: &str) -> bool {
        let session = self.live().remove(id);
        match session {
            Some(session) => {
                session.end(why);
                true
            }
            None => false,
        }
    }

    fn forget(&self, id: &str) {
        self.live().remove(id);
    }

    /// Ends every session idle for `idle`.
    pub(crate) fn sweep(&self, idle: Duration) {
        let idle: Vec<Arc<Session>> = {
            let mut live = self.live();
            let ids: Vec<String> = live
                .values()
                .filter(|s| s.idle(idle))
                .map(|s| s.id.clone())
                .collect();
            ids.iter().filter_map(|id| live.remove(id)).collect()
        };
        for session in idle {
            session.end("the session was idle too long");
        }
    }

    /// How many sessions are live.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.live().len()
    }
}

/// A session id: 128 bits from the operating system's random source, in hex.
fn new_id() -> Option<String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).ok()?;
    Some(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// How often idle sessions are looked for: every half of the idle time, at most every 5 s.
pub(crate) fn sweep_every(idle: Duration) -> Duration {
    (idle / 2).clamp(Duration::from_millis(10), Duration::from_secs(5))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_128_random_bits_in_hex() {
        let (a, b) = (new_id().unwrap(), new_id().unwrap());
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn the_sweep_runs_at_half_the_idle_time_at_most_every_5_s() {
        assert_eq!(
            sweep_every(Duration::from_secs(1)),
            Duration::from_millis(500)
        );
        assert_eq!(
            sweep_every(Duration::from_secs(600)),
            Duration::from_secs(5)
        );
    }
}
