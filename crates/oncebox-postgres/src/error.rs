//! Errors of the PostgreSQL backend and the one place that decides which failures mean
//! "unavailable" (retry later) rather than "this request is wrong".

use oncebox_core::Unavailable;

/// Failure of an administrative read or write (`record`, `purge`, listings).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The server is away, busy or refusing for now: nothing was decided, retry.
    #[error("unavailable: {0}")]
    Unavailable(#[from] Unavailable),
    /// The statement itself is wrong (constraint, syntax, type): retrying will not help.
    #[error("postgres: {0}")]
    Sql(sqlx::Error),
}

impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Error {
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
    /// The URL does not parse as a PostgreSQL one.
    #[error("invalid database URL: {0}")]
    Url(String),
    /// Connecting or migrating failed: what the server or the connection said.
    #[error("cannot connect or migrate: {0}")]
    Postgres(#[from] sqlx::Error),
    /// The database was migrated by a newer oncebox; using it could corrupt what that version keeps.
    #[error("database schema version {found} is newer than this build knows ({known})")]
    SchemaTooNew { found: i64, known: i64 },
    /// Opened without migrations (`Options::migrate(false)`) on a schema older than this
    /// build's, or on none (version 0): the version that migrates it must open it first.
    #[error(
        "database schema version {found} is older than this build's ({known}) and migrations are off"
    )]
    SchemaOutdated { found: i64, known: i64 },
    /// Another session held the migration lock for longer than a start waits
    /// (`Options::migration_lock_wait`): a node migrating a large schema,
    /// or one that stopped mid-migration, whose session the server has not ended yet.
    #[error(
        "another session held the migration lock for {waited:?} ({}); if it is stuck, end it \
         (pg_terminate_backend) and start again",
        holder.as_deref().unwrap_or("session unknown")
    )]
    MigrationLocked {
        holder: Option<String>,
        waited: std::time::Duration,
    },
    /// The server did not apply the connection's startup options: the schema, durable
    /// commits, the isolation level and the idle-transaction limit were all dropped on the
    /// way, as a pooler does that ignores them (PgBouncer's `ignore_startup_parameters =
    /// options`). Two deployments on their own schemas would then share one.
    #[error(
        "the server did not apply this connection's startup options, the schema asked for \
         among them: a connection pooler in between drops them (PgBouncer with \
         ignore_startup_parameters = options); connect to PostgreSQL directly, or name the \
         schema in the role's search_path (ALTER ROLE … SET search_path) instead"
    )]
    StartupOptionsIgnored,
    /// oncebox's tables are found through the `search_path` in one schema, while the first
    /// schema of that path that exists, where oncebox's own statements and any new table go,
    /// is another: a schema named like the role, created later, before `public` in the default
    /// `"$user", public`. Run on, the handlers' statements would fail, or a migration would
    /// start empty tables there and forget every key kept in the first.
    #[error(
        "oncebox's tables are in schema {tables:?}, but the connection's current schema (the \
         first of its search_path that exists and the role may use) is {current:?}: name the schema ({tables:?}) in \
         the settings, or take {current:?} out of the search_path"
    )]
    SchemaElsewhere { tables: String, current: String },
    /// No schema of the connection's `search_path` exists, so there is nowhere to keep the
    /// tables.
    #[error(
        "no schema of the search_path ({search_path}) exists: create it, or name one that does"
    )]
    NoSchema { search_path: String },
}

/// SQLSTATEs that say nothing about the request itself. Class 08 (connection), 40001
/// (serialization failure), 40P01 (deadlock detected), 55P03 (lock not available), 57014
/// (query cancelled, e.g. statement_timeout), 57P01–57P05 (shutdown, crash recovery,
/// cannot connect now, database dropped, idle session timeout), 53 (insufficient resources:
/// disk full, out of memory, too many connections), 58 (system/IO error), XX (internal).
fn transient(code: &str) -> bool {
    code.starts_with("08")
        || code.starts_with("53")
        || code.starts_with("57")
        || code.starts_with("58")
        || code.starts_with("XX")
        || matches!(code, "40001" | "40P01" | "55P03" | "25P03")
}

/// Classifies an error as unavailability, or `None` when it is the statement's own fault.
/// Lost connections, pool timeouts and IO errors are unavailability: such an error must never
/// become a duplicate answer (G3). A unique violation (23505) is not here: oncebox's own claims
/// use `ON CONFLICT`, so one reaching a caller comes from the user's SQL and fails that event.
pub(crate) fn unavailable(e: &sqlx::Error) -> Option<Unavailable> {
    match e {
        sqlx::Error::Database(db) => {
            let code = db.code()?;
            if code == "40001" || code == "40P01" || code == "55P03" {
                Some(Unavailable::Busy)
            } else if transient(&code) {
                Some(Unavailable::Storage(format!("{} ({code})", db.message())))
            } else {
                None
            }
        }
        // sqlx says only that the wait ended; the pool's failed connects (the server at its
        // `max_connections`, restarting, unreachable) are not in it. Said here, where an
        // operator reads it.
        sqlx::Error::PoolTimedOut => Some(Unavailable::Storage(POOL_TIMED_OUT.to_owned())),
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => Some(Unavailable::Storage(e.to_string())),
        _ => None,
    }
}

/// What a wait for a pooled connection that ended says.
pub(crate) const POOL_TIMED_OUT: &str = "no database connection within the deadline: every pooled \
     connection was busy, or the server refused new ones (at its max_connections, restarting, \
     unreachable; its log says which)";

/// Any error from oncebox's own statements is the storage's, not the request's: they are fixed
/// SQL.
pub(crate) fn storage(e: &sqlx::Error) -> Unavailable {
    unavailable(e).unwrap_or_else(|| Unavailable::Storage(e.to_string()))
}

/// A failed `COMMIT` whose cause may have hit after the server committed (the connection broke
/// while the reply was in flight): the outcome is unknown, so it is reported as such, and a
/// retry reads the truth from the inbox.
pub(crate) fn commit_failed(e: &sqlx::Error) -> Unavailable {
    if answer_lost(e) {
        Unavailable::CommitUnknown(e.to_string())
    } else {
        storage(e)
    }
}

/// Whether `e` says the answer to a statement already sent was lost rather than that the
/// server refused it: the connection broke, or a pooler in between says so with a connection
/// exception (class 08: PgBouncer answers `08P01` "server conn crashed?" when its server
/// connection broke under a query). Read as the server's refusal, a `COMMIT` the server had
/// done was answered "nothing kept".
pub(crate) fn answer_lost(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => db.code().is_some_and(|c| c.starts_with("08")),
        _ => true,
    }
}

/// Runs a lease's write outside a transaction (autocommit: `complete`, `release`,
/// `uncertain`, the relay's `record`). The connection is taken first: a pool that gave none (a
/// new connection refused, unreachable, its TLS failed) sent nothing, which is `Storage`. When
/// the connection broke after the statement was sent, the server may have committed it with
/// its answer lost on the way: the outcome is unknown (`CommitUnknown`), not "nothing kept",
/// and the caller's retry may find its own write done (`release` then reads `Fenced`, which the
/// relay takes for its own write done).
pub(crate) async fn lease_write(
    pool: &sqlx::PgPool,
    lost_after: std::time::Duration,
    query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
) -> Result<sqlx::postgres::PgQueryResult, oncebox_core::LeaseError> {
    autocommit_write(pool, lost_after, query)
        .await
        .map_err(oncebox_core::LeaseError::Unavailable)
}

/// Runs one write outside a transaction, telling a lost answer (`CommitUnknown`) from nothing
/// sent (`Storage`), as [`lease_write`] says; also an operator's `resolve`, whose retry after a
/// lost answer would otherwise read "not resolvable" for its own write done.
pub(crate) async fn autocommit_write(
    pool: &sqlx::PgPool,
    lost_after: std::time::Duration,
    query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
) -> Result<sqlx::postgres::PgQueryResult, Unavailable> {
    let mut conn = pool.acquire().await.map_err(|e| storage(&e))?;
    let done = crate::silent::answered(lost_after, query.execute(&mut *conn)).await;
    done.map_err(|e| match e {
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::Protocol(_) => {
            Unavailable::CommitUnknown(e.to_string())
        }
        sqlx::Error::Database(_) if answer_lost(&e) => Unavailable::CommitUnknown(e.to_string()),
        _ => storage(&e),
    })
}

/// A handler's `COMMIT` that failed. The server refusing it for what the transaction wrote (a
/// deferred constraint of the handler's tables, a deferred trigger's error: not a transient
/// code) rolled it back for certain: that is the handler's failure, and the key stays free.
/// Told as unavailability, a consumer would hold the message for ever, retrying.
///
/// Except PostgreSQL's notification queue, full (`54000` raised by its `async.c`: a session
/// somewhere that ran `LISTEN` holds a transaction open, and the queue is the whole server's).
/// The wake-up the transaction queued for relays is refused with it; nothing of the handler's
/// is at fault, and a consumer told "the handler failed" would quarantine a valid message
/// after `max_attempts`. Any other `54000` (a limit the handler's own deferred trigger met)
/// stays the handler's.
pub(crate) fn handler_commit_failed(e: sqlx::Error) -> oncebox_core::ProcessError {
    match &e {
        sqlx::Error::Database(db)
            if notify_queue_full(db.code().as_deref(), source_file(&**db)) =>
        {
            oncebox_core::ProcessError::Unavailable(Unavailable::Storage(format!(
                "{} (54000): the server refused the commit for a limit of its own (its \
                 notification queue full, when a session that listens holds a transaction open)",
                db.message()
            )))
        }
        sqlx::Error::Database(_) if unavailable(&e).is_none() => {
            oncebox_core::ProcessError::Handler(Box::new(e))
        }
        _ => oncebox_core::ProcessError::Unavailable(commit_failed(&e)),
    }
}

/// The server's source file that raised `db`, which names the error's origin whatever the
/// server's language.
fn source_file(db: &dyn sqlx::error::DatabaseError) -> Option<&str> {
    db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
        .and_then(|pg| pg.file())
}

/// Whether an error is the notification queue's being full: `54000` from `async.c`.
fn notify_queue_full(code: Option<&str>, file: Option<&str>) -> bool {
    code == Some("54000") && file == Some("async.c")
}

/// Recording a handler's completed outcome failed. `25P02`: a statement of the handler failed
/// and the handler went on and returned success; PostgreSQL had aborted the transaction, so
/// nothing of it can commit. The handler hid the error it got, so what it was (a passing lock
/// timeout, or its own SQL) is unknown; reported as the handler's failure, which it is, rather
/// than as unavailability that a handler hiding its own SQL error would meet on every retry.
pub(crate) fn record_failed(e: &sqlx::Error) -> oncebox_core::ProcessError {
    match e {
        sqlx::Error::Database(db) if db.code().as_deref() == Some("25P02") => {
            oncebox_core::ProcessError::Handler(
                "the handler returned success after one of its statements failed, which \
                 aborted its transaction: nothing of it was committed"
                    .into(),
            )
        }
        _ => oncebox_core::ProcessError::Unavailable(after_handler(e)),
    }
}

/// A failure of oncebox's own statement after a handler ran, before the commit. The handler
/// may have ended the claim's transaction itself (its own `COMMIT` on `tx.conn()`), which only
/// the lost answer would have shown: so a lost answer is `CommitUnknown` (the next claim finds
/// such a claim committed and parks the key), not "nothing kept".
pub(crate) fn after_handler(e: &sqlx::Error) -> Unavailable {
    if answer_lost(e) {
        Unavailable::CommitUnknown(e.to_string())
    } else {
        storage(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only the queue's own `54000` is the server's trouble; the same code from anywhere else
    /// (a deferred trigger of the handler's, `pl_exec.c`) is not.
    /// The source file reaches the check from a real server's error: were it lost (the
    /// downcast not matching, a field not read), a full queue would be the handler's again.
    #[test]
    fn a_real_errors_source_file_is_read() {
        let Some(url) = oncebox_testkit::service_url("ONCEBOX_POSTGRES_URL") else {
            return;
        };
        oncebox_testkit::run(async move {
            use sqlx::Connection as _;
            let mut conn = sqlx::PgConnection::connect(&url).await.expect("connect");
            let raised = sqlx::Executor::execute(
                &mut conn,
                "DO $$ BEGIN RAISE EXCEPTION 'limit' USING ERRCODE = '54000'; END $$",
            )
            .await
            .expect_err("raised");
            let sqlx::Error::Database(db) = &raised else {
                panic!("{raised:?}");
            };
            assert_eq!(db.code().as_deref(), Some("54000"));
            assert_eq!(source_file(&**db), Some("pl_exec.c"));
        });
    }

    #[test]
    fn only_the_notification_queue_is_a_full_queue() {
        assert!(notify_queue_full(Some("54000"), Some("async.c")));
        assert!(!notify_queue_full(Some("54000"), Some("pl_exec.c")));
        assert!(!notify_queue_full(Some("54000"), None));
        assert!(!notify_queue_full(Some("53100"), Some("async.c")));
    }

    /// A wait for a pooled connection that ended names the causes an operator can check, not
    /// only that it ended.
    #[test]
    fn a_pool_that_timed_out_says_what_to_look_at() {
        let said = storage(&sqlx::Error::PoolTimedOut).to_string();
        assert!(said.contains("max_connections"), "{said}");
        assert!(said.contains("busy"), "{said}");
    }
}
