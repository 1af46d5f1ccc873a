//! The engine seam: the one enum [`crate::Store`] dispatches every operation through, and what
//! both engines hand back across it. Each engine implements the same operations under the same
//! names (`claim`, `complete`, ..., `figures`), and two that the store asks before a ticket
//! operation: `check` (`Halted` if the engine stopped answering) and `issuer` (the identity
//! its tickets carry, which a heal renews). What both would otherwise repeat is done once,
//! above the seam, by the store: the ticket's issuer and the response's size are checked
//! before an engine sees them, and every answer is counted by the observer. Below the seam
//! the engines share only `crate::model`; neither imports the other, nor anything above.

use crate::file::heal::Healing;
use crate::model::report::EngineFigures;

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
