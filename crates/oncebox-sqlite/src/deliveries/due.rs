//! The claim's look for due deliveries: the query, and each row read so that one an edit left
//! unreadable is parked, not allowed to fail every claim of every relay.

use oncebox_core::Key;
use rusqlite::Row;

use crate::lenient::{bytes, unreadable};

/// `?1` is now, `?2` the limit, `?3…` the routes. Each claimable state is its own arm so each
/// reads one range of `oncebox_outbox_due` in order and stops at the limit; the arms are then
/// merged. An `in_flight` row is due when its lease expired: its relay died or stalled
/// mid-attempt, and the claim says so (`taken_over`, the last column).
pub(super) fn due_sql(routes: usize) -> String {
    let only = if routes == 0 {
        String::new()
    } else {
        let marks: Vec<String> = (3..3 + routes).map(|i| format!("?{i}")).collect();
        format!(" AND destination IN ({})", marks.join(", "))
    };
    let arm = |due: &str| {
        format!(
            "SELECT * FROM (SELECT id, destination, idempotency_key, payload, content_type,
               source, event_id, attempts, created_at, next_attempt_at, state = 'in_flight',
               budget_attempts, coalesce(budget_at, created_at), hops
             FROM oncebox_outbox WHERE {due}{only} ORDER BY next_attempt_at, id LIMIT ?2)"
        )
    };
    format!(
        "{} UNION ALL {} UNION ALL {} ORDER BY next_attempt_at, id LIMIT ?2",
        arm("state = 'pending' AND next_attempt_at <= ?1"),
        arm("state = 'retrying' AND next_attempt_at <= ?1"),
        arm("state = 'in_flight' AND lease_expires_at <= ?1"),
    )
}

/// A due row before it is leased.
pub(super) struct Due {
    pub id: i64,
    pub route: String,
    pub idempotency_key: String,
    pub payload: Vec<u8>,
    pub content_type: String,
    pub key: Key,
    pub attempts: i64,
    pub created_at: i64,
    pub taken_over: bool,
    pub budget_attempts: i64,
    pub budget_at: i64,
    pub hops: i64,
}

/// A due row, or its id and why it can never be sent: its key no longer validates, or a value
/// is not of its column's type (SQLite keeps whatever is written). An error reading the
/// database itself is an error.
pub(super) fn due(r: &Row<'_>) -> rusqlite::Result<Result<Due, (i64, String)>> {
    let id: i64 = r.get(0)?;
    match fields(id, r) {
        Ok(Ok(due)) => Ok(Ok(due)),
        Ok(Err(why)) => Ok(Err((id, format!("stored key no longer validates: {why}")))),
        Err(e) if unreadable(&e) => Ok(Err((id, format!("stored row no longer reads: {e}")))),
        Err(e) => Err(e),
    }
}

fn fields(id: i64, r: &Row<'_>) -> rusqlite::Result<Result<Due, String>> {
    let (source, event_id): (String, String) = (r.get(5)?, r.get(6)?);
    let key = match Key::parse(&source, &event_id) {
        Ok(key) => key,
        Err(e) => return Ok(Err(e.to_string())),
    };
    Ok(Ok(Due {
        id,
        route: r.get(1)?,
        idempotency_key: r.get(2)?,
        payload: bytes(r, 3)?,
        content_type: r.get(4)?,
        key,
        attempts: r.get(7)?,
        created_at: r.get(8)?,
        taken_over: r.get(10)?,
        budget_attempts: r.get(11)?,
        budget_at: r.get(12)?,
        hops: r.get(13)?,
    }))
}
