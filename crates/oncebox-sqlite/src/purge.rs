//! Retention: deletes terminal inbox records older than their source's retention, a chunk per
//! writer request so a large purge never stalls ingest.

use std::sync::Arc;
use std::time::Duration;

use oncebox_core::{BootAnchor, Clock, PURGE_LAG_ADVICE, Retention, Timestamp};
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

/// Scans records in arrival (id) order after `after`. Only `completed`, `rejected` and `stale`
/// records are ever deleted: a `processing` or `uncertain` key is still owed an outcome.
pub(crate) fn chunk(
    cx: &mut Cx<'_, '_>,
    after: i64,
    now: Timestamp,
    retention: &Retention,
) -> Result<Result<Chunk, crate::Error>, Fatal> {
    let rows: Vec<(i64, String, String, Option<i64>, i64)> = cx
        .conn
        .prepare_cached(
            "SELECT id, source, state, completed_at, received_at FROM oncebox_inbox
             WHERE id > ?1 ORDER BY id LIMIT ?2",
        )?
        .query_map(params![after, CHUNK], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })?
        .collect::<Result<_, _>>()?;
    let youngest_cutoff = now.minus(retention.shortest()).millis();
    let mut deleted = 0;
    let mut all_young = true;
    let mut delete = cx
        .conn
        .prepare_cached("DELETE FROM oncebox_inbox WHERE id = ?1")?;
    for (id, source, state, completed_at, received_at) in &rows {
        all_young &= *received_at >= youngest_cutoff;
        if retention.purgeable(source, state, completed_at.map(Timestamp), now) {
            deleted += delete.execute([id])? as u64;
        }
    }
    // Ids follow arrival, so once a whole chunk is younger than the shortest retention nothing
    // after it can be due. A backwards clock jump can only make this stop early: purging less.
    let done = rows.len() < CHUNK as usize || all_young;
    let next = if done { None } else { rows.last().map(|r| r.0) };
    Ok(Ok(Chunk { deleted, next }))
}

/// The time this purge may use ([`oncebox_core::purge_time`]), from the anchor stored for the
/// machine's boot; records the anchor it says to. One row per boot of the machine, never
/// dropped: a few bytes a reboot.
pub(crate) fn purge_time(
    c: &Connection,
    clock: &Arc<dyn Clock>,
    now: Timestamp,
) -> rusqlite::Result<Timestamp> {
    let boot = clock.boot();
    let stored = match boot {
        Some(b) => c
            .query_row(
                "SELECT wall, since FROM oncebox_purge_anchors WHERE boot = ?1",
                [b.id],
                |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)),
            )
            .optional()?
            .map(|(wall, since)| BootAnchor {
                boot: b.id,
                wall: Timestamp(wall),
                since: Duration::from_millis(u64::try_from(since).unwrap_or(0)),
            }),
        None => None,
    };
    let (bounded, record) = oncebox_core::purge_time(clock, now, boot, stored);
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
