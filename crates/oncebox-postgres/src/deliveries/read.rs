//! The reads of `DeliveryStore`: listings, attempts and gauges, from the pool; they take no
//! locks, so they never wait behind claims or ingest.

use std::time::Duration;

use oncebox_core::delivery::DeliveryState;
use oncebox_core::relay_store::{
    AttemptRecord, Budget, DeliveryFilter, DeliveryGauges, DeliveryView,
};
use oncebox_core::store::Page;
use oncebox_core::{Key, Timestamp};
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Postgres, QueryBuilder, Row};

use crate::read::MAX_PAGE;

/// Attempt counts are stored as `INTEGER`; one out of range is clamped, never a panic.
pub(super) fn count(n: i32) -> u32 {
    u32::try_from(n.max(0)).unwrap_or(0)
}

/// A stored status that is not an HTTP status is shown as none rather than wrapped.
fn status(s: Option<i32>) -> Option<u16> {
    s.and_then(|s| u16::try_from(s).ok())
}

const VIEW_COLUMNS: &str = "id, destination, source, event_id, state, attempts, created_at,
    next_attempt_at, last_status, last_error, note, idempotency_key, budget_attempts,
    coalesce(budget_at, created_at), hops";

fn view(r: &PgRow) -> Result<Option<DeliveryView>, sqlx::Error> {
    let (source, event_id, state): (String, String, String) =
        (r.try_get(2)?, r.try_get(3)?, r.try_get(4)?);
    // Rows are written only from validated keys and known states; one that no longer parses
    // is skipped rather than shown under a made-up name.
    let (Ok(key), Some(state)) = (Key::parse(&source, &event_id), DeliveryState::parse(&state))
    else {
        return Ok(None);
    };
    // The time of the next attempt means something only while one is scheduled.
    let next_attempt_at = match state {
        DeliveryState::Pending | DeliveryState::Retrying => Some(Timestamp(r.try_get(7)?)),
        _ => None,
    };
    Ok(Some(DeliveryView {
        id: r.try_get(0)?,
        route: r.try_get(1)?,
        key,
        idempotency_key: r.try_get(11)?,
        state,
        attempts: count(r.try_get(5)?),
        created_at: Timestamp(r.try_get(6)?),
        budget: Budget {
            attempts_before: count(r.try_get(12)?),
            since: Timestamp(r.try_get(13)?),
        },
        next_attempt_at,
        last_status: status(r.try_get(8)?),
        last_error: r.try_get(9)?,
        note: r.try_get(10)?,
        hops: count(r.try_get(14)?),
    }))
}

pub(super) async fn page(
    pool: &PgPool,
    filter: &DeliveryFilter,
) -> Result<Page<DeliveryView>, sqlx::Error> {
    let limit = filter.limit.clamp(1, MAX_PAGE);
    // Only the conditions asked for are in the SQL, so the planner sees each one and can use
    // the key or state index (`$n IS NULL OR …` would hide them from it).
    let mut sql = QueryBuilder::<Postgres>::new(format!(
        "SELECT {VIEW_COLUMNS} FROM oncebox_outbox WHERE id > "
    ));
    sql.push_bind(filter.after.unwrap_or(0));
    if let Some(state) = filter.state {
        sql.push(" AND state = ").push_bind(state.as_str());
    }
    if let Some(route) = &filter.route {
        sql.push(" AND destination = ").push_bind(route.as_str());
    }
    if let Some(key) = &filter.key {
        sql.push(" AND source = ").push_bind(key.source.as_str());
        sql.push(" AND event_id = ")
            .push_bind(key.event_id.as_str());
    }
    if let Some(due) = filter.due_by {
        sql.push(" AND next_attempt_at <= ").push_bind(due.millis());
    }
    // One row more than asked tells whether there is a next page.
    sql.push(" ORDER BY id LIMIT ").push_bind(limit as i64 + 1);
    let rows = sql.build().fetch_all(pool).await?;
    Page::from_rows(rows.iter().map(|r| Ok((r.try_get(0)?, view(r)?))), limit)
}

pub(super) async fn attempts(pool: &PgPool, id: i64) -> Result<Vec<AttemptRecord>, sqlx::Error> {
    // Attempts of one delivery are serialised by its lease, so insertion order is their order
    // even when the clock jumped between them.
    let rows = sqlx::query(
        "SELECT started_at, duration_ms, status, error FROM oncebox_attempts
         WHERE delivery_id = $1 ORDER BY id",
    )
    .bind(id)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(AttemptRecord {
                started_at: Timestamp(r.try_get(0)?),
                duration: Duration::from_millis(
                    u64::try_from(r.try_get::<i64, _>(1)?).unwrap_or(0),
                ),
                status: status(r.try_get(2)?),
                error: r.try_get(3)?,
            })
        })
        .collect()
}

pub(super) async fn gauges(pool: &PgPool) -> Result<DeliveryGauges, sqlx::Error> {
    let by_state: Vec<(String, i64)> =
        sqlx::query_as("SELECT state, count(*) FROM oncebox_outbox GROUP BY state ORDER BY state")
            .fetch_all(pool)
            .await?;
    let owed: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT destination, count(*), min(created_at) FROM oncebox_outbox
         WHERE state IN ('pending', 'retrying', 'in_flight')
         GROUP BY destination ORDER BY destination",
    )
    .fetch_all(pool)
    .await?;
    Ok(DeliveryGauges::new(by_state, owed))
}
