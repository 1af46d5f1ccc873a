//! The crate's error type. Expected outcomes of a claim (replay, in progress, mismatch) are not
//! errors: they are variants of [`crate::Claim`]. `Err` means something went wrong.

use std::fmt;

/// A `Result` whose error defaults to [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in idemdb. Each variant's `Display` says what to do next.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The idempotency key is empty, longer than 255 bytes, or holds a byte outside visible
    /// ASCII (0x21..=0x7E). Nothing was stored.
    InvalidKey {
        /// Why the key was refused.
        reason: InputProblem,
    },
    /// The tenant or endpoint of a [`crate::Scope`] is empty or too long. Nothing was stored.
    InvalidScope {
        /// Which part of the scope was refused: `"tenant"` or `"endpoint"`.
        part: &'static str,
        /// Why it was refused.
        reason: InputProblem,
    },
    /// The PostgreSQL schema name given to [`crate::StoreBuilder::schema`] breaks the rule of
    /// [`crate::validate_schema`]: [`crate::StoreBuilder::connect`] refuses it before it
    /// connects. Nothing was created.
    InvalidSchema {
        /// The name that was refused.
        name: String,
        /// Why it was refused.
        reason: InputProblem,
    },
    /// The ticket's claim is no longer held by it: it was released, completed, reaped, purged or
    /// taken over by a later claim (a newer fence). Nothing was changed.
    LeaseLost {
        /// The fence of the ticket that was refused.
        fence: u64,
    },
    /// The encoded response is larger than the store's limit
    /// ([`crate::StoreBuilder::max_response_bytes`]). Nothing was stored; the claim is still
    /// held, and the ticket comes back in `ticket` so the caller can release it or complete it
    /// with a smaller response.
    ResponseTooLarge {
        /// The encoded size of the response, in bytes.
        size: usize,
        /// The configured limit, in bytes.
        limit: usize,
        /// The ticket passed to [`crate::Store::complete`], still holding the claim (`None`
        /// when the response came from a reap resolver).
        ticket: Option<Box<crate::Ticket>>,
    },
    /// Part of the store failed its checksum, could not be decoded, or contradicts the rest.
    /// The store refuses to open (or to answer for that record) rather than drop a completed
    /// record, which could repeat a payment.
    Corrupted {
        /// Which part is damaged.
        damaged: Damaged,
        /// What was wrong with it.
        reason: String,
    },
    /// The journal beside the store file (`<store>-journal`) is not this store's, or not of
    /// its current life: another store's journal, a journal older than the store file (an old
    /// copy), or a store file older than its journal (a checkpoint rolled back, or the file
    /// restored from a backup without its journal). Nothing was replayed or changed.
    JournalMismatch {
        /// The store id the journal names.
        journal_store: u64,
        /// This store's id.
        store: u64,
        /// The epoch the journal names.
        journal_epoch: u64,
        /// The epoch the store file names.
        store_epoch: u64,
    },
    /// The file (or the PostgreSQL schema) was written by an idemdb whose format this version
    /// does not read.
    UnsupportedFormat {
        /// The format version found in the file.
        found: u64,
        /// The format version this build reads and writes.
        supported: u64,
    },
    /// Another `Store` (in this or another process) has the file open.
    AlreadyOpen,
    /// An earlier commit failed to reach the disk. The store stopped accepting operations so
    /// that nothing it answers can disagree with what the disk holds. A store file reopens
    /// itself once the disk works again ([`crate::StoreBuilder::heal_after`]): retry later.
    Halted {
        /// What the failed commit reported.
        cause: String,
    },
    /// An I/O error from the operating system. `Display` shows its message;
    /// [`std::error::Error::source`] continues with the I/O error's own cause, if it has one.
    Io(std::io::Error),
    /// An error from the storage engine (redb) that is not a plain I/O error.
    Storage(StorageError),
    /// The PostgreSQL database refused or failed the operation, or could not be reached (a bad
    /// connection string, a refused login, missing permissions, a lost connection, a
    /// failover). Retry later; the HTTP layer answers 503 with `Retry-After`.
    ///
    /// A claim that fails this way was not received: if its statement committed before the
    /// connection was lost, the key stays in progress until its lease ends, and
    /// [`crate::Store::reap`] on a replica with the same owner offers it at once after a
    /// restart. No side effect ever runs on a claim the caller did not receive.
    Database {
        /// The server's SQLSTATE code (`"42501"`: insufficient privilege, `"28P01"`: wrong
        /// password, ...), when the server answered.
        sqlstate: Option<String>,
        /// What went wrong, in full: the server's message with its detail and hint, or the
        /// client's error with its causes. This is what `Display` shows.
        reason: String,
        /// The driver's own error (a `tokio_postgres::Error`: downcast it for the server's
        /// structured fields, such as the table or constraint), when the driver reported one.
        /// It is not [`std::error::Error::source`]: its text is already in `reason`, and an
        /// error chain would print it twice.
        driver: Option<std::sync::Arc<dyn std::error::Error + Send + Sync>>,
    },
    /// An import ([`crate::Store::import`]) was refused, and nothing was imported: a line of
    /// its input is not an exported record (`line` counts from 1), or the store to import into
    /// cannot take it (`line` 0: it is not empty, or it is a file store).
    InvalidImport {
        /// The input line at fault, or 0 for the store itself.
        line: u64,
        /// What was wrong.
        reason: String,
    },
    /// The claim would create a record for a tenant that already holds
    /// [`crate::StoreBuilder::max_live_records_per_tenant`] of them. Nothing was stored; other
    /// tenants are unaffected. The HTTP layer answers 429 with `Retry-After`.
    TenantFull {
        /// The tenant (its bytes, lossily as UTF-8).
        tenant: String,
        /// The limit.
        limit: u64,
    },
    /// A claim of a new key was refused because the store's records already fill
    /// [`crate::StoreBuilder::max_store_bytes`]. Nothing was stored; claims of existing keys,
    /// completions, releases and purges go on. The HTTP layer answers 503 with `Retry-After`.
    StoreFull {
        /// The records' bytes when it was refused.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// A claim that would write a record was refused because the filesystem holding the store
    /// file has too little free space: less than the reserve for recovery and room for the next
    /// checkpoint ([`crate::StoreBuilder::reserve_size`]). Nothing was stored; replays,
    /// completions, releases and purges go on, and claims succeed again, without a restart,
    /// once space is freed. The HTTP layer answers 503 with `Retry-After`.
    DiskFull {
        /// The bytes free when it was last measured.
        available: u64,
        /// The bytes free that claims need.
        needed: u64,
    },
    /// TLS to the database could not be set up or was refused by this side: a certificate file
    /// that cannot be read, a mode that cannot be honoured, or a server certificate that does
    /// not verify (signed by no given root, or not naming the host); `reason` says what did not
    /// match. Nothing was sent to the database. A server that refuses a connection without TLS
    /// answers [`Error::Database`] with its SQLSTATE instead.
    Tls {
        /// What did not match, or which file or setting could not be used.
        reason: String,
    },
    /// The engine does not offer a setting the store was built with (`what` names it).
    Unsupported {
        /// The setting, and where it is not offered.
        what: String,
    },
    /// An [`crate::IdempotentFn`] could not encode an input or result as JSON, or could not
    /// decode a stored result as the type the call asked for (feature `serde`). A result that
    /// ran but could not be encoded was not stored: its claim stays in progress, as after an
    /// ambiguous failure.
    ResultEncoding {
        /// What failed: `"input"`, `"result"` or `"stored result"`.
        what: &'static str,
        /// The encoder's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// The part of a store that [`Error::Corrupted`] found damaged.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Damaged {
    /// A record of the store file.
    Record {
        /// Where it is stored, when known: the fence of its claim, or for a completion stored
        /// apart from its claim (store format 7 on), a later fence of its own.
        fence: Option<u64>,
        /// Its scoped key as `"tenant"/"endpoint"/key` (non-printable bytes escaped), when it
        /// could be read.
        key: Option<String>,
    },
    /// The store file as a whole: empty where a store should be, or not a store file.
    File,
    /// The store file's `meta` table (format version, store id, fence reservation, journal
    /// epoch and size).
    Meta,
    /// The journal beside the store file (`<store>-journal`): an entry, or the file itself.
    Journal,
    /// The storage engine's (redb's) page structure.
    Pages,
    /// The in-memory index could not be built from the records: two records' keys share an
    /// index hash under every hash key tried (about 10⁻²⁵ by chance: in practice, damage).
    Index,
}

impl fmt::Display for Damaged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Damaged::Record {
                fence: Some(fence),
                key: Some(key),
            } => write!(f, "record {key} at fence {fence}"),
            Damaged::Record {
                fence: Some(fence),
                key: None,
            } => write!(f, "the record at fence {fence} (its key is unreadable)"),
            Damaged::Record {
                fence: None,
                key: Some(key),
            } => write!(f, "record {key}"),
            Damaged::Record {
                fence: None,
                key: None,
            } => write!(f, "a record"),
            Damaged::File => write!(f, "the store file"),
            Damaged::Meta => write!(f, "the store file's meta table"),
            Damaged::Journal => write!(f, "the journal file"),
            Damaged::Pages => write!(f, "the storage engine's pages"),
            Damaged::Index => write!(f, "the index built from the records"),
        }
    }
}

/// Why a piece of caller input was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum InputProblem {
    /// It was empty.
    Empty,
    /// It was longer than the limit.
    TooLong {
        /// Its length in bytes.
        len: usize,
        /// The largest length accepted.
        max: usize,
    },
    /// It held a byte outside the accepted range.
    BadByte {
        /// The offending byte.
        byte: u8,
        /// Its position.
        at: usize,
    },
    /// It started with a prefix that is reserved (a schema name's `pg_`, which PostgreSQL
    /// keeps for its own schemas).
    Reserved {
        /// The reserved prefix.
        prefix: &'static str,
    },
}

impl fmt::Display for InputProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InputProblem::Empty => write!(f, "it is empty"),
            InputProblem::TooLong { len, max } => {
                write!(f, "it is {len} bytes long, the limit is {max}")
            }
            InputProblem::BadByte { byte, at } => {
                write!(f, "byte {at} is 0x{byte:02x}, outside the accepted range")
            }
            InputProblem::Reserved { prefix } => {
                write!(f, "it starts with {prefix}, a reserved prefix")
            }
        }
    }
}

/// An error reported by the storage engine underneath idemdb (redb), kept opaque so that
/// idemdb's public API does not depend on redb's.
#[derive(Debug)]
pub struct StorageError(pub(crate) Box<dyn std::error::Error + Send + Sync>);

impl fmt::Display for StorageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for StorageError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidKey { reason } => write!(
                f,
                "invalid idempotency key ({reason}): send 1 to 255 bytes of visible ASCII \
                 (0x21..=0x7E), such as a UUID"
            ),
            Error::InvalidScope { part, reason } => write!(
                f,
                "invalid scope {part} ({reason}): pass a non-empty {part} within the documented \
                 bound"
            ),
            Error::InvalidSchema { name, reason } => write!(
                f,
                "invalid PostgreSQL schema name {name:?} ({reason}): name it with 1 to 63 \
                 lower-case ASCII letters, digits and _, not starting with a digit or with pg_ \
                 (which PostgreSQL reserves), such as idemdb or payments_v2"
            ),
            Error::LeaseLost { fence } => write!(
                f,
                "the claim with fence {fence} is no longer held (released, completed, reaped or \
                 taken over): do not store this result; reconcile with the current holder"
            ),
            Error::ResponseTooLarge { size, limit, .. } => write!(
                f,
                "response of {size} bytes exceeds the store's limit of {limit} bytes: store a \
                 smaller response or raise max_response_bytes; the claim is still held (the \
                 error returns the ticket)"
            ),
            Error::Corrupted { damaged, reason } => write!(
                f,
                "the store is corrupted in {damaged}: {reason}; restore the store file and its \
                 journal from a backup, or inspect them, before reopening"
            ),
            Error::JournalMismatch {
                journal_store,
                store,
                journal_epoch,
                store_epoch,
            } => {
                if journal_store != store {
                    write!(
                        f,
                        "the journal beside the store file belongs to store {journal_store:016x}, \
                         not to this store ({store:016x}): it was not replayed; put this store's \
                         own journal beside it, or restore both files from one backup"
                    )
                } else if journal_epoch > store_epoch {
                    write!(
                        f,
                        "the store file (epoch {store_epoch}) is older than its journal (epoch \
                         {journal_epoch}): a checkpoint was lost or the file was restored alone, \
                         and acknowledged writes may be missing; restore both files from one backup"
                    )
                } else {
                    write!(
                        f,
                        "the journal (epoch {journal_epoch}) is older than the store file (epoch \
                         {store_epoch}): it is an old copy and may lack acknowledged writes; put \
                         the store's current journal beside it"
                    )
                }
            }
            Error::UnsupportedFormat { found, supported } => write!(
                f,
                "store (file format or PostgreSQL schema) has version {found}, this build \
                 reads version {supported}: use a matching idemdb version"
            ),
            Error::AlreadyOpen => write!(
                f,
                "the store file is already open in another Store or process: share one Store \
                 (it is cheap to clone) instead of opening the file twice"
            ),
            Error::Halted { cause } => write!(
                f,
                "the store halted after a failed commit ({cause}): nothing after that failure \
                 was acknowledged; it reopens itself once the disk works again (unless told \
                 not to heal: then drop every handle and reopen the store)"
            ),
            Error::Io(e) => write!(
                f,
                "I/O error: {e}; after a failed write or sync the store halts, and reopens itself \
                 once the disk works again"
            ),
            Error::Storage(e) => write!(f, "storage engine error: {e}"),
            Error::Database {
                sqlstate: Some(code),
                reason,
                ..
            } => write!(f, "database error (SQLSTATE {code}): {reason}"),
            Error::Database {
                sqlstate: None,
                reason,
                ..
            } => write!(
                f,
                "database error: {reason}; retry when the database is reachable"
            ),
            Error::InvalidImport { line: 0, reason } => {
                write!(f, "import refused, nothing imported: {reason}")
            }
            Error::InvalidImport { line, reason } => {
                write!(
                    f,
                    "import refused at line {line}, nothing imported: {reason}"
                )
            }
            Error::TenantFull { tenant, limit } => write!(
                f,
                "tenant {tenant:?} holds {limit} live records, the most this store allows; \
                 nothing was stored: finish or release its claims, purge expired records, or \
                 raise max_live_records_per_tenant"
            ),
            Error::StoreFull { bytes, limit } => write!(
                f,
                "the store's records fill {bytes} of the {limit} bytes it may hold \
                 (max_store_bytes); nothing was stored: purge expired records, or raise the \
                 limit if the disk has room"
            ),
            Error::DiskFull { available, needed } => write!(
                f,
                "the filesystem holding the store has {available} bytes free, short of the \
                 {needed} it keeps for its recovery and its next checkpoint (reserve_size); \
                 nothing was stored: replays and completions go on, and claims succeed again, \
                 without a restart, once space is freed"
            ),
            Error::Tls { reason } => write!(f, "TLS to the database: {reason}"),
            Error::Unsupported { what } => write!(f, "not supported: {what}"),
            Error::ResultEncoding {
                what: "stored result",
                source,
            } => write!(
                f,
                "a stored result does not decode as the type this call asks for ({source}): \
                 keep a function's result types compatible across versions, or give the changed \
                 function a new scope"
            ),
            Error::ResultEncoding { what, source } => write!(
                f,
                "the {what} could not be encoded as JSON ({source}): use types whose \
                 serialization cannot fail (no maps with non-string keys)"
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            // Its message is in this error's `Display`: the chain goes on with its cause.
            Error::Io(e) => e.source(),
            Error::Storage(e) => Some(e),
            Error::ResultEncoding { source, .. } => Some(&**source),
            _ => None,
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e)
    }
}

/// The error for a panic raised inside the storage engine (redb 4.6 panics on some damaged
/// pages instead of returning an error): a damaged file is a typed error, never a crash of the
/// service using the store.
pub(crate) fn storage_panic(panic: Box<dyn std::any::Any + Send>) -> Error {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into());
    Error::Corrupted {
        damaged: Damaged::Pages,
        reason: format!("the storage engine failed on the file's pages: {what}"),
    }
}

fn storage(e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::Storage(StorageError(Box::new(e)))
}

impl From<redb::StorageError> for Error {
    fn from(e: redb::StorageError) -> Self {
        match e {
            redb::StorageError::Io(io) => Error::Io(io),
            redb::StorageError::Corrupted(reason) => Error::Corrupted {
                damaged: Damaged::Pages,
                reason,
            },
            other => storage(other),
        }
    }
}

impl From<redb::DatabaseError> for Error {
    fn from(e: redb::DatabaseError) -> Self {
        match e {
            redb::DatabaseError::DatabaseAlreadyOpen => Error::AlreadyOpen,
            redb::DatabaseError::Storage(s) => s.into(),
            other => storage(other),
        }
    }
}

impl From<redb::TransactionError> for Error {
    fn from(e: redb::TransactionError) -> Self {
        match e {
            redb::TransactionError::Storage(s) => s.into(),
            other => storage(other),
        }
    }
}

impl From<redb::TableError> for Error {
    fn from(e: redb::TableError) -> Self {
        match e {
            redb::TableError::Storage(s) => s.into(),
            other => storage(other),
        }
    }
}

impl From<redb::CommitError> for Error {
    fn from(e: redb::CommitError) -> Self {
        match e {
            redb::CommitError::Storage(s) => s.into(),
            other => storage(other),
        }
    }
}

impl From<redb::SetDurabilityError> for Error {
    fn from(e: redb::SetDurabilityError) -> Self {
        storage(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_says_what_to_do() {
        let e = Error::InvalidKey {
            reason: InputProblem::TooLong { len: 300, max: 255 },
        };
        let s = e.to_string();
        assert!(s.contains("300 bytes"), "{s}");
        assert!(s.contains("visible ASCII"), "{s}");
        let e = Error::Halted {
            cause: "disk full".into(),
        };
        assert!(e.to_string().contains("reopen"));
    }

    /// Every message of an error's chain, as a reporter prints it.
    fn chain(e: &(dyn std::error::Error + 'static)) -> String {
        let mut out = e.to_string();
        let mut next = e.source();
        while let Some(cause) = next {
            out.push_str(": ");
            out.push_str(&cause.to_string());
            next = cause.source();
        }
        out
    }

    /// `Error::Io` printed its I/O error in `Display` and returned it from `source()` too, so
    /// every error chain printed the operating system's message twice.
    #[test]
    fn an_io_error_is_printed_once_in_a_chain_and_keeps_its_cause() {
        #[derive(Debug)]
        struct Cause;
        impl std::fmt::Display for Cause {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("the cause")
            }
        }
        impl std::error::Error for Cause {}
        let plain = Error::from(std::io::Error::other("no space left"));
        assert_eq!(
            chain(&plain).matches("no space left").count(),
            1,
            "{}",
            chain(&plain)
        );
        assert!(matches!(plain, Error::Io(_)));
        let wrapped = Error::from(std::io::Error::other(Cause));
        assert_eq!(
            chain(&wrapped).matches("the cause").count(),
            1,
            "{}",
            chain(&wrapped)
        );
    }
}
