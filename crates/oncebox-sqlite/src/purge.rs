//! Retention: deletes terminal inbox records older than their source's retention, with their
//! finished deliveries and their conflicts, a chunk per writer request so a large purge never
//! stalls ingest.

use std::sync::Arc;
use std::time::Duration;

use oncebox_core::{BootAnchor, Clock, PURGE_LAG_ADVICE, Retention, Stamps, Timestamp};
use rusqlite::{Connection, OptionalExtension, params};

use crate::writer::{Cx, Fatal};

pub(crate) const CHUNK: i64 = 1000;

/// Progress of one chunk.
#[derive(Debug)]
pub(crate) struct Chunk {
    pub deleted: u64,
    /// Resume after this record id; `None` when the scan is done.
    pub next: Option<i64>,
}

/// An inbox row as the scan reads it.
struct Row {
    id: i64,
    source: String,
    event_id: String,
    state: String,
    completed_at: Option<i64>,
    received_at: i64,
}

/// The row whose id was read first.
fn fields(id: i64, r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    Ok(Row {
        id,
        source: r.get(1)?,
        event_id: r.get(2)?,
        state: r.get(3)?,
        completed_at: r.get(4)?,
        received_at: r.get(5)?,
    })
}

/// Deletes one record unless a delivery of its event is still owed (pending, in flight,
/// retrying or uncertain): purged, a redelivery of the event would be a new event while the
/// first one's delivery is still on its way. Its finished deliveries go with it.
const DELETE_RECORD: &str = "DELETE FROM oncebox_inbox WHERE id = ?1 AND NOT EXISTS (
    SELECT 1 FROM oncebox_outbox o
    WHERE o.source = oncebox_inbox.source AND o.event_id = oncebox_inbox.event_id
      AND o.state <> 'delivered' AND o.state <> 'dead')";

/// Scans records in arrival (id) order after `after`. Only `completed`, `rejected` and `stale`
/// records are ever deleted: a `processing` or `uncertain` key is still owed an outcome.
pub(crate) fn chunk(
    cx: &mut Cx<'_, '_>,
    after: i64,
    now: Timestamp,
    retention: &Retention,
) -> Result<Result<Chunk, crate::Error>, Fatal> {
    // A row an edit by hand left unlike what oncebox writes is passed over, kept: read
    // strictly, it failed every purge's batch (its batch-mates' ingest answered 503) and no
    // purge ever got past it.
    let read: Vec<Result<Row, i64>> = cx
        .conn
        .prepare_cached(
            "SELECT id, source, event_id, state, completed_at, received_at FROM oncebox_inbox
             WHERE id > ?1 ORDER BY id LIMIT ?2",
        )?
        .query_map(params![after, CHUNK], |r| {
            let id: i64 = r.get(0)?;
            match fields(id, r) {
                Err(e) if crate::lenient::unreadable(&e) => Ok(Err(id)),
                other => other.map(Ok),
            }
        })?
        .collect::<Result<_, _>>()?;
    let last = read.last().map(|r| match r {
        Ok(row) => row.id,
        Err(id) => *id,
    });
    let unreadable: Vec<i64> = read
        .iter()
        .filter_map(|r| r.as_ref().err().copied())
        .collect();
    if !unreadable.is_empty() {
        tracing::warn!(
            ids = ?unreadable,
            "inbox records whose values are not of the types oncebox writes are kept by the \
             purge (edited by hand?)"
        );
    }
    let rows: Vec<Row> = read.into_iter().filter_map(Result::ok).collect();
    let youngest_cutoff = now.minus(retention.shortest()).millis();
    let mut deleted = 0;
    let mut all_young = true;
    let mut delete = cx.conn.prepare_cached(DELETE_RECORD)?;
    let mut deliveries = cx.conn.prepare_cached(
        "DELETE FROM oncebox_outbox
         WHERE source = ?1 AND event_id = ?2 AND idempotency_key = ?3",
    )?;
    let mut conflicts = cx
        .conn
        .prepare_cached("DELETE FROM oncebox_conflicts WHERE source = ?1 AND event_id = ?2")?;
    for r in &rows {
        // A record received later than now was dated by a clock since set back (one machine's
        // clock: all SQLite's writers share it): it says nothing of the records after it,
        // which a chunk of such records otherwise hid from every purge until the clock caught
        // up.
        all_young &= r.received_at >= youngest_cutoff && r.received_at <= now.millis();
        let completed_at = r.completed_at.map(Timestamp);
        if retention.purgeable(&r.source, &r.state, completed_at, now)
            && delete.execute([r.id])? == 1
        {
            deleted += 1;
            // The gateway's deliveries of the event (keyed `{source}:{event_id}`, see
            // `Ingest::messages`) go with it, so the key accepted again is delivered anew;
            // a library message keeps its row, which guards its own key.
            let key = format!("{}:{}", r.source, r.event_id);
            deliveries.execute(params![r.source, r.event_id, key])?;
            conflicts.execute(params![r.source, r.event_id])?;
        }
    }
    // Ids follow arrival, so once a whole chunk is younger than the shortest retention (and not
    // dated ahead of now) nothing after it can be due.
    let done =
        rows.len() + unreadable.len() < CHUNK as usize || (all_young && unreadable.is_empty());
    let next = if done { None } else { last };
    Ok(Ok(Chunk { deleted, next }))
}

/// The anchor stored for the machine's boot, if any.
pub(crate) fn stored_anchor(
    c: &Connection,
    clock: &Arc<dyn Clock>,
) -> rusqlite::Result<Option<BootAnchor>> {
    let Some(b) = clock.boot() else {
        return Ok(None);
    };
    Ok(c.query_row(
        "SELECT wall, since FROM oncebox_purge_anchors WHERE boot = ?1",
        [b.id],
        |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)),
    )
    .optional()?
    .map(|(wall, since)| BootAnchor {
        boot: b.id,
        wall: Timestamp(wall),
        since: Duration::from_millis(u64::try_from(since).unwrap_or(0)),
    }))
}

/// The time this purge may use ([`oncebox_core::purge_time`]), from the anchor stored for the
/// machine's boot; records the anchor it says to, and tells the writer (`stamps`). One row per
/// boot of the machine, never dropped: a few bytes a reboot.
pub(crate) fn purge_time(
    c: &Connection,
    clock: &Arc<dyn Clock>,
    now: Timestamp,
    stamps: &Stamps,
) -> rusqlite::Result<Timestamp> {
    // No later than the store's clock (`oncebox_core::purge_time`), for the lag warning too.
    let now = now.min(clock.now());
    let boot = clock.boot();
    let stored = stored_anchor(c, clock)?;
    let (bounded, record) = oncebox_core::purge_time(clock, now, boot, stored);
    stamps.set(record.or(stored));
    if let Some(a) = record {
        let since = i64::try_from(a.since.as_millis()).unwrap_or(i64::MAX);
        c.execute(
            "INSERT OR REPLACE INTO oncebox_purge_anchors (boot, wall, since) VALUES (?1, ?2, ?3)",
            params![a.boot, a.wall.millis(), since],
        )?;
    }
    if let Some(lag) = oncebox_core::purge_lag(now, bounded) {
        let boot = boot.map(|b| b.id);
        tracing::warn!(lag_ms = lag.as_millis(), ?boot, "{PURGE_LAG_ADVICE}");
    }
    Ok(bounded)
}
