//! The handler's view of the open transaction: the user's own SQL, action keys, entity versions,
//! offset watermarks and the outbox all commit or roll back with the inbox record.

pub use oncebox_core::{Enqueued, OffsetMove, Once};
use std::sync::Arc;

use oncebox_core::{Key, OutboxMessage, Timestamp};
use sqlx::{PgConnection, Postgres, Transaction};

use crate::qualified::InTx;

/// How a handler fails. `Stale` and `Failed` decide what is kept of the event.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandlerError {
    /// From [`Tx::advance`]: the event is older than what was applied. Its effects are undone and
    /// the key is recorded as `stale`, so a duplicate replays `Stale` too.
    #[error("event is older than the applied entity version")]
    Stale,
    /// A SQL error in the handler. A lost connection, deadlock, serialization failure or
    /// failing storage answers `Unavailable`; anything else fails only this event.
    #[error("postgres: {0}")]
    Sql(#[from] sqlx::Error),
    /// Everything of this event is rolled back and the key stays free: a retry applies it.
    #[error("{0}")]
    Failed(Box<dyn std::error::Error + Send + Sync>),
}

impl HandlerError {
    /// The handler's own failure: everything of the event is rolled back and the key stays
    /// free, and the caller gets `ProcessError::Handler` with `e`.
    pub fn failed(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> HandlerError {
        HandlerError::Failed(e.into())
    }
}

/// The open transaction (READ COMMITTED), handed to a handler for one event.
#[derive(Debug)]
pub struct Tx {
    pub(crate) tx: Transaction<'static, Postgres>,
    key: Key,
    now: Timestamp,
    /// An outbox row was queued: relays are woken when this commits.
    pub(crate) queued: bool,
    /// oncebox's own statements, naming their schema whatever `search_path` the handler set.
    pub(crate) sql: Arc<InTx>,
    /// What the messages it queues carry in `oncebox-hops`: one more than the event arrived
    /// with (`oncebox_core::hops`).
    hops: u32,
}

impl Tx {
    pub(crate) fn new(
        tx: Transaction<'static, Postgres>,
        key: Key,
        now: Timestamp,
        sql: Arc<InTx>,
        arrived: u32,
    ) -> Tx {
        Tx {
            tx,
            key,
            now,
            queued: false,
            sql,
            hops: oncebox_core::hops::sent(arrived),
        }
    }

    /// The connection, inside the event's transaction: the user's own SQL goes here. Do not
    /// issue `COMMIT` or `ROLLBACK` on it: `process` owns the transaction. PostgreSQL cannot
    /// stop either; after one, what the handler did may have committed without the key's
    /// record, so `process` answers `Uncertain` and parks the key for an operator to resolve.
    pub fn conn(&mut self) -> &mut PgConnection {
        &mut self.tx
    }

    /// The event being processed.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The event's key and the connection at once, for a statement that binds the key:
    /// `tx.key()` borrows the whole `Tx`, which `tx.conn()` then cannot.
    pub fn parts(&mut self) -> (&Key, &mut PgConnection) {
        (&self.key, &mut self.tx)
    }

    /// The clock reading taken when the event's transaction began.
    pub fn now(&self) -> Timestamp {
        self.now
    }

    /// Takes the action key `(scope, key)`: the business operation it names happens once
    /// whichever event asks. A concurrent transaction holding the same action key makes this
    /// wait for its outcome: if it commits this one answers `Already`, if it rolls back `First`.
    pub async fn once(&mut self, scope: &str, key: &str) -> Result<Once, HandlerError> {
        oncebox_core::check_names(&[("action scope", scope), ("action key", key)])
            .map_err(HandlerError::failed)?;
        let taken = sqlx::query(&self.sql.once)
            .bind(scope)
            .bind(key)
            .bind(self.key.source.as_str())
            .bind(self.key.event_id.as_str())
            .bind(self.now.millis())
            .execute(&mut *self.tx)
            .await?
            .rows_affected();
        Ok(if taken == 1 {
            Once::First
        } else {
            Once::Already
        })
    }

    /// Records that `(entity, id)` is now at `version`. An older version returns
    /// `Err(HandlerError::Stale)`: propagate it with `?` and nothing of the event changes. An
    /// equal version is not stale and leaves it unchanged. One guarded upsert decides, and the
    /// row it conflicts on stays locked until commit, so two concurrent events for one entity
    /// cannot both win.
    pub async fn advance(
        &mut self,
        entity: &str,
        id: &str,
        version: i64,
    ) -> Result<(), HandlerError> {
        oncebox_core::check_names(&[("entity", entity), ("entity id", id)])
            .map_err(HandlerError::failed)?;
        let moved = sqlx::query(&self.sql.advance)
            .bind(entity)
            .bind(id)
            .bind(version)
            .bind(self.key.source.as_str())
            .bind(self.key.event_id.as_str())
            .execute(&mut *self.tx)
            .await?
            .rows_affected();
        if moved == 1 {
            return Ok(());
        }
        let current: i64 = sqlx::query_scalar(&self.sql.version)
            .bind(entity)
            .bind(id)
            .fetch_one(&mut *self.tx)
            .await?;
        if version < current {
            Err(HandlerError::Stale)
        } else {
            Ok(())
        }
    }

    /// Moves the watermark of `(stream, partition)` to `offset`, or reports a replay when the
    /// offset is at or below it.
    pub async fn commit_offset(
        &mut self,
        stream: &str,
        partition: i64,
        offset: i64,
    ) -> Result<OffsetMove, HandlerError> {
        oncebox_core::check_names(&[("stream", stream)]).map_err(HandlerError::failed)?;
        Ok(
            if move_watermark(&mut self.tx, &self.sql, stream, partition, offset).await? {
                OffsetMove::Advanced
            } else {
                OffsetMove::Replay
            },
        )
    }

    /// Queues a message for delivery after commit. The same idempotency key for the same
    /// destination is queued once: a second says whether it was the same message
    /// ([`Enqueued`]). A message no target could send (see [`OutboxMessage::check`]) fails the
    /// event: nothing of it is kept and the caller hears why.
    pub async fn enqueue(&mut self, msg: &OutboxMessage) -> Result<Enqueued, HandlerError> {
        msg.check().map_err(HandlerError::failed)?;
        let queued = sqlx::query(&self.sql.enqueue)
            .bind(&msg.destination)
            .bind(&msg.idempotency_key)
            .bind(&msg.payload)
            .bind(&msg.content_type)
            .bind(self.key.source.as_str())
            .bind(self.key.event_id.as_str())
            .bind(self.now.millis())
            .bind(i32::try_from(self.hops).unwrap_or(i32::MAX))
            .execute(&mut *self.tx)
            .await?;
        if queued.rows_affected() == 1 {
            self.queued = true;
            return Ok(Enqueued::Queued);
        }
        let first: Option<(Vec<u8>, String)> = sqlx::query_as(&self.sql.enqueued)
            .bind(&msg.destination)
            .bind(&msg.idempotency_key)
            .fetch_optional(&mut *self.tx)
            .await?;
        Ok(msg.beside(first))
    }

    /// [`Tx::enqueue`] for a delivery of a key accepted anew: a finished delivery under the
    /// same route and key, which only a purge by an earlier build can have left behind, is
    /// replaced rather than let take this one's place (`batch/deliveries.rs` says more).
    pub(crate) async fn enqueue_anew(
        &mut self,
        msg: &OutboxMessage,
    ) -> Result<Enqueued, HandlerError> {
        let first = self.enqueue(msg).await?;
        if first == Enqueued::Queued {
            return Ok(first);
        }
        let cleared = sqlx::query(&self.sql.clear_left_behind)
            .bind(&msg.destination)
            .bind(&msg.idempotency_key)
            .bind(self.key.source.as_str())
            .bind(self.key.event_id.as_str())
            .execute(&mut *self.tx)
            .await?
            .rows_affected();
        if cleared == 0 {
            return Ok(first);
        }
        tracing::warn!(key = %self.key, route = %msg.destination, "a finished delivery an earlier build's purge left behind was replaced by the key's new one");
        self.enqueue(msg).await
    }
}

/// Moves the watermark of `(stream, partition)` up to `offset`; false when it stood at or
/// above it already.
pub(crate) async fn move_watermark(
    conn: &mut PgConnection,
    sql: &InTx,
    stream: &str,
    partition: i64,
    offset: i64,
) -> Result<bool, sqlx::Error> {
    let moved = sqlx::query(&sql.watermark)
        .bind(stream)
        .bind(partition)
        .bind(offset)
        .execute(conn)
        .await?
        .rows_affected();
    Ok(moved == 1)
}
