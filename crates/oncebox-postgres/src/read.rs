//! Reads for operators and for `record`: events by key or in arrival order, and counts.

use oncebox_core::store::{Page, Stats, StoredEvent};
use oncebox_core::{
    Fingerprint, Key, Meta, Record, RecordState, Response, ResponseKind, Source, Timestamp,
};
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row};

/// Listings never return more than this many events at once.
pub const MAX_PAGE: usize = 500;

pub(crate) async fn record(pool: &PgPool, key: &Key) -> Result<Option<Record>, crate::Error> {
    let Some(r) = sqlx::query(
        "SELECT fingerprint, state, response, payload, received_at, completed_at, lease_token,
           lease_expires_at
         FROM oncebox_inbox WHERE source = $1 AND event_id = $2",
    )
    .bind(key.source.as_str())
    .bind(key.event_id.as_str())
    .fetch_optional(pool)
    .await?
    else {
        return Ok(None);
    };
    let fingerprint: Vec<u8> = r.try_get(0)?;
    let state: String = r.try_get(1)?;
    let response: Option<Vec<u8>> = r.try_get(2)?;
    let state = match (ResponseKind::parse(&state), state.as_str()) {
        (Some(kind), _) => RecordState::Done(Response {
            kind,
            body: response.unwrap_or_default(),
        }),
        (None, "uncertain") => RecordState::Uncertain,
        _ => RecordState::Processing {
            lease_token: r.try_get(6)?,
            lease_expires_at: r.try_get::<Option<i64>, _>(7)?.map(Timestamp),
        },
    };
    Ok(Some(Record {
        key: key.clone(),
        fingerprint: Fingerprint::from_slice(&fingerprint),
        state,
        payload: r.try_get(3)?,
        received_at: Timestamp(r.try_get(4)?),
        completed_at: r.try_get::<Option<i64>, _>(5)?.map(Timestamp),
    }))
}

const COLUMNS: &str = "i.id, i.source, i.event_id, i.state, i.response, i.payload, i.content_type,
    i.headers, i.fingerprint, i.received_at, i.completed_at,
    (SELECT count(*) FROM oncebox_conflicts c WHERE c.source = i.source AND c.event_id = i.event_id)";

/// [`COLUMNS`] for listings: no response, payload or headers. A page holds up to 500 events
/// of up to `max_body` each, and nothing that lists them shows those (one event's view does).
const LISTED: &str = "i.id, i.source, i.event_id, i.state, NULL::bytea, NULL::bytea, i.content_type,
    NULL::text, i.fingerprint, i.received_at, i.completed_at,
    (SELECT count(*) FROM oncebox_conflicts c WHERE c.source = i.source AND c.event_id = i.event_id)";

fn stored(r: &PgRow) -> Result<Option<StoredEvent>, sqlx::Error> {
    let (source, event_id): (String, String) = (r.try_get(1)?, r.try_get(2)?);
    // Rows are written only from validated keys; one that no longer validates is skipped
    // rather than shown under a made-up name.
    let Ok(key) = Key::parse(&source, &event_id) else {
        return Ok(None);
    };
    let state: String = r.try_get(3)?;
    let response = ResponseKind::parse(&state).map(|kind| Response {
        kind,
        body: r
            .try_get::<Option<Vec<u8>>, _>(4)
            .ok()
            .flatten()
            .unwrap_or_default(),
    });
    let headers: Option<String> = r.try_get(7)?;
    Ok(Some(StoredEvent {
        seq: r.try_get(0)?,
        key,
        state,
        response,
        payload: r.try_get::<Option<Vec<u8>>, _>(5)?.unwrap_or_default(),
        meta: Meta::from_header_lines(r.try_get(6)?, headers),
        fingerprint: Fingerprint::from_slice(&r.try_get::<Vec<u8>, _>(8)?),
        received_at: Timestamp(r.try_get(9)?),
        completed_at: r.try_get::<Option<i64>, _>(10)?.map(Timestamp),
        conflicts: r.try_get(11)?,
    }))
}

pub(crate) async fn one(pool: &PgPool, key: &Key) -> Result<Option<StoredEvent>, sqlx::Error> {
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM oncebox_inbox i WHERE i.source = $1 AND i.event_id = $2"
    ))
    .bind(key.source.as_str())
    .bind(key.event_id.as_str())
    .fetch_optional(pool)
    .await?;
    Ok(match row {
        Some(r) => stored(&r)?,
        None => None,
    })
}

pub(crate) async fn page(
    pool: &PgPool,
    source: Option<&Source>,
    after: i64,
    limit: usize,
) -> Result<Page<StoredEvent>, sqlx::Error> {
    let limit = limit.clamp(1, MAX_PAGE);
    // One row more than asked tells whether there is a next page.
    let rows = sqlx::query(&format!(
        "SELECT {LISTED} FROM oncebox_inbox i
         WHERE ($1::text IS NULL OR i.source = $1) AND i.id > $2 ORDER BY i.id LIMIT $3"
    ))
    .bind(source.map(Source::as_str))
    .bind(after)
    .bind(limit as i64 + 1)
    .fetch_all(pool)
    .await?;
    Page::from_rows(rows.iter().map(|r| Ok((r.try_get(0)?, stored(r)?))), limit)
}

pub(crate) async fn stats(pool: &PgPool) -> Result<Stats, sqlx::Error> {
    let states: Vec<(String, i64)> =
        sqlx::query_as("SELECT state, count(*) FROM oncebox_inbox GROUP BY state ORDER BY state")
            .fetch_all(pool)
            .await?;
    let conflicts: i64 = sqlx::query_scalar("SELECT count(*) FROM oncebox_conflicts")
        .fetch_one(pool)
        .await?;
    let outbox: i64 = sqlx::query_scalar("SELECT count(*) FROM oncebox_outbox")
        .fetch_one(pool)
        .await?;
    let (actions, versions, offsets): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM oncebox_actions), (SELECT count(*) FROM oncebox_versions),
                (SELECT count(*) FROM oncebox_offsets)",
    )
    .fetch_one(pool)
    .await?;
    Ok(Stats {
        states,
        conflicts,
        outbox,
        kept: oncebox_core::store::Kept {
            actions,
            versions,
            offsets,
        },
    })
}

/// Refused conflicting payloads in recording order, optionally for one key.
pub(crate) async fn conflicts(
    pool: &PgPool,
    filter: &oncebox_core::store::ConflictFilter,
) -> Result<Page<oncebox_core::store::ConflictRecord>, sqlx::Error> {
    let limit = filter.limit.clamp(1, MAX_PAGE);
    let key = filter.key.as_ref();
    // One row more than asked tells whether there is a next page.
    let rows = sqlx::query(
        "SELECT id, source, event_id, stored_fingerprint, offered_fingerprint, payload, at
         FROM oncebox_conflicts
         WHERE ($1::text IS NULL OR (source = $1 AND event_id = $2)) AND id > $3
         ORDER BY id LIMIT $4",
    )
    .bind(key.map(|k| k.source.as_str()))
    .bind(key.map(|k| k.event_id.as_str()))
    .bind(filter.after.unwrap_or(0))
    .bind(limit as i64 + 1)
    .fetch_all(pool)
    .await?;
    let conflict = |r: &PgRow| -> Result<_, sqlx::Error> {
        let (source, event_id): (String, String) = (r.try_get(1)?, r.try_get(2)?);
        // Written only from validated keys; one that no longer validates is skipped.
        let Ok(key) = Key::parse(&source, &event_id) else {
            return Ok((r.try_get(0)?, None));
        };
        Ok((
            r.try_get(0)?,
            Some(oncebox_core::store::ConflictRecord {
                seq: r.try_get(0)?,
                key,
                stored_fingerprint: Fingerprint::from_slice(&r.try_get::<Vec<u8>, _>(3)?),
                offered_fingerprint: Fingerprint::from_slice(&r.try_get::<Vec<u8>, _>(4)?),
                payload: r.try_get::<Option<Vec<u8>>, _>(5)?.unwrap_or_default(),
                at: Timestamp(r.try_get(6)?),
            }),
        ))
    };
    Page::from_rows(rows.iter().map(conflict), limit)
}

/// Counts per source and state, and arrivals since `since` per bucket of `bucket_ms`.
pub(crate) async fn activity(
    pool: &PgPool,
    since: Timestamp,
    bucket_ms: i64,
) -> Result<oncebox_core::store::Activity, sqlx::Error> {
    let counts: Vec<(String, String, i64)> = sqlx::query_as(
        // Byte order (`C`), as SQLite sorts text: the database's own collation might put
        // `_` before `-` or digits.
        "SELECT source, state, n FROM (
           SELECT source, state, count(*) AS n FROM oncebox_inbox GROUP BY source, state
           UNION ALL
           SELECT source, 'conflict', count(*) FROM oncebox_conflicts GROUP BY source
         ) c ORDER BY source COLLATE \"C\", state COLLATE \"C\"",
    )
    .fetch_all(pool)
    .await?;
    let rows: Vec<(i64, String, i64)> = sqlx::query_as(
        "SELECT (received_at / $2) * $2 AS b, source, count(*) FROM oncebox_inbox
         WHERE received_at >= $1 GROUP BY b, source ORDER BY b, source COLLATE \"C\"",
    )
    .bind(since.millis())
    .bind(bucket_ms.max(1))
    .fetch_all(pool)
    .await?;
    let buckets = rows
        .into_iter()
        .map(|(b, s, n)| (Timestamp(b), s, n))
        .collect();
    Ok(oncebox_core::store::Activity { counts, buckets })
}
