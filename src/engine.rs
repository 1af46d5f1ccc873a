//! The engine seam: the one enum [`crate::Store`] dispatches every operation through, and what
//! both engines hand back across it. Each engine implements the same operations under the same
//! names (`claim`, `complete`, ..., `figures`), and two that the store asks before a ticket
//! operation: `check` (`Halted` if the engine stopped answering) and `issuer` (the identity
//! its tickets carry, which a heal renews). What both would otherwise repeat is done once,
//! above the seam, by the store: the ticket's issuer and the response's size are checked
//! before an engine sees them, and every answer is counted by the observer. Below the seam
//! the engines share only `crate::model`; neither imports the other, nor anything above.

use crate::error::Error;
use crate::file::heal::Healing;
use crate::stats::EngineFigures;

/// The engine a store runs on.
#[derive(Clone, Debug)]
pub(crate) enum Engine {
    File(Healing),
    #[cfg(feature = "postgres")]
    Postgres(crate::postgres::PgStore),
}

/// Runs `$call` on the store's engine, bound to `$e`.
macro_rules! dispatch {
    ($engine:expr, $e:ident => $call:expr) => {
        match $engine {
            $crate::engine::Engine::File(healing) => {
                let $e = &healing.current();
                $call
            }
            #[cfg(feature = "postgres")]
            $crate::engine::Engine::Postgres($e) => $call,
        }
    };
}
pub(crate) use dispatch;

impl Engine {
    /// What only the engine knows of the store's figures.
    pub(crate) fn figures(&self) -> EngineFigures {
        dispatch!(self, e => e.figures())
    }
}

/// What a reap or a purge did: how many records it resolved or deleted, and the error that
/// stopped it, if one did. A reap that the seam's check stopped (an oversize response from the
/// resolver) counts what it resolved before, which stays resolved; an engine that fails counts
/// nothing, as its caller gets the error and cannot tell what landed.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub(crate) done: usize,
    pub(crate) stopped: Option<Error>,
}

impl Tally {
    /// A tally of `done` records, stopped by `result`'s error if it has one.
    pub(crate) fn of(done: usize, result: crate::Result<()>) -> Tally {
        Tally {
            done,
            stopped: result.err(),
        }
    }

    /// Nothing done: stopped before the first record.
    pub(crate) fn failed(e: Error) -> Tally {
        Tally {
            done: 0,
            stopped: Some(e),
        }
    }
}
