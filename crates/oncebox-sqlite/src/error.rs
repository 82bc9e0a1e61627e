//! Errors of the SQLite backend and the one place that decides which SQLite failures mean
//! "unavailable" (retry later) rather than "this request is wrong".

use oncebox_core::Unavailable;
use rusqlite::ErrorCode;

/// Failure of an administrative read or write (`read`, `write`, `purge`, `record`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The database is busy, locked, full, failing or damaged: nothing was decided, retry.
    #[error("unavailable: {0}")]
    Unavailable(#[from] Unavailable),
    /// The statement itself is wrong (constraint, syntax, type): retrying will not help.
    #[error("sqlite: {0}")]
    Sql(rusqlite::Error),
}

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Error {
        match unavailable(&e) {
            Some(u) => Error::Unavailable(u),
            None => Error::Sql(e),
        }
    }
}

/// Why a store could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// SQLite could not open, read or set up the file at `path`.
    #[error("cannot open {path}: {source}")]
    Sqlite {
        /// The file.
        path: String,
        /// What SQLite said.
        source: rusqlite::Error,
    },
    /// The file was written by a newer oncebox; opening it could corrupt what that version keeps.
    #[error("database schema version {found} is newer than this build knows ({known})")]
    SchemaTooNew { found: i64, known: i64 },
    /// Opened without migrations (`Options::migrate(false)`) on a schema older than this
    /// build's: the version that migrates it must open it first.
    #[error(
        "database schema version {found} is older than this build's ({known}) and migrations are off"
    )]
    SchemaOutdated { found: i64, known: i64 },
    /// The operating system refused the writer's thread.
    #[error("cannot start the writer thread: {0}")]
    Thread(std::io::Error),
    /// The database file is missing or empty while its write-ahead log is not: the file was
    /// lost or truncated. Opened anyway, SQLite would start an empty database and discard the
    /// log, and every key the inbox remembered would be new again.
    #[error(
        "{path} is missing or empty but its write-ahead log {path}-wal holds {log_bytes} bytes: \
         the database file was lost or truncated; restore it, or move the log away to start an \
         empty inbox"
    )]
    LostDatabase { path: String, log_bytes: u64 },
    /// The path names no file of its own: `:memory:`, an empty path or a `file:` URI. Each of
    /// the inbox's connections (its writer, checkpointer and readers) would get a database of
    /// its own, and none survives the process: every key would be new again after a restart.
    #[error("{path:?} names no database file ({why}): give the path of a file")]
    NotAFile { path: String, why: &'static str },
    /// The file can be read but not written by this process.
    #[error(
        "{path} can be read but not written by this process (its permissions, an immutable \
         attribute or a read-only mount): the inbox writes every event it answers"
    )]
    ReadOnly { path: String },
}

/// Classifies SQLite errors that say nothing about the request itself: the database is busy,
/// locked, full, failing IO or damaged. Such an error must never become a duplicate answer (G3);
/// it becomes `Unavailable` and the caller retries.
pub(crate) fn unavailable(e: &rusqlite::Error) -> Option<Unavailable> {
    let rusqlite::Error::SqliteFailure(f, msg) = e else {
        return None;
    };
    let text = || msg.clone().unwrap_or_else(|| f.to_string());
    match f.code {
        ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => Some(Unavailable::Busy),
        ErrorCode::DiskFull
        | ErrorCode::SystemIoFailure
        | ErrorCode::DatabaseCorrupt
        | ErrorCode::NotADatabase
        | ErrorCode::OutOfMemory
        | ErrorCode::CannotOpen
        | ErrorCode::ReadOnly
        | ErrorCode::FileLockingProtocolFailed
        | ErrorCode::OperationInterrupted
        | ErrorCode::SchemaChanged => Some(Unavailable::Storage(text())),
        _ => None,
    }
}

/// The storage's failure (`unavailable`) anywhere in a handler's own error and what it wraps:
/// a handler that wrapped a full disk or an I/O error in its own (`HandlerError::failed`, an
/// error with context) had it answered as the event's failure, which a broker consumer counts
/// toward quarantining a valid message, where its bare `Sql` error fails the batch as the
/// outage it is.
pub(crate) fn storage_underneath(
    e: &(dyn std::error::Error + Send + Sync + 'static),
) -> Option<Unavailable> {
    oncebox_core::chain::cause::<rusqlite::Error>(e).and_then(unavailable)
}

/// Any error from oncebox's own statements aborts the batch: they are fixed SQL, so a failure is
/// the storage's, not the request's.
pub(crate) fn storage(e: &rusqlite::Error) -> Unavailable {
    unavailable(e).unwrap_or_else(|| Unavailable::Storage(e.to_string()))
}
