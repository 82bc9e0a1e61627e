//! A batch's deliveries: one row per route of each new event, in the batch's transaction, and
//! what a key accepted anew finds under its own key.

use oncebox_core::Unavailable;
use oncebox_core::store::Ingest;
use sqlx::PgConnection;

use crate::error::storage;
use crate::inbox::notify;

const INSERT: &str = "
    INSERT INTO oncebox_outbox (destination, idempotency_key, payload, content_type, source,
      event_id, created_at, next_attempt_at, hops)
    SELECT d, k, p, ct, s, e, $7, $7, h
    FROM UNNEST($1::text[], $2::text[], $3::bytea[], $4::text[], $5::text[], $6::text[],
                $8::int4[]) AS t(d, k, p, ct, s, e, h)
    ON CONFLICT (destination, idempotency_key) DO NOTHING";

/// A finished delivery under a new event's own key and route can only be an earlier life's of
/// the key: a purge by a build from before purges took a record's finished deliveries with it
/// (one still running beside this build during an upgrade) left it behind. Left, it would take
/// the new delivery's place under the unique key, and the event answered 202 would never be
/// delivered.
const CLEAR_LEFT_BEHIND: &str = "
    DELETE FROM oncebox_outbox o USING UNNEST($1::text[], $2::text[]) AS t(d, k)
    WHERE o.destination = t.d AND o.idempotency_key = t.k AND o.state IN ('delivered', 'dead')
      AND o.idempotency_key = o.source || ':' || o.event_id";

/// Queues the deliveries of `new` (the batch's new events) and wakes the relays; `now` dates
/// them. A conflict on the outbox's unique key, which a new key never meets unless an earlier
/// build left its finished delivery behind, clears those and queues again.
pub(super) async fn queue(
    tx: &mut PgConnection,
    new: &[&Ingest],
    now: i64,
    channel: &str,
) -> Result<(), Unavailable> {
    let (mut dest, mut okey, mut opay, mut otype, mut osrc, mut oid, mut ohops) = (
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::<i32>::new(),
    );
    for ingest in new {
        let e = &ingest.event;
        for route in &ingest.routes {
            dest.push(route.as_str());
            // `{source}:{event_id}` for every attempt, forever. Do not change.
            okey.push(e.key.to_string());
            opay.push(&e.payload[..]);
            otype.push(ingest.delivered_content_type());
            osrc.push(e.key.source.as_str());
            oid.push(e.key.event_id.as_str());
            let hops = oncebox_core::hops::sent(e.meta.hops());
            ohops.push(i32::try_from(hops).unwrap_or(i32::MAX));
        }
    }
    if dest.is_empty() {
        return Ok(());
    }
    let insert = async |tx: &mut PgConnection| {
        sqlx::query(INSERT)
            .bind(&dest)
            .bind(&okey)
            .bind(&opay)
            .bind(&otype)
            .bind(&osrc)
            .bind(&oid)
            .bind(now)
            .bind(&ohops)
            .execute(tx)
            .await
            .map(|done| done.rows_affected())
            .map_err(|e| storage(&e))
    };
    let queued = insert(&mut *tx).await?;
    if queued < dest.len() as u64 {
        let cleared = sqlx::query(CLEAR_LEFT_BEHIND)
            .bind(&dest)
            .bind(&okey)
            .execute(&mut *tx)
            .await
            .map_err(|e| storage(&e))?
            .rows_affected();
        if cleared > 0 {
            tracing::warn!(
                cleared,
                "finished deliveries an earlier build's purge left behind were replaced by \
                 their keys' new deliveries"
            );
            insert(&mut *tx).await?;
        }
    }
    notify(tx, channel).await.map_err(|e| storage(&e))
}
