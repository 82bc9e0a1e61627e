//! Running a handler on a fresh claim: the savepoint, the handler, the terminal record and the
//! commit, all in the claim's transaction; and the honest answer when the handler ended that
//! transaction itself (`COMMIT` or `ROLLBACK` on `tx.conn()`), which PostgreSQL cannot forbid.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use futures::FutureExt;
use oncebox_core::{Event, ProcessError, Processed, Response, ResponseKind};
use sqlx::PgPool;

use super::{Handler, Inbox, begin, notify};
use crate::claim::{Claimed, RESET_SESSION, finish};
use crate::error::{after_handler, handler_commit_failed, record_failed, storage, unavailable};
use crate::silent::answered;
use crate::tx::{HandlerError, Tx};

/// `SAVEPOINT` and `ROLLBACK TO SAVEPOINT` around the handler. The name is drawn per process:
/// a handler's own savepoint of the same name would stop the `ROLLBACK TO` at the handler's,
/// keeping what the handler wrote before it although it failed or refused.
static SAVEPOINT: LazyLock<[String; 2]> = LazyLock::new(|| {
    let name = format!("oncebox_effect_{:016x}", rand::random::<u64>());
    [
        format!("SAVEPOINT {name}"),
        format!("ROLLBACK TO SAVEPOINT {name}"),
    ]
});

tokio::task_local! {
    /// The inbox (by its statements' address, shared by its clones) and the key whose handler
    /// the task is running: a call for that key from inside would wait for itself.
    pub(super) static HANDLING: (usize, oncebox_core::Key);
}

impl Inbox {
    /// Runs the handler after a fresh claim. A savepoint after the claim lets a refusal or a
    /// stale verdict undo the handler's work and keep the (now terminal) record.
    ///
    /// Each of oncebox's own statements here waits at most `lost_after` for its answer
    /// (`silent.rs`), as the claim and the commit do: on a path gone silent the message in hand
    /// was held for good, and a NATS stream read in order with it. The handler's are not.
    pub(super) async fn run(
        &self,
        event: &Event,
        mut tx: Tx,
        claimed: Claimed,
        handler: Handler,
    ) -> Result<Processed, ProcessError> {
        // What the record is dated, should it finish (`oncebox_core::Stamps`).
        let now = self
            .stamps
            .completed(self.clock.as_ref(), tx.now())
            .millis();
        let limit = self.lost_after;
        answered(limit, sqlx::query(&SAVEPOINT[0]).execute(&mut *tx.tx))
            .await
            .map_err(|e| storage(&e))?;
        let within = (Arc::as_ptr(&self.in_tx) as usize, event.key.clone());
        let outcome = HANDLING
            .scope(within, AssertUnwindSafe(handler(&mut tx)).catch_unwind())
            .await
            .unwrap_or_else(|panic| {
                Err(HandlerError::failed(format!(
                    "the handler panicked: {}",
                    oncebox_core::consume::panic_message(&*panic)
                )))
            });
        crate::crash::point!("after-effect");
        let (ours, answer) = match outcome {
            Ok(response) if response.kind == ResponseKind::Completed => {
                let ours = answered(limit, finish(&mut tx.tx, &tx.sql, claimed, &response, now))
                    .await
                    .map_err(|e| record_failed(&e))?;
                (ours, Processed::Applied(response))
            }
            Ok(response) => {
                let ours = terminal(&mut tx, limit, claimed, &response, now).await?;
                (ours, Processed::Applied(response))
            }
            Err(HandlerError::Stale) => {
                let ours = terminal(&mut tx, limit, claimed, &Response::stale(), now).await?;
                (ours, Processed::Stale)
            }
            Err(HandlerError::Sql(e)) => {
                let why = match unavailable(&e) {
                    Some(why) => ProcessError::Unavailable(why),
                    None => ProcessError::Handler(Box::new(e)),
                };
                return self.failed(event, tx, claimed, why).await;
            }
            // A storage failure the handler wrapped in its own error (context around a lock
            // timeout, a deadlock, a full disk) is the outage its bare `Sql` error is: answered
            // as the event's own failure, a broker consumer counted it toward quarantining a
            // valid message (as the SQLite store answers it).
            Err(HandlerError::Failed(e)) => {
                let why = match oncebox_core::chain::cause::<sqlx::Error>(&*e).and_then(unavailable)
                {
                    Some(why) => ProcessError::Unavailable(why),
                    None => ProcessError::Handler(e),
                };
                return self.failed(event, tx, claimed, why).await;
            }
        };
        if !ours {
            return self.ended_by_handler(event, tx, claimed).await;
        }
        if tx.queued {
            answered(limit, notify(&mut tx.tx, &tx.sql.channel))
                .await
                .map_err(|e| after_handler(&e))?;
        }
        crate::crash::point!("before-commit");
        answered(limit, tx.tx.commit())
            .await
            .map_err(handler_commit_failed)?;
        crate::crash::point!("after-commit");
        Ok(answer)
    }

    /// The handler failed: `error`, with its work undone and the key left free, unless the
    /// handler had ended the claim's transaction before it failed, leaving its claim, and maybe
    /// its effect, committed.
    async fn failed(
        &self,
        event: &Event,
        mut tx: Tx,
        claimed: Claimed,
        error: ProcessError,
    ) -> Result<Processed, ProcessError> {
        // One round trip, on the failure path only. The savepoint exists in the claim's
        // transaction and in no other: its name is drawn per process, so no handler's savepoint
        // shares it.
        match rollback_to_savepoint(&mut tx, self.lost_after).await {
            // Dropping the transaction rolls it back.
            Ok(true) => Err(error),
            Ok(false) => self.ended_by_handler(event, tx, claimed).await,
            Err(e) => Err(ProcessError::Unavailable(after_handler(&e))),
        }
    }

    /// The handler ended the claim's transaction itself. After a `ROLLBACK` its later
    /// statements committed one by one in autocommit, and the claim is gone; after a `COMMIT`
    /// the claim committed as `processing`, with whatever the handler did before it. Either
    /// way its effect may have committed outside the inbox, so neither `Applied` (no record
    /// would stop the next delivery) nor a retry is honest: the key is parked `uncertain`,
    /// answered `Uncertain` until an operator resolves it. (SQLite's commit hook lets nothing
    /// of such a handler commit, so there the key can stay free; PostgreSQL has no such hook.)
    /// A key left unparked (the park failed) whose claim committed is still not run again: the
    /// next claim finds it `processing` without a lease and parks it.
    async fn ended_by_handler(
        &self,
        event: &Event,
        mut tx: Tx,
        claimed: Claimed,
    ) -> Result<Processed, ProcessError> {
        tracing::error!(
            key = %event.key,
            "the handler ended the inbox's transaction itself (COMMIT or ROLLBACK on \
             tx.conn()): its effect may have committed without its record; parking the key \
             as uncertain"
        );
        // Ends whatever the connection is in now (a transaction the handler began after its
        // own); outside one, PostgreSQL only warns. Then, outside any transaction, what the
        // handler set for its session after its own `COMMIT` is set back, as `finish` does.
        // Each waits at most `lost_after`, and none after one that failed: on a connection
        // gone silent each would wait out its own limit behind the lost answer (that
        // connection is closed when the transaction is dropped; one that refused a statement
        // goes back to the pool after the drop's own rollback).
        let limit = self.lost_after;
        let ended = answered(limit, sqlx::query("ROLLBACK").execute(&mut *tx.tx)).await;
        if ended.is_ok()
            && answered(limit, sqlx::Executor::execute(&mut *tx.tx, RESET_SESSION))
                .await
                .is_ok()
        {
            let _ = answered(limit, tx.tx.rollback()).await;
        }
        let now = self.clock.now().millis();
        let parked = park(&self.pool, self.deadline, event, claimed.row, now);
        if let Err(e) = answered(limit, parked).await {
            tracing::error!(key = %event.key, error = %e, "parking the key failed");
        }
        Err(ProcessError::Uncertain)
    }
}

/// Undoes the handler's work (back to the savepoint after the claim) and makes the record
/// terminal with `response`. False when the claim's transaction is no longer the connection's.
async fn terminal(
    tx: &mut Tx,
    limit: Duration,
    claimed: Claimed,
    response: &Response,
    now: i64,
) -> Result<bool, ProcessError> {
    if !rollback_to_savepoint(tx, limit)
        .await
        .map_err(|e| ProcessError::Unavailable(after_handler(&e)))?
    {
        return Ok(false);
    }
    // What the handler queued went with the savepoint.
    tx.queued = false;
    answered(limit, finish(&mut tx.tx, &tx.sql, claimed, response, now))
        .await
        .map_err(|e| ProcessError::Unavailable(after_handler(&e)))
}

/// `ROLLBACK TO SAVEPOINT` the handler's, undoing its work; false when there is no
/// such savepoint, so the claim's transaction is gone: 25P01, no transaction at all (the
/// handler's `COMMIT` or `ROLLBACK` ended ours), or 3B001, a transaction without the savepoint
/// (the handler began another one).
async fn rollback_to_savepoint(tx: &mut Tx, limit: Duration) -> Result<bool, sqlx::Error> {
    match answered(limit, sqlx::query(&SAVEPOINT[1]).execute(&mut *tx.tx)).await {
        Ok(_) => Ok(true),
        Err(sqlx::Error::Database(db))
            if matches!(db.code().as_deref(), Some("25P01" | "3B001")) =>
        {
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// Records `event`'s key as `uncertain`, in a transaction of its own: the claim `row` if it
/// committed and is still `processing`, else a new record if the key is free (the claim was
/// rolled back). A record another delivery wrote meanwhile is left as it is.
async fn park(
    pool: &PgPool,
    deadline: Duration,
    event: &Event,
    row: i64,
    now: i64,
) -> Result<(), sqlx::Error> {
    let mut tx = begin(pool, deadline).await?;
    sqlx::query(
        "INSERT INTO oncebox_inbox (source, event_id, fingerprint, state, payload, received_at,
           content_type, headers)
         VALUES ($1, $2, $3, 'uncertain', $4, $5, $6, $7)
         ON CONFLICT (source, event_id) DO UPDATE SET state = 'uncertain', lease_token = NULL,
           lease_expires_at = NULL
         WHERE oncebox_inbox.id = $8 AND oncebox_inbox.state = 'processing'",
    )
    .bind(event.key.source.as_str())
    .bind(event.key.event_id.as_str())
    .bind(&event.fingerprint.as_bytes()[..])
    .bind(&event.payload)
    .bind(now)
    .bind(event.meta.content_type.as_deref())
    .bind(event.meta.header_lines())
    .bind(row)
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}
