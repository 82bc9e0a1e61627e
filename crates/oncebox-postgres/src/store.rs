//! `EventStore` on PostgreSQL: new events through the batcher; events with an ordering guard,
//! and keys holding a two-phase lease, through `process` with a handler; listings and purge.

use std::time::Instant;

use oncebox_core::store::{
    Activity, ConflictFilter, ConflictRecord, EventFilter, EventStore, Ingest, Page, Stats,
    StoredEvent,
};
use oncebox_core::{
    Key, ProcessError, Processed, Response, ResponseKind, Retention, Timestamp, Unavailable,
};

use crate::batch::Answer;
use crate::error::storage;
use crate::inbox::Inbox;
use crate::read;
use crate::silent::answered;
use crate::tx::HandlerError;

/// Purge deletes at most this many records per statement, so a large purge never holds locks
/// long enough to stall ingest.
const PURGE_CHUNK: i64 = 1000;

impl Inbox {
    /// The per-event path of `ingest`: the ordering guard needs the entity's version read and
    /// moved inside the event's own transaction.
    async fn ingest_one(&self, ingest: Ingest) -> Result<Processed, ProcessError> {
        let messages = ingest.messages();
        let Ingest {
            event,
            order,
            accepted,
            stale,
            ..
        } = ingest;
        // Entities are namespaced by source: two senders' order ids are unrelated.
        let namespace = event.key.source.as_str().to_owned();
        // The handler below is the gateway's own statements: bounded as a batch is.
        let processed = self.process(event, move |tx| {
            Box::pin(async move {
                if let Some(order) = &order {
                    match tx.advance(&namespace, &order.entity, order.version).await {
                        // Stale: only the record is kept, and no delivery is queued.
                        Err(HandlerError::Stale) => {
                            return Ok(Response {
                                kind: ResponseKind::Stale,
                                body: stale,
                            });
                        }
                        other => other?,
                    }
                }
                for m in &messages {
                    // A new event's own deliveries, under its own keys: queued now.
                    let _ = tx.enqueue_anew(m).await?;
                }
                Ok(Response::completed(accepted))
            })
        });
        crate::silent::or_unknown(self.lost_after, processed).await
    }

    /// The time this purge may use: [`crate::anchor::purge_time`] on a pooled connection.
    async fn purge_time(&self, now: Timestamp) -> Result<Timestamp, crate::Error> {
        let mut conn = self.pool.acquire().await?;
        let (ahead, _) = crate::skew::observe(&mut conn, &self.stamps, &self.leases).await?;
        let clock = &self.clock;
        Ok(crate::anchor::purge_time(&mut conn, clock, &self.stamps, now, ahead).await?)
    }

    /// Deletes terminal records past their source's retention, with their finished deliveries
    /// and their conflicts, a chunk per statement. `now` is taken no later than the store's
    /// clock, and no further than the boot's anchor (taken at the first open on the boot,
    /// `anchor.rs`) plus the boot time since
    /// (`oncebox_core::purge_time`), so a wall clock jumping forward purges no record early.
    /// Each of its steps is bounded by `lost_after` (`silent.rs`): the gateway purges in a loop
    /// of its own, which a silent connection stopped for good, retention with it.
    pub async fn purge(&self, now: Timestamp, retention: &Retention) -> Result<u64, crate::Error> {
        let limit = self.lost_after;
        let now = crate::silent::within(limit, self.purge_time(now))
            .await
            .unwrap_or_else(|| Err(crate::silent::lost(limit).into()))?;
        let youngest_cutoff = now.minus(retention.shortest()).millis();
        let (mut after, mut deleted) = (0_i64, 0_u64);
        loop {
            let rows = sqlx::query_as(
                "SELECT id, source, state, completed_at, received_at FROM oncebox_inbox
                 WHERE id > $1 ORDER BY id LIMIT $2",
            )
            .bind(after)
            .bind(PURGE_CHUNK)
            .fetch_all(&self.pool);
            let rows: Vec<(i64, String, String, Option<i64>, i64)> = answered(limit, rows).await?;
            let due: Vec<i64> = rows
                .iter()
                .filter(|(_, source, state, completed_at, _)| {
                    retention.purgeable(source, state, completed_at.map(Timestamp), now)
                })
                .map(|r| r.0)
                .collect();
            if !due.is_empty() {
                // The deliveries of these events are locked first, so none changes between the
                // check that none is owed and the delete (an operator's redeliver committing
                // in between was deleted with its record): the delete's own snapshot, taken
                // after the locks, sees their committed states.
                let chunk = async {
                    let mut tx = crate::inbox::begin(&self.pool, self.deadline).await?;
                    sqlx::query(
                        "SELECT o.id FROM oncebox_outbox o JOIN oncebox_inbox i
                           ON o.source = i.source AND o.event_id = i.event_id
                         WHERE i.id = ANY($1) FOR UPDATE OF o",
                    )
                    .bind(&due)
                    .execute(&mut *tx)
                    .await?;
                    let gone: i64 = sqlx::query_scalar(PURGE_RECORDS)
                        .bind(&due)
                        .fetch_one(&mut *tx)
                        .await?;
                    tx.commit().await?;
                    Ok(gone)
                };
                let gone = answered(limit, chunk).await?;
                deleted += u64::try_from(gone).unwrap_or(0);
            }
            // Ids follow arrival, so once a whole chunk is younger than the shortest retention
            // nothing after it can be due; but a record dated later than now (by a node whose
            // clock ran ahead, or one since set back) says nothing of the records after it.
            let all_young = rows
                .iter()
                .all(|r| r.4 >= youngest_cutoff && r.4 <= now.millis());
            match rows.last() {
                Some(last) if rows.len() == PURGE_CHUNK as usize && !all_young => after = last.0,
                _ => break,
            }
        }
        // Conflicts whose record is gone. A conflict recorded while a purge deleted its record
        // commits after the purge's statement took its snapshot, and that statement's delete of
        // the record's conflicts did not see it: left, it was never purged (and the key,
        // accepted again before this clears it, shows it as its own).
        let orphans = sqlx::query(ORPHANED_CONFLICTS)
            .bind(youngest_cutoff)
            .execute(&self.pool);
        answered(limit, orphans).await?;
        Ok(deleted)
    }
}

/// Conflicts older than the shortest retention whose record no longer exists: a record's
/// conflicts go with it, so these are what a purge racing a conflict left.
const ORPHANED_CONFLICTS: &str = "DELETE FROM oncebox_conflicts c WHERE c.at < $1
    AND NOT EXISTS (SELECT 1 FROM oncebox_inbox i
      WHERE i.source = c.source AND i.event_id = c.event_id)";

/// Deletes the records of `$1` still terminal (the state guard keeps a record that changed
/// since the scan) unless a delivery of their event is still owed (pending, in flight, retrying
/// or uncertain): purged, a redelivery of the event would be a new event while the first one's
/// delivery is still on its way. Their finished deliveries keyed `{source}:{event_id}` (the
/// gateway's, see `Ingest::messages`) and their conflicts go in the same statement, so the
/// key accepted again is delivered anew; a library message keeps its row, which guards its own
/// key. Counts the records deleted.
const PURGE_RECORDS: &str = "WITH gone AS (
    DELETE FROM oncebox_inbox i WHERE i.id = ANY($1)
      AND i.state IN ('completed', 'rejected', 'stale')
      AND NOT EXISTS (SELECT 1 FROM oncebox_outbox o
        WHERE o.source = i.source AND o.event_id = i.event_id
          AND o.state NOT IN ('delivered', 'dead'))
    RETURNING i.source, i.event_id),
  deliveries AS (
    DELETE FROM oncebox_outbox o USING gone g
    WHERE o.source = g.source AND o.event_id = g.event_id
      AND o.idempotency_key = g.source || ':' || g.event_id
      AND o.state IN ('delivered', 'dead')),
  conflicts AS (
    DELETE FROM oncebox_conflicts c USING gone g
    WHERE c.source = g.source AND c.event_id = g.event_id)
  SELECT count(*) FROM gone";

pub(crate) fn unavailable(e: crate::Error) -> Unavailable {
    match e {
        crate::Error::Unavailable(u) => u,
        crate::Error::Sql(e) => storage(&e),
    }
}

impl EventStore for Inbox {
    async fn ingest(&self, ingest: Ingest) -> Result<Processed, ProcessError> {
        // Input no delivery could carry fails this event alone, before the batch.
        ingest.check().map_err(ProcessError::Invalid)?;
        if ingest.order.is_some() {
            return self.ingest_one(ingest).await;
        }
        let deadline = Instant::now() + self.deadline;
        match self.batcher.submit(ingest, deadline).await {
            Answer::Done(answer) => answer,
            Answer::Single(ingest) => self.ingest_one(*ingest).await,
        }
    }

    async fn event(&self, key: &Key) -> Result<Option<StoredEvent>, Unavailable> {
        let one = read::one(&self.pool, key);
        answered(self.lost_after, one)
            .await
            .map_err(|e| storage(&e))
    }

    async fn events(&self, filter: EventFilter) -> Result<Page<StoredEvent>, Unavailable> {
        let page = read::page(
            &self.pool,
            filter.source.as_ref(),
            filter.after.unwrap_or(0),
            filter.limit,
        );
        answered(self.lost_after, page)
            .await
            .map_err(|e| storage(&e))
    }

    async fn stats(&self) -> Result<Stats, Unavailable> {
        let stats = read::stats(&self.pool);
        answered(self.lost_after, stats)
            .await
            .map_err(|e| storage(&e))
    }

    async fn purge(&self, now: Timestamp, retention: &Retention) -> Result<u64, Unavailable> {
        Inbox::purge(self, now, retention)
            .await
            .map_err(unavailable)
    }

    async fn conflicts(&self, filter: ConflictFilter) -> Result<Page<ConflictRecord>, Unavailable> {
        let conflicts = read::conflicts(&self.pool, &filter);
        answered(self.lost_after, conflicts)
            .await
            .map_err(|e| storage(&e))
    }

    async fn activity(
        &self,
        since: Timestamp,
        bucket: std::time::Duration,
    ) -> Result<Activity, Unavailable> {
        let bucket_ms = i64::try_from(bucket.as_millis()).unwrap_or(i64::MAX);
        let activity = read::activity(&self.pool, since, bucket_ms);
        answered(self.lost_after, activity)
            .await
            .map_err(|e| storage(&e))
    }

    /// Ready when a connection can be had and its server takes writes now: after a failover
    /// the URL may still name a standby, or the role may default to read-only transactions,
    /// and every ingest there would fail.
    async fn ready(&self) -> Result<(), Unavailable> {
        let writable = sqlx::query_scalar(
            "SELECT NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off'",
        )
        .fetch_one(&self.pool);
        let writable: bool = answered(self.lost_after, writable)
            .await
            .map_err(|e| storage(&e))?;
        if writable {
            Ok(())
        } else {
            Err(Unavailable::Storage(
                "the server takes no writes (a standby, or read-only transactions)".into(),
            ))
        }
    }
}
