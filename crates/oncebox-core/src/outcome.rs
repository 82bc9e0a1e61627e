//! What processing an event can end in: `Processed` on success, `ProcessError` for the decisions a
//! caller must branch on. Library, gateway and brokers share this vocabulary.

use std::time::Duration;

use crate::fingerprint::{Fingerprint, PayloadError};
use crate::key::InvalidKey;
use crate::store::OrderFieldInvalid;

/// The kind of answer stored with a terminal inbox record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ResponseKind {
    /// The effect committed.
    Completed,
    /// A terminal business refusal: nothing but the refusal committed; replayed like a response.
    Rejected,
    /// Older than the applied entity version: recorded, nothing changed.
    Stale,
}

impl ResponseKind {
    /// The name stored in the `state` column. Do not change: it is persisted.
    pub fn as_str(self) -> &'static str {
        match self {
            ResponseKind::Completed => "completed",
            ResponseKind::Rejected => "rejected",
            ResponseKind::Stale => "stale",
        }
    }

    pub fn parse(s: &str) -> Option<ResponseKind> {
        match s {
            "completed" => Some(ResponseKind::Completed),
            "rejected" => Some(ResponseKind::Rejected),
            "stale" => Some(ResponseKind::Stale),
            _ => None,
        }
    }
}

/// The first answer for a key, stored in the same transaction as the effect and replayed for
/// every duplicate (it cannot be recomputed later: other events have changed the state since).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Response {
    pub kind: ResponseKind,
    pub body: Vec<u8>,
}

impl Response {
    pub fn completed(body: impl Into<Vec<u8>>) -> Response {
        Response {
            kind: ResponseKind::Completed,
            body: body.into(),
        }
    }

    pub fn rejected(body: impl Into<Vec<u8>>) -> Response {
        Response {
            kind: ResponseKind::Rejected,
            body: body.into(),
        }
    }

    pub fn stale() -> Response {
        Response {
            kind: ResponseKind::Stale,
            body: Vec::new(),
        }
    }
}

/// A committed outcome. `Duplicate` is only ever produced from an inbox record read back from the
/// database inside a transaction that then committed (G3).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Processed {
    /// New key: the handler ran and its effect (or refusal) committed with this response.
    Applied(Response),
    /// Key already committed with the same fingerprint: the first response, handler not run.
    Duplicate(Response),
    /// New key, older than the entity version already applied: recorded, nothing changed.
    Stale,
}

impl Processed {
    /// True for a replay of a committed key.
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Processed::Duplicate(_))
    }

    /// True when the handler ran now and its effect committed (not a refusal).
    pub fn is_applied(&self) -> bool {
        matches!(self, Processed::Applied(r) if r.kind == ResponseKind::Completed)
    }

    /// True for a stale event, first delivery or replay alike.
    pub fn is_stale(&self) -> bool {
        match self {
            Processed::Stale => true,
            Processed::Applied(r) | Processed::Duplicate(r) => r.kind == ResponseKind::Stale,
        }
    }

    /// The response to give the sender: the one stored with the key (for `Stale`, an empty
    /// stale response).
    pub fn response(&self) -> Response {
        match self {
            Processed::Applied(r) | Processed::Duplicate(r) => r.clone(),
            Processed::Stale => Response::stale(),
        }
    }
}

/// Bad input detected before or while processing; nothing was written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Invalid {
    #[error(transparent)]
    Key(#[from] InvalidKey),
    #[error(transparent)]
    Payload(#[from] PayloadError),
    /// A field the source's ordering guard reads has the wrong type.
    #[error("ordering guard: {0}")]
    Order(#[from] OrderFieldInvalid),
    /// The event (its payload and headers) is larger than the store can keep in one row: it
    /// would fail the same way on every try.
    #[error("the event is {size} bytes; the store keeps at most {limit}")]
    TooLarge { size: usize, limit: usize },
    /// A two-phase lease shorter than [`MIN_LEASE_TTL`](crate::MIN_LEASE_TTL): it would expire
    /// as it is taken, so its holder would run the effect and then be fenced from recording it,
    /// and the next delivery would take over and run it again.
    #[error("a lease of {0:?} expires as it is taken; begin needs at least 1 ms")]
    LeaseTtl(std::time::Duration),
    /// A delivery the event would queue could never be sent (an [`Ingest`](crate::store::Ingest)'s
    /// route name with a space, a key that ends with one).
    #[error("its delivery: {0}")]
    Delivery(#[from] crate::event::InvalidMessage),
}

/// Why an answer cannot be given now. Never a statement about whether the key was processed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Unavailable {
    /// The database is locked or contended (SQLite's write lock held by another process, a
    /// PostgreSQL lock wait past the deadline, a serialization failure or deadlock): nothing
    /// of the request was kept; try again.
    #[error("database busy or locked")]
    Busy,
    /// The call's deadline passed before its answer: the request may not have been served, or
    /// may still commit (ask again: the key's record tells). The SQLite inbox's `process` says
    /// which: `Deadline` only when its handler never ran, `CommitUnknown` when it was running.
    #[error("deadline passed before the request's answer")]
    Deadline,
    /// The store is closing (its last handle dropped, or the process stopping): nothing more
    /// is taken.
    #[error("the writer is shutting down")]
    Closed,
    /// The request's own commit may or may not have happened (a failed `COMMIT`, a connection
    /// lost while its answer was on the way, a deadline passed while it ran): a retry with the
    /// same key reads what did.
    #[error("commit outcome unknown: {0}")]
    CommitUnknown(String),
    /// The storage failed (an I/O error, a full disk, a lost connection before the commit, the
    /// server out of resources): nothing of the request was kept; try again later.
    #[error("storage error: {0}")]
    Storage(String),
}

/// The decisions a caller makes after a failed `process`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProcessError {
    /// Same key, different payload: a contract error, never a silent success. The first payload
    /// wins; the attempt was recorded for audit.
    #[error("key reused with a different payload (stored {stored}, offered {offered})")]
    Conflict {
        stored: Fingerprint,
        offered: Fingerprint,
    },
    /// Another worker holds the key's lease; try again after `retry_after`.
    #[error("key is being processed by another worker")]
    InProgress { retry_after: Duration },
    /// The key's effect has an unknown outcome (a two-phase holder parked it, or a PostgreSQL
    /// handler ended the inbox's transaction itself); it waits for reconciliation (`resolve`)
    /// and is neither retried nor reported as done.
    #[error("key's outcome is uncertain and awaits reconciliation")]
    Uncertain,
    #[error("invalid event: {0}")]
    Invalid(#[from] Invalid),
    /// Nothing is known about the key's fate from this call: retry later.
    #[error("unavailable: {0}")]
    Unavailable(#[from] Unavailable),
    /// The handler failed; everything of this event rolled back and the key is free again.
    #[error("handler failed: {0}")]
    Handler(Box<dyn std::error::Error + Send + Sync>),
}
