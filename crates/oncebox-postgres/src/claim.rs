//! Claiming a key on PostgreSQL: `INSERT … ON CONFLICT DO NOTHING`, and when the key exists, the
//! decision from the stored record read back under a row lock — never from an error (G3).

use std::time::Duration;

use oncebox_core::{
    Event, Fingerprint, LeaseSeen, ProcessError, Processed, Response, ResponseKind, Timestamp,
    lease_seen,
};
use sqlx::{PgConnection, Row};

use crate::qualified::InTx;

/// A claimed record: its row, and the transaction that claimed it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Claimed {
    pub row: i64,
    /// `txid_current()` of the claiming transaction: `finish` records the outcome only in that
    /// same transaction, so a handler that ended it (its own `COMMIT` or `ROLLBACK` on
    /// `tx.conn()`) cannot have its record written in autocommit, apart from its effect.
    pub xact: i64,
}

/// What the claim decided.
pub(crate) enum Claim {
    /// The key is ours: a new record in state `processing`.
    Fresh(Claimed),
    /// An expired lease taken over: ours now, but its holder may have run the outside effect.
    TakenOver(Claimed),
    /// Answered from the record; the handler must not run. The transaction must still commit
    /// (a conflict is recorded for audit).
    Answered(Result<Processed, ProcessError>),
    /// The record vanished between the insert and the read (released or purged meanwhile):
    /// claim again in a new transaction.
    Vanished,
}

/// Claims `event`'s key inside the caller's transaction. `lease` is `Some((token, expires_at))`
/// for the two-phase form. On an existing key the row is read `FOR UPDATE`: that waits for a
/// concurrent holder's transaction and then sees its committed result, so the decision is made
/// on committed state only. `now` is the server's time the claim's rows are written at (a
/// lease's `expires_at` was counted from it); `judged` reads the server's time again, to judge
/// a lease found once its row is locked.
pub(crate) async fn claim(
    conn: &mut PgConnection,
    event: &Event,
    (now, judged): (i64, &(dyn Fn() -> i64 + Send + Sync)),
    lease: Option<(i64, i64)>,
) -> Result<Claim, sqlx::Error> {
    let key = &event.key;
    let (token, expires) = lease.unzip();
    // The transaction id comes back with the row, in the same round trip.
    let inserted: Option<(i64, i64)> = sqlx::query_as(
        "INSERT INTO oncebox_inbox (source, event_id, fingerprint, state, payload, received_at,
           lease_token, lease_expires_at, content_type, headers)
         VALUES ($1, $2, $3, 'processing', $4, $5, $6, $7, $8, $9)
         ON CONFLICT (source, event_id) DO NOTHING RETURNING id, txid_current()",
    )
    .bind(key.source.as_str())
    .bind(key.event_id.as_str())
    .bind(&event.fingerprint.as_bytes()[..])
    .bind(&event.payload)
    .bind(now)
    .bind(token)
    .bind(expires)
    .bind(event.meta.content_type.as_deref())
    .bind(event.meta.header_lines())
    .fetch_optional(&mut *conn)
    .await?;
    if let Some((row, xact)) = inserted {
        return Ok(Claim::Fresh(Claimed { row, xact }));
    }
    let Some(row) = sqlx::query(
        "SELECT id, fingerprint, state, response, lease_expires_at, received_at
         FROM oncebox_inbox WHERE source = $1 AND event_id = $2 FOR UPDATE",
    )
    .bind(key.source.as_str())
    .bind(key.event_id.as_str())
    .fetch_optional(&mut *conn)
    .await?
    else {
        return Ok(Claim::Vanished);
    };
    // Read once the row is ours: the lock may have been waited for up to the deadline, while
    // another claimer took the key over. Judged by a time from before that wait, its lease,
    // begun after it, looked begun in the future by more than a lease (a clock stepped back)
    // and was re-anchored to end before it began; the next claim took over a live holder.
    let judged_at = judged();
    let id: i64 = row.try_get(0)?;
    let stored: Vec<u8> = row.try_get(1)?;
    let state: String = row.try_get(2)?;
    if stored[..] != event.fingerprint.as_bytes()[..]
        && !stored_payload_matches(conn, id, event).await?
    {
        record_conflict(conn, event, &stored, now).await?;
        let stored = Fingerprint::from_slice(&stored).unwrap_or(event.fingerprint);
        return Ok(Claim::Answered(Err(ProcessError::Conflict {
            stored,
            offered: event.fingerprint,
        })));
    }
    if let Some(kind) = ResponseKind::parse(&state) {
        let body: Option<Vec<u8>> = row.try_get(3)?;
        return Ok(Claim::Answered(Ok(Processed::Duplicate(Response {
            kind,
            body: body.unwrap_or_default(),
        }))));
    }
    if state == "uncertain" {
        return Ok(Claim::Answered(Err(ProcessError::Uncertain)));
    }
    // `processing` without a lease: only `process` claims without one, and its claim commits
    // with its record, unless its handler committed the transaction itself (`COMMIT` on
    // `tx.conn()`) and then failed or died. Its effect may have committed with the claim:
    // taken over, it would run again. Parked as uncertain, for an operator to resolve.
    let Some(expires_at) = row.try_get::<Option<i64>, _>(4)? else {
        sqlx::query("UPDATE oncebox_inbox SET state = 'uncertain' WHERE id = $1")
            .bind(id)
            .execute(&mut *conn)
            .await?;
        tracing::error!(
            key = %key,
            "a claim committed without its outcome (a handler's own COMMIT): parked uncertain"
        );
        return Ok(Claim::Answered(Err(ProcessError::Uncertain)));
    };
    // `processing`: a two-phase lease. Live → in progress; begun after now (the clock went
    // back) → re-anchored to one TTL from now, still in progress; expired → taken over, fenced
    // by a new token so the old holder can no longer complete.
    let begun_at: i64 = row.try_get(5)?;
    let seen = lease_seen(
        Timestamp(begun_at),
        Timestamp(expires_at),
        Timestamp(judged_at),
    );
    let until = match seen {
        LeaseSeen::Live => Some(expires_at),
        LeaseSeen::Reanchor(until) => {
            // The row is locked (FOR UPDATE above) until this transaction ends.
            sqlx::query(
                "UPDATE oncebox_inbox SET received_at = $2, lease_expires_at = $3 WHERE id = $1",
            )
            .bind(id)
            .bind(judged_at)
            .bind(until.millis())
            .execute(&mut *conn)
            .await?;
            Some(until.millis())
        }
        LeaseSeen::Expired => None,
    };
    if let Some(until) = until {
        let wait = u64::try_from(until - judged_at).unwrap_or(0);
        return Ok(Claim::Answered(Err(ProcessError::InProgress {
            retry_after: Duration::from_millis(wait),
        })));
    }
    // `process` (no lease of its own) finding a two-phase lease expired unfinished: its holder
    // may have made the outside call before it stopped, and a handler run now could repeat the
    // event's effect without knowing it, where `begin` would say `taken_over`. Parked
    // uncertain instead, fencing the old holder, for `resolve`.
    if token.is_none() {
        sqlx::query(
            "UPDATE oncebox_inbox SET state = 'uncertain', lease_token = NULL,
               lease_expires_at = NULL WHERE id = $1",
        )
        .bind(id)
        .execute(&mut *conn)
        .await?;
        tracing::warn!(key = %key, "{}", oncebox_core::PARKED_EXPIRED_LEASE);
        return Ok(Claim::Answered(Err(ProcessError::Uncertain)));
    }
    let xact: i64 = sqlx::query_scalar(
        "UPDATE oncebox_inbox SET lease_token = $2, lease_expires_at = $3, received_at = $4
         WHERE id = $1 RETURNING txid_current()",
    )
    .bind(id)
    .bind(token)
    .bind(expires)
    .bind(now)
    .fetch_one(&mut *conn)
    .await?;
    Ok(Claim::TakenOver(Claimed { row: id, xact }))
}

/// Whether the record `id`, whose fingerprint differs, is `event` fingerprinted the way an
/// earlier version took it: read only for events that say it may be (`Event::recheck`).
async fn stored_payload_matches(
    conn: &mut PgConnection,
    id: i64,
    event: &Event,
) -> Result<bool, sqlx::Error> {
    if event.recheck.is_none() {
        return Ok(false);
    }
    let payload: Option<Vec<u8>> =
        sqlx::query_scalar("SELECT payload FROM oncebox_inbox WHERE id = $1")
            .bind(id)
            .fetch_one(&mut *conn)
            .await?;
    Ok(payload.is_some_and(|p| event.matches_payload(&p)))
}

/// What a handler may have changed for its whole session that later statements on its pooled
/// connection depend on, set back to what the connection started with: the path the
/// autocommit statements (`complete`, `release`, the relay's claims and records) resolve their
/// tables by, and `synchronous_commit`, without which they, and this very commit, would be
/// acknowledged before they are durable (G6). `begin` sets both for each transaction, but not
/// for the statements outside one. The `SET LOCAL` keeps this transaction's commit durable
/// where the server's own default is not (a pooler that dropped the startup options).
pub(crate) const RESET_SESSION: &str =
    "RESET search_path; RESET synchronous_commit; SET LOCAL synchronous_commit = on";

/// Marks the claimed record terminal with its response, only inside the transaction that
/// claimed it. False when that transaction is gone (the handler ran `COMMIT` or `ROLLBACK`
/// itself, maybe `BEGIN` after): then nothing was written, and the caller must not commit.
/// What the handler changed of [`RESET_SESSION`]'s settings is reset before the commit, so that
/// a change made for its session does not follow the connection back into the pool.
pub(crate) async fn finish(
    conn: &mut PgConnection,
    sql: &InTx,
    claimed: Claimed,
    response: &Response,
    now: i64,
) -> Result<bool, sqlx::Error> {
    let body = (!response.body.is_empty()).then_some(&response.body);
    // Checked in the statement itself, so the common path pays no extra round trip. Outside a
    // transaction block `txid_current()` takes a new id, so the guard fails there too.
    let own_session: Option<bool> = sqlx::query_scalar(&sql.finish)
        .bind(claimed.row)
        .bind(response.kind.as_str())
        .bind(body)
        .bind(now)
        .bind(claimed.xact)
        .bind(&sql.path)
        .fetch_optional(&mut *conn)
        .await?;
    if own_session == Some(false) {
        sqlx::Executor::execute(conn, RESET_SESSION).await?;
    }
    Ok(own_session.is_some())
}

pub(crate) async fn record_conflict(
    conn: &mut PgConnection,
    event: &Event,
    stored: &[u8],
    now: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO oncebox_conflicts (source, event_id, stored_fingerprint,
           offered_fingerprint, payload, at) VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(event.key.source.as_str())
    .bind(event.key.event_id.as_str())
    .bind(stored)
    .bind(&event.fingerprint.as_bytes()[..])
    .bind(&event.payload)
    .bind(now)
    .execute(conn)
    .await?;
    Ok(())
}
