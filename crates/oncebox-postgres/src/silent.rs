//! Answers that never come: a bound on how long oncebox waits for PostgreSQL to answer its own
//! statements, for connections whose path went silent (a failover that moved the server's
//! address, a firewall or NAT that forgot the connection) with neither a reset nor a FIN.
//!
//! Nothing else ends such a wait: sqlx sets no TCP keepalive and exposes no socket to set one
//! on, and a client waiting to read, with nothing unacknowledged, waits for ever. A batch
//! worker, a relay's claim, a lease's write or `/readyz` stopped there for good, and the
//! pooled connection with it. So each of those waits is bounded here. A connection given up on
//! is dropped with the work on it, and the pool's release check is bounded too (sqlx's own,
//! after it, would wait as long), so it is closed rather than taken back into the pool.
//! Handlers' statements are not bounded: a handler may rightly run long. oncebox's own around
//! a handler (its savepoint, the record's finish, the notify, the commit) are.

use std::future::Future;
use std::time::Duration;

use oncebox_core::Unavailable;
use sqlx::postgres::PgPoolOptions;

/// How long oncebox waits for an answer by default ([`crate::Options::lost_after`]).
pub(crate) const LOST_AFTER: Duration = Duration::from_secs(30);

/// The wait that ran out: the statement may have reached the server and committed.
pub(crate) fn lost(limit: Duration) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!(
            "PostgreSQL did not answer within {limit:?}; the connection is taken for lost and \
             closed"
        ),
    ))
}

/// `work`'s result, or `None` once `limit` has passed without one (`work` is then dropped,
/// and the connection it held with it).
pub(crate) async fn within<T>(limit: Duration, work: impl Future<Output = T>) -> Option<T> {
    tokio::time::timeout(limit, work).await.ok()
}

/// As [`within`], for a statement: past `limit` it fails as a connection lost while waiting
/// for the answer ([`lost`]), which every caller already tells from "nothing sent".
pub(crate) async fn answered<T>(
    limit: Duration,
    statement: impl Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, sqlx::Error> {
    within(limit, statement)
        .await
        .unwrap_or_else(|| Err(lost(limit)))
}

/// As [`within`], for work that writes: past `limit` its outcome is unknown (it may have
/// committed), which its caller's retry reads.
pub(crate) async fn or_unknown<T, E: From<Unavailable>>(
    limit: Duration,
    work: impl Future<Output = Result<T, E>>,
) -> Result<T, E> {
    within(limit, work)
        .await
        .unwrap_or_else(|| Err(Unavailable::CommitUnknown(lost(limit).to_string()).into()))
}

/// `options` with a release check bounded by `limit`: a connection whose work was dropped
/// while it waited (above) is pinged on release, and one that does not answer is closed.
/// A live connection answers at once; the round trip this adds is off the caller's path (sqlx
/// releases a connection in a task of its own).
pub(crate) fn bounded_release(options: PgPoolOptions, limit: Duration) -> PgPoolOptions {
    options.after_release(move |conn, _| {
        Box::pin(async move {
            use sqlx::Connection;
            answered(limit, conn.ping()).await?;
            Ok(true)
        })
    })
}
