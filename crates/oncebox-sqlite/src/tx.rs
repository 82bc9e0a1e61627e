//! The handler's view of the open transaction: the user's own SQL, action keys, entity versions,
//! offset watermarks and the outbox all commit or roll back with the inbox record.

pub use oncebox_core::{Enqueued, OffsetMove, Once};
use oncebox_core::{Key, OutboxMessage, Timestamp};
use rusqlite::{Connection, OptionalExtension, params};

/// How a handler fails. `Stale` and `Failed` decide what is kept of the event.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandlerError {
    /// From [`Tx::advance`]: the event is older than what was applied. Its effects are undone and
    /// the key is recorded as `stale`, so a duplicate replays `Stale` too.
    #[error("event is older than the applied entity version")]
    Stale,
    /// A SQL error in the handler. Busy, full or failing storage aborts the whole batch as
    /// `Unavailable`; anything else fails only this event, as `Failed` does.
    #[error("sqlite: {0}")]
    Sql(#[from] rusqlite::Error),
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

/// The open transaction, handed to a handler for one event.
#[derive(Debug)]
pub struct Tx<'a> {
    conn: &'a Connection,
    key: &'a Key,
    now: Timestamp,
    /// What the messages it queues carry in `oncebox-hops`: one more than the event arrived
    /// with (`oncebox_core::hops`).
    hops: u32,
}

impl<'a> Tx<'a> {
    /// `arrived`: the hops the event arrived with.
    pub(crate) fn new(conn: &'a Connection, key: &'a Key, now: Timestamp, arrived: u32) -> Tx<'a> {
        Tx {
            conn,
            key,
            now,
            hops: oncebox_core::hops::sent(arrived),
        }
    }

    /// The connection, inside the event's savepoint: the user's own SQL goes here. Do not issue
    /// `COMMIT`, `ROLLBACK` or `RELEASE` on it — the writer owns the transaction.
    pub fn conn(&self) -> &'a Connection {
        self.conn
    }

    /// The event being processed.
    pub fn key(&self) -> &'a Key {
        self.key
    }

    /// The batch's clock reading.
    pub fn now(&self) -> Timestamp {
        self.now
    }

    /// Takes the action key `(scope, key)`: the business operation it names happens once
    /// whichever event asks, e.g. `("thank-you-email", order_id)`.
    pub fn once(&mut self, scope: &str, key: &str) -> Result<Once, HandlerError> {
        oncebox_core::check_names(&[("action scope", scope), ("action key", key)])
            .map_err(HandlerError::failed)?;
        let inserted = self
            .conn
            .prepare_cached(
                "INSERT INTO oncebox_actions (scope, key, source, event_id, at)
                 VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (scope, key) DO NOTHING",
            )?
            .execute(params![
                scope,
                key,
                self.key.source.as_str(),
                self.key.event_id.as_str(),
                self.now.millis()
            ])?;
        Ok(if inserted == 1 {
            Once::First
        } else {
            Once::Already
        })
    }

    /// Records that `(entity, id)` is now at `version`. An older version returns
    /// `Err(HandlerError::Stale)`: propagate it with `?` and nothing of the event changes. An
    /// equal version is not stale — two events may share a timestamp — and leaves it unchanged.
    pub fn advance(&mut self, entity: &str, id: &str, version: i64) -> Result<(), HandlerError> {
        oncebox_core::check_names(&[("entity", entity), ("entity id", id)])
            .map_err(HandlerError::failed)?;
        let current: Option<i64> = self
            .conn
            .prepare_cached(
                "SELECT version FROM oncebox_versions WHERE entity = ?1 AND entity_id = ?2",
            )?
            .query_row(params![entity, id], |r| r.get(0))
            .optional()?;
        match current {
            Some(v) if version < v => Err(HandlerError::Stale),
            Some(v) if version == v => Ok(()),
            _ => {
                self.conn
                    .prepare_cached(
                        "INSERT INTO oncebox_versions (entity, entity_id, version, source, event_id)
                         VALUES (?1, ?2, ?3, ?4, ?5)
                         ON CONFLICT (entity, entity_id) DO UPDATE SET
                           version = excluded.version, source = excluded.source,
                           event_id = excluded.event_id",
                    )?
                    .execute(params![
                        entity,
                        id,
                        version,
                        self.key.source.as_str(),
                        self.key.event_id.as_str()
                    ])?;
                Ok(())
            }
        }
    }

    /// Moves the watermark of `(stream, partition)` to `offset`, or reports a replay when the
    /// offset is at or below it.
    pub fn commit_offset(
        &mut self,
        stream: &str,
        partition: i64,
        offset: i64,
    ) -> Result<OffsetMove, HandlerError> {
        oncebox_core::check_names(&[("stream", stream)]).map_err(HandlerError::failed)?;
        Ok(if move_watermark(self.conn, stream, partition, offset)? {
            OffsetMove::Advanced
        } else {
            OffsetMove::Replay
        })
    }

    /// Queues a message for delivery after commit. The same idempotency key for the same
    /// destination is queued once: a second says whether it was the same message
    /// ([`Enqueued`]). A message no target could send (see [`OutboxMessage::check`]) fails the
    /// event: nothing of it is kept and the caller hears why.
    pub fn enqueue(&mut self, msg: &OutboxMessage) -> Result<Enqueued, HandlerError> {
        msg.check().map_err(HandlerError::failed)?;
        let queued = self
            .conn
            .prepare_cached(
                "INSERT INTO oncebox_outbox (destination, idempotency_key, payload, content_type,
                   source, event_id, created_at, next_attempt_at, hops)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7, ?8)
                 ON CONFLICT (destination, idempotency_key) DO NOTHING",
            )?
            .execute(params![
                msg.destination,
                msg.idempotency_key,
                msg.payload,
                msg.content_type,
                self.key.source.as_str(),
                self.key.event_id.as_str(),
                self.now.millis(),
                self.hops
            ])?;
        if queued == 1 {
            return Ok(Enqueued::Queued);
        }
        let first: Option<(Vec<u8>, String)> = self
            .conn
            .prepare_cached(
                "SELECT payload, content_type FROM oncebox_outbox
                 WHERE destination = ?1 AND idempotency_key = ?2",
            )?
            .query_row(params![msg.destination, msg.idempotency_key], |r| {
                Ok((crate::lenient::bytes(r, 0)?, r.get(1)?))
            })
            .optional()?;
        Ok(msg.beside(first))
    }
}

impl Tx<'_> {
    /// [`Tx::enqueue`] for a delivery of a key accepted anew. A finished delivery under the
    /// same route and key can only be an earlier life's of the key: a purge by a build from
    /// before purges took a record's finished deliveries with it (one still running beside
    /// this build during an upgrade) left it behind. It is replaced: left, it would take this
    /// delivery's place under the unique key, and the event answered 202 would never be sent.
    pub(crate) fn enqueue_anew(&mut self, msg: &OutboxMessage) -> Result<Enqueued, HandlerError> {
        let first = self.enqueue(msg)?;
        if first == Enqueued::Queued {
            return Ok(first);
        }
        let cleared = self
            .conn
            .prepare_cached(
                "DELETE FROM oncebox_outbox WHERE destination = ?1 AND idempotency_key = ?2
                   AND source = ?3 AND event_id = ?4 AND state IN ('delivered', 'dead')",
            )?
            .execute(params![
                msg.destination,
                msg.idempotency_key,
                self.key.source.as_str(),
                self.key.event_id.as_str()
            ])?;
        if cleared == 0 {
            return Ok(first);
        }
        tracing::warn!(key = %self.key, route = %msg.destination, "a finished delivery an earlier build's purge left behind was replaced by the key's new one");
        self.enqueue(msg)
    }
}

/// Moves the watermark of `(stream, partition)` up to `offset`; false when it stood at or
/// above it already.
pub(crate) fn move_watermark(
    conn: &Connection,
    stream: &str,
    partition: i64,
    offset: i64,
) -> rusqlite::Result<bool> {
    let moved = conn
        .prepare_cached(
            "INSERT INTO oncebox_offsets (stream, partition, position) VALUES (?1, ?2, ?3)
             ON CONFLICT (stream, partition) DO UPDATE SET position = excluded.position
             WHERE excluded.position > oncebox_offsets.position",
        )?
        .execute(params![stream, partition, offset])?;
    Ok(moved == 1)
}
