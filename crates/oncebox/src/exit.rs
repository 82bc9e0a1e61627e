//! The exit codes scripts rely on, defined once, and the one map from the binary's errors to
//! them. The numbers are a contract: do not change or reuse them.

use std::fmt;
use std::process::ExitCode;

/// What a run of `oncebox` ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// The command did what it was asked.
    Ok = 0,
    /// Anything unexpected: an IO or network error, a failed gateway request, a bug; also a
    /// SQLite file that is damaged or no database.
    Failure = 1,
    /// Invalid flags or arguments, an invalid configuration, an unsupported database URL, a
    /// database a newer oncebox migrated, an invalid source name or event id. Retrying the
    /// same command cannot help.
    Usage = 2,
    /// The event, delivery or source named does not exist.
    NotFound = 3,
    /// The store cannot answer now: unreachable, busy, locked, or a commit whose outcome is
    /// unknown. Nothing was decided; retry later.
    Unavailable = 4,
    /// The command ran and the answer is no: `send` got a non-2xx answer, a delivery's state
    /// refuses `retry` or `resolve`, `redeliver` found nothing to deliver, `bench` found a
    /// broken invariant, a p99 above `--p99-max` or no request accepted.
    Refused = 5,
}

/// The table printed at the end of `oncebox --help` and copied into README.md.
pub const TABLE: &str = "\
Exit codes:
  0  ok
  1  failure: an unexpected error (IO, network, a failed request to the gateway); a damaged
     SQLite file
  2  usage: invalid flags, arguments or configuration; an unsupported database URL; a
     database a newer oncebox migrated; a PostgreSQL setup only a change ends (a role
     without the rights, no such database or schema, a pooler dropping startup options)
  3  not found: no such event, delivery or source
  4  unavailable: the store is unreachable, busy or locked; nothing was decided, retry later
  5  refused: the command ran and the answer is no (send got a non-2xx, a delivery's state
     refuses the action, nothing to redeliver, bench found a broken invariant, a p99
     above --p99-max or no request accepted)";

impl From<Code> for ExitCode {
    fn from(code: Code) -> ExitCode {
        ExitCode::from(code as u8)
    }
}

/// An error that carries the exit code it means; its message is the wrapped error's.
#[derive(Debug)]
pub struct Coded {
    pub code: Code,
    error: anyhow::Error,
}

impl fmt::Display for Coded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&message(&self.error))
    }
}

/// An error and its causes, `a: b: c`, each said once. Many errors put their cause in their
/// own text and also return it as their source (thiserror's `"…: {0}"` with `#[from]`), and
/// `{:#}` then printed it twice or three times: a link already said is left out.
pub fn message(error: &anyhow::Error) -> String {
    let mut said = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if text.is_empty() || said.contains(&text) {
            continue;
        }
        if !said.is_empty() {
            said.push_str(": ");
        }
        said.push_str(&text);
    }
    said
}

impl std::error::Error for Coded {}

/// Wraps `error` so it exits with `code`.
pub fn coded(code: Code, error: impl Into<anyhow::Error>) -> anyhow::Error {
    anyhow::Error::new(Coded {
        code,
        error: error.into(),
    })
}

pub fn usage(message: impl fmt::Display) -> anyhow::Error {
    coded(Code::Usage, anyhow::anyhow!("{message}"))
}

pub fn not_found(message: impl fmt::Display) -> anyhow::Error {
    coded(Code::NotFound, anyhow::anyhow!("{message}"))
}

pub fn refused(message: impl fmt::Display) -> anyhow::Error {
    coded(Code::Refused, anyhow::anyhow!("{message}"))
}

/// `result.code(Code::Usage)?`: tags a result's error with an exit code.
pub trait WithCode<T> {
    fn code(self, code: Code) -> anyhow::Result<T>;
}

impl<T, E: Into<anyhow::Error>> WithCode<T> for Result<T, E> {
    fn code(self, code: Code) -> anyhow::Result<T> {
        self.map_err(|e| coded(code, e))
    }
}

/// What ends the command on stderr: the error's message, said as a damaged file for one (the
/// driver's "database disk image is malformed" came as a store "unavailable", which reads as
/// one to wait for).
pub fn report(error: &anyhow::Error) -> String {
    match error.chain().find_map(damaged) {
        Some(why) => format!(
            "the database file is damaged (SQLite: {why}): retrying cannot help; restore it from \
             a backup"
        ),
        None => message(error),
    }
}

/// The exit code of an error: an explicit tag wins, then a damaged SQLite file, then the
/// storage errors that mean "cannot answer now", then invalid keys; anything else is a plain
/// failure.
pub fn classify(error: &anyhow::Error) -> Code {
    for cause in error.chain() {
        if let Some(c) = cause.downcast_ref::<Coded>() {
            return c.code;
        }
        // As the open classifies a damaged file: it stays damaged, so no retry can help.
        if damaged(cause).is_some() {
            return Code::Failure;
        }
        if let Some(code) = storage(cause) {
            return code;
        }
        if cause.is::<oncebox_core::InvalidKey>() {
            return Code::Usage;
        }
    }
    Code::Failure
}

fn storage(cause: &(dyn std::error::Error + 'static)) -> Option<Code> {
    if unavailable_in(cause).is_some() {
        return Some(Code::Unavailable);
    }
    // A store that cannot be opened is unreachable for this run (file cannot be opened, no
    // server, refused login); a malformed URL is the caller's mistake.
    if let Some(e) = cause.downcast_ref::<oncebox_sqlite::OpenError>() {
        let source = match e {
            oncebox_sqlite::OpenError::Sqlite { source, .. } => source,
            // A database a newer oncebox migrated: this binary is the wrong one for it.
            oncebox_sqlite::OpenError::SchemaTooNew { .. } => return Some(Code::Usage),
            _ => return None,
        };
        // A file that is no database, or a damaged one, stays so: retrying cannot help.
        let lasting = matches!(
            source.sqlite_error_code(),
            Some(
                oncebox_sqlite::rusqlite::ErrorCode::NotADatabase
                    | oncebox_sqlite::rusqlite::ErrorCode::DatabaseCorrupt
            )
        );
        return (!lasting).then_some(Code::Unavailable);
    }
    if let Some(e) = cause.downcast_ref::<oncebox_postgres::OpenError>() {
        return match e {
            oncebox_postgres::OpenError::Url(_) => Some(Code::Usage),
            oncebox_postgres::OpenError::Postgres(e) if lasting_postgres(e) => Some(Code::Usage),
            oncebox_postgres::OpenError::Postgres(_) => Some(Code::Unavailable),
            oncebox_postgres::OpenError::SchemaTooNew { .. } => Some(Code::Usage),
            oncebox_postgres::OpenError::MigrationLocked { .. } => Some(Code::Unavailable),
            // A pooler dropping the startup options, a search_path naming no schema or finding
            // the tables elsewhere: only a change of the setup helps.
            oncebox_postgres::OpenError::StartupOptionsIgnored
            | oncebox_postgres::OpenError::NoSchema { .. }
            | oncebox_postgres::OpenError::SchemaElsewhere { .. } => Some(Code::Usage),
            _ => None,
        };
    }
    None
}

/// SQLite's words for a damaged file (`SQLITE_CORRUPT`, `SQLITE_NOTADB`): its own message,
/// its `sqlite3_errstr` text, and rusqlite's text for the code where SQLite gave no message.
const DAMAGED: [&str; 4] = [
    "disk image is malformed",
    "malformed database schema",
    "file is not a database",
    "not a database file",
];

/// SQLite's message when `cause` is the SQLite backend finding the file damaged at query time
/// (a page of an index overwritten). The backend hands that over as `Unavailable::Storage`
/// with SQLite's message alone, its error code not kept, so the message is what tells;
/// unchanged, it would exit 4 and a retrying script would loop on it for ever.
fn damaged<'e>(cause: &'e (dyn std::error::Error + 'static)) -> Option<&'e str> {
    match unavailable_in(cause) {
        Some(oncebox_core::Unavailable::Storage(why))
            if DAMAGED.iter().any(|d| why.contains(d)) =>
        {
            Some(why)
        }
        _ => None,
    }
}

/// The "cannot answer now" a cause is or carries: itself, or inside a process or store error.
fn unavailable_in<'e>(
    cause: &'e (dyn std::error::Error + 'static),
) -> Option<&'e oncebox_core::Unavailable> {
    if let Some(u) = cause.downcast_ref() {
        return Some(u);
    }
    if let Some(oncebox_core::ProcessError::Unavailable(u)) = cause.downcast_ref() {
        return Some(u);
    }
    if let Some(oncebox_sqlite::Error::Unavailable(u)) = cause.downcast_ref() {
        return Some(u);
    }
    if let Some(oncebox_postgres::Error::Unavailable(u)) = cause.downcast_ref() {
        return Some(u);
    }
    None
}

/// TLS refused or not verified (a server without TLS under `sslmode=require`, a certificate
/// for another name or from another CA), or TLS settings that cannot be used: the same on
/// every retry, so a setting to change, not a store to wait for.
fn lasting_postgres(e: &oncebox_postgres::sqlx::Error) -> bool {
    use oncebox_postgres::sqlx::Error;
    match e {
        Error::Tls(_) | Error::Configuration(_) => true,
        // What only a change of the setup ends: a role without the rights it needs (42501),
        // a database or schema that does not exist (3D000, 3F000), a startup the server or a
        // pooler in between refuses as malformed (08P01: PgBouncer's "unsupported startup
        // parameter"). Exit 4 would have a supervisor retry it for ever.
        Error::Database(db) => matches!(
            db.code().as_deref(),
            Some("42501" | "3D000" | "3F000" | "08P01")
        ),
        // rustls's verdict on the server's certificate reaches sqlx inside an IO error.
        Error::Io(io) => io
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            .is_some_and(|tls| {
                matches!(
                    tls,
                    rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented
                )
            }),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_survive_context_and_storage_errors_are_unavailable() {
        let tagged = anyhow::Result::<()>::Err(not_found("no record"))
            .map_err(|e| e.context("inspect"))
            .unwrap_err();
        assert_eq!(classify(&tagged), Code::NotFound);
        let busy = anyhow::Error::new(oncebox_core::Unavailable::Busy).context("stats");
        assert_eq!(classify(&busy), Code::Unavailable);
        let key = oncebox_core::Key::parse("Shop", "evt").unwrap_err();
        assert_eq!(classify(&anyhow::Error::new(key)), Code::Usage);
        assert_eq!(classify(&anyhow::anyhow!("boom")), Code::Failure);
    }

    /// Quotes its cause in its own text and returns it as its source, as thiserror's
    /// `"…: {0}"` with `#[from]` does.
    #[derive(Debug)]
    struct Outer(Inner);

    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "cannot connect: {}", self.0)
        }
    }

    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[derive(Debug)]
    struct Inner;

    impl fmt::Display for Inner {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("role \"x\" does not exist")
        }
    }

    impl std::error::Error for Inner {}

    /// A cause its parent already quotes is said once, as is a wrapper's own text.
    #[test]
    fn each_link_of_a_chain_is_said_once() {
        let e = anyhow::Error::new(Outer(Inner)).context("opening postgres://db/o");
        assert_eq!(
            message(&e),
            "opening postgres://db/o: cannot connect: role \"x\" does not exist"
        );
        let coded = coded(Code::Unavailable, e);
        assert_eq!(
            message(&coded),
            "opening postgres://db/o: cannot connect: role \"x\" does not exist"
        );
    }
}
