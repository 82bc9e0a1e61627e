//! Errors of the Redis tier and the one place that turns a Redis failure into `Unavailable`:
//! an error, a timeout or an odd reply never says anything about whether a key was processed.

use oncebox_core::Unavailable;

/// Why [`crate::Leases::connect`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The URL is not a Redis URL (`redis://host:port/db`, `rediss://…`, `unix://…`).
    #[error("invalid Redis URL: {0}")]
    Url(redis::RedisError),
    /// Redis did not answer within the deadline or refused the connection.
    #[error("cannot reach Redis: {0}")]
    Unavailable(#[from] Unavailable),
    /// The namespace is empty or holds a `:`, which separates the parts of every key: one
    /// namespace's keys could be another's (`a:k:b` + `c:d` is `a` + source `b`, id `k:c:d`).
    #[error("invalid namespace {0:?}: it must be non-empty and hold no ':'")]
    Namespace(String),
    /// The server cannot run the lease scripts: a Redis Cluster, or Redis before 5.
    #[error("unsupported Redis server: {0}")]
    Unsupported(String),
}

/// Refuses a namespace whose keys could be another namespace's.
pub(crate) fn check_namespace(namespace: &str) -> Result<(), ConnectError> {
    if namespace.is_empty() || namespace.contains(':') {
        return Err(ConnectError::Namespace(namespace.to_owned()));
    }
    Ok(())
}

/// Every Redis error is `Unavailable` (G3): a timeout or a dropped connection leaves the
/// request's fate unknown, and a server error (OOM, READONLY replica, WRONGTYPE on a foreign
/// key) means this tier cannot answer. A connection that dropped (not one refused: nothing was
/// sent then) may have carried the call to Redis, whose script then ran with its answer lost:
/// `CommitUnknown`, not `Storage` ("nothing was kept"); a holder's `release` repeated after it
/// reads `Fenced`, its key already free.
pub(crate) fn unavailable(e: &redis::RedisError) -> Unavailable {
    if e.is_timeout() {
        Unavailable::Deadline
    } else if e.is_connection_dropped() && !e.is_connection_refusal() {
        Unavailable::CommitUnknown(format!("redis: {e}"))
    } else {
        Unavailable::Storage(format!("redis: {e}"))
    }
}

/// A reply of a shape our own scripts never send: someone else's data under our key, or a
/// server we do not understand. Still only "unavailable", never a guess.
pub(crate) fn odd_reply(what: &str, reply: &redis::Value) -> Unavailable {
    Unavailable::Storage(format!("redis: unexpected reply to {what}: {reply:?}"))
}
