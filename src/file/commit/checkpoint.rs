//! A checkpoint: the durable redb commit after which the journal starts over. The journal is
//! only a log (it appends, recovers, and writes its header); the orchestration of the two
//! files lives here, in the commit pipeline, which owns both.

use crate::error::Result;
use crate::file::batch::{write_batch, Commit, FileState, Op};
use crate::file::journal::Journal;
use redb::Database;

/// Commits `ops` durably into the store file with the journal's next epoch (and the journal's
/// length), writes and syncs the journal's header naming that epoch, then records the header
/// write in a second durable commit. When it returns, every entry written so far is dead (the
/// store file holds it) and `ops` are durable. A store file rolled back past this checkpoint,
/// or an old copy of the journal put beside it, is refused at the next open
/// (`Journal::recover`).
///
/// Returns by how much `ops` changed the records' bytes.
///
/// # Errors
/// The commits' and the header write's errors; `ops` may or may not be durable then.
pub(crate) fn checkpoint(
    journal: &mut Journal,
    db: &Database,
    ops: &[Op],
    file: &mut FileState,
) -> Result<i64> {
    let (epoch, journal_bytes) = journal.next_epoch();
    let bytes = write_batch(
        db,
        ops,
        file,
        Commit::Checkpoint {
            epoch,
            journal_bytes,
        },
    )?;
    journal.restart(epoch)?;
    write_batch(db, &[], file, Commit::HeaderWritten { epoch })?;
    journal.header_recorded();
    Ok(bytes)
}
