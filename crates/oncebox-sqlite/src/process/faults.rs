//! Faults of a handler that SQLite answers by itself, made the event's own error: a response
//! too long to store, a statement that made SQLite end the whole transaction. Either would
//! repeat on every retry, so neither may fail the batch as `Unavailable`.

use oncebox_core::{ProcessError, Processed, Response};

use crate::error::unavailable;
use crate::tx::HandlerError;
use crate::writer::{Cx, Fatal};

/// What storing the handler's response came to: applied, or — when the record with it is
/// longer than the writer stores a value or row (`SQLITE_LIMIT_LENGTH`) — the handler's error,
/// with nothing of the event kept: every retry would return the same response, and as the
/// batch's error it failed every event beside it.
pub(super) fn kept_with(
    cx: &Cx<'_, '_>,
    kept: rusqlite::Result<()>,
    response: Response,
) -> Result<Result<Processed, ProcessError>, Fatal> {
    match kept {
        Ok(()) => Ok(Ok(Processed::Applied(response))),
        Err(e) if crate::lease::too_big(&e) => {
            cx.rollback_to()?;
            let why = format!(
                "the event's record with the handler's response of {} bytes is longer than the \
                 store keeps: {e}",
                response.body.len()
            );
            Ok(Err(ProcessError::Handler(why.into())))
        }
        Err(e) => Err(e.into()),
    }
}

/// The handler's statement made SQLite roll the whole transaction back (a constraint declared
/// `ON CONFLICT ROLLBACK`, `RAISE(ROLLBACK)`, a `ROLLBACK` or `COMMIT` it ran). Nothing of the
/// event is kept and its key is free again; the fault is the event's, which every retry would
/// repeat, so it is its `Handler` error — not `Unavailable`, which had consumers requeue it
/// forever — unless the error is the storage's (a full disk, IO), which fails the batch.
/// PostgreSQL answers its equivalent (25P02) the same way.
pub(super) fn ended_by_handler(
    cx: &mut Cx<'_, '_>,
    outcome: Result<Response, HandlerError>,
) -> Result<Result<Processed, ProcessError>, Fatal> {
    let why: Box<dyn std::error::Error + Send + Sync> = if cx.stray_commit() {
        RAN_COMMIT.into()
    } else {
        match outcome {
            Err(HandlerError::Sql(e)) => match unavailable(&e) {
                Some(why) => return Err(Fatal(why)),
                None => Box::new(e),
            },
            Err(HandlerError::Failed(e)) => match crate::error::storage_underneath(&*e) {
                Some(why) => return Err(Fatal(why)),
                None => e,
            },
            Ok(_) | Err(HandlerError::Stale) => ROLLED_BACK.into(),
        }
    };
    cx.own_rollback();
    Ok(Err(ProcessError::Handler(why)))
}

/// Why code that ran `COMMIT` on the writer's transaction fails (the commit hook turned it
/// into a rollback: `writer/commits.rs`).
pub(crate) const RAN_COMMIT: &str = "the code ran COMMIT on the writer's transaction, which \
    only the writer ends: it was rolled back, and nothing of this request was kept";

/// Why code that went on after its transaction ended, without an error to show for it, fails.
pub(crate) const ROLLED_BACK: &str = "SQLite rolled back the writer's transaction under this \
    request's code (a constraint declared ON CONFLICT ROLLBACK, RAISE(ROLLBACK), or a ROLLBACK \
    it ran); nothing of the request was kept";
