//! The reads of `DeliveryStore` on reader connections: listings, attempts and gauges, which
//! never wait behind the writer.

use std::time::Duration;

use oncebox_core::delivery::DeliveryState;
use oncebox_core::relay_store::{
    AttemptRecord, Budget, DeliveryFilter, DeliveryGauges, DeliveryView,
};
use oncebox_core::store::Page;
use oncebox_core::{Key, Timestamp};
use rusqlite::types::Value;
use rusqlite::{Connection, Row, params_from_iter};

use crate::store::MAX_PAGE;

/// Attempt counts are stored as SQLite integers; one out of range is clamped, never a panic.
pub(super) fn count(n: i64) -> u32 {
    u32::try_from(n.max(0)).unwrap_or(u32::MAX)
}

const VIEW_COLUMNS: &str = "id, destination, source, event_id, state, attempts, created_at,
    next_attempt_at, last_status, last_error, note, idempotency_key, budget_attempts,
    coalesce(budget_at, created_at), hops";

fn view(r: &Row<'_>) -> rusqlite::Result<Option<DeliveryView>> {
    let (source, event_id, state): (String, String, String) = (r.get(2)?, r.get(3)?, r.get(4)?);
    // Rows are written only from validated keys and known states; one that no longer parses
    // is skipped rather than shown under a made-up name.
    let (Ok(key), Some(state)) = (Key::parse(&source, &event_id), DeliveryState::parse(&state))
    else {
        return Ok(None);
    };
    // The time of the next attempt means something only while one is scheduled.
    let next_attempt_at = match state {
        DeliveryState::Pending | DeliveryState::Retrying => Some(Timestamp(r.get(7)?)),
        _ => None,
    };
    Ok(Some(DeliveryView {
        id: r.get(0)?,
        route: r.get(1)?,
        key,
        idempotency_key: r.get(11)?,
        state,
        attempts: count(r.get(5)?),
        created_at: Timestamp(r.get(6)?),
        budget: Budget {
            attempts_before: count(r.get(12)?),
            since: Timestamp(r.get(13)?),
        },
        next_attempt_at,
        last_status: r
            .get::<_, Option<i64>>(8)?
            .and_then(|s| u16::try_from(s).ok()),
        last_error: r.get(9)?,
        note: r.get(10)?,
        hops: count(r.get(14)?),
    }))
}

pub(super) fn page(
    c: &Connection,
    filter: &DeliveryFilter,
) -> rusqlite::Result<Page<DeliveryView>> {
    let limit = filter.limit.clamp(1, MAX_PAGE);
    // Only the conditions asked for are in the SQL, so the planner sees each one and can use
    // the key or state index (`?n IS NULL OR …` would hide them from it).
    let mut sql = format!("SELECT {VIEW_COLUMNS} FROM oncebox_outbox WHERE id > ?1");
    let mut args = vec![Value::Integer(filter.after.unwrap_or(0))];
    let mut and = |column: &str, value: Value| {
        args.push(value);
        sql.push_str(&format!(" AND {column} = ?{}", args.len()));
    };
    if let Some(state) = filter.state {
        and("state", Value::Text(state.as_str().to_owned()));
    }
    if let Some(route) = &filter.route {
        and("destination", Value::Text(route.clone()));
    }
    if let Some(key) = &filter.key {
        and("source", Value::Text(key.source.as_str().to_owned()));
        and("event_id", Value::Text(key.event_id.as_str().to_owned()));
    }
    if let Some(due) = filter.due_by {
        args.push(Value::Integer(due.millis()));
        sql.push_str(&format!(" AND next_attempt_at <= ?{}", args.len()));
    }
    args.push(Value::Integer(limit as i64 + 1));
    sql.push_str(&format!(" ORDER BY id LIMIT ?{}", args.len()));
    let mut q = c.prepare_cached(&sql)?;
    // One row more than asked tells whether there is a next page.
    let rows = q.query_map(params_from_iter(args), |r| Ok((r.get(0)?, view(r)?)))?;
    Page::from_rows(rows, limit)
}

pub(super) fn attempts(c: &Connection, id: i64) -> rusqlite::Result<Vec<AttemptRecord>> {
    // Attempts of one delivery are serialised by its lease, so insertion order is their order
    // even when the clock jumped between them.
    c.prepare_cached(
        "SELECT started_at, duration_ms, status, error FROM oncebox_attempts
         WHERE delivery_id = ?1 ORDER BY id",
    )?
    .query_map([id], |r| {
        Ok(AttemptRecord {
            started_at: Timestamp(r.get(0)?),
            duration: Duration::from_millis(u64::try_from(r.get::<_, i64>(1)?).unwrap_or(0)),
            status: r
                .get::<_, Option<i64>>(2)?
                .and_then(|s| u16::try_from(s).ok()),
            error: r.get(3)?,
        })
    })?
    .collect()
}

pub(super) fn gauges(c: &Connection) -> rusqlite::Result<DeliveryGauges> {
    let by_state = c
        .prepare_cached("SELECT state, count(*) FROM oncebox_outbox GROUP BY state ORDER BY state")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    let owed: Vec<(String, i64, i64)> = c
        .prepare_cached(
            "SELECT destination, count(*), min(created_at) FROM oncebox_outbox
             WHERE state IN ('pending', 'retrying', 'in_flight')
             GROUP BY destination ORDER BY destination",
        )?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<Result<_, _>>()?;
    Ok(DeliveryGauges::new(by_state, owed))
}
