//! The values every layer shares, below the engine seam: what a caller passes in (a scope, a
//! key, a fingerprint, a response), what a claim answers (a claim, a ticket, an entry), and
//! what a scan, an export and an import carry, and what an engine reports (its figures, a
//! reap's or a purge's tally). Both engines and the store above them build on
//! these; nothing here knows an engine.

pub(crate) mod census;
pub(crate) mod claim;
pub(crate) mod fingerprint;
pub(crate) mod listing;
pub(crate) mod moved;
pub(crate) mod report;
pub(crate) mod response;
pub(crate) mod scope;
pub(crate) mod ticket;
