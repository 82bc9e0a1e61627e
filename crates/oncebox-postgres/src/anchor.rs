//! This node's boot anchor (`oncebox_purge_anchors`): recorded when the store opens and at each
//! purge if the boot has none, it bounds the time a purge may use and dates finished records.

use std::sync::Arc;
use std::time::Duration;

use oncebox_core::{BootAnchor, Clock, PURGE_LAG_ADVICE, Stamps, Timestamp};

/// The time a purge at `now` may use ([`oncebox_core::purge_time`]), from the anchor stored for
/// this node's boot, and no later than the server's clock says (`ahead`, in ms, from
/// [`crate::skew::observe`]); records the anchor it says to (two processes doing so at once on
/// one boot: the last one's stays) and tells `stamps`. One row per boot of each node, never
/// dropped.
///
/// Called at open as well as by every purge: records finished before the boot's first purge
/// were dated by the bare wall clock, and a clock behind at open, then set right, made the
/// purge that anchored at the right time delete them inside their senders' window.
pub(crate) async fn purge_time(
    conn: &mut sqlx::PgConnection,
    clock: &Arc<dyn Clock>,
    stamps: &Stamps,
    now: Timestamp,
    ahead: i128,
) -> Result<Timestamp, sqlx::Error> {
    // No later than the store's clock (`oncebox_core::purge_time`), for the lag warning too.
    let now = now.min(clock.now());
    let boot = clock.boot();
    let stored = stored(conn, clock.as_ref()).await?;
    let (mut bounded, mut record) = oncebox_core::purge_time(clock, now, boot, stored);
    // A node whose clock runs ahead of the server's (set wrong at boot, which the boot's
    // anchor cannot tell) purges by the server's time instead, and anchors nothing: an
    // anchor taken from that clock would date this boot's records ahead for its whole life.
    if let Some(ahead) = crate::skew::purge_correction(ahead) {
        tracing::warn!(
            ahead_ms = ahead.as_millis(),
            "this node's clock is ahead of the database server's: purging by the server's \
             time; set this machine's clock right"
        );
        bounded = bounded.min(now.minus(ahead));
        record = None;
    }
    stamps.set(record.or(stored));
    if let Some(a) = record {
        // Read committed whatever the database's default: two processes anchoring one boot
        // at once (nodes opening together) under repeatable read failed the second with
        // 40001, and its open with it.
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO oncebox_purge_anchors (boot, wall, since) VALUES ($1, $2, $3)
             ON CONFLICT (boot) DO UPDATE SET wall = excluded.wall, since = excluded.since",
        )
        .bind(a.boot)
        .bind(a.wall.millis())
        .bind(i64::try_from(a.since.as_millis()).unwrap_or(i64::MAX))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
    }
    if let Some(lag) = oncebox_core::purge_lag(now, bounded) {
        let boot = boot.map(|b| b.id);
        tracing::warn!(lag_ms = lag.as_millis(), ?boot, "{PURGE_LAG_ADVICE}");
    }
    Ok(bounded)
}

/// Whether `e` is the server refusing a write: a standby, or a role whose transactions are
/// read-only (SQLSTATE 25006).
pub(crate) fn read_only(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|code| code == "25006")
}

/// The anchor stored for the boot `clock` runs on, if any.
pub(crate) async fn stored(
    conn: &mut sqlx::PgConnection,
    clock: &dyn Clock,
) -> Result<Option<BootAnchor>, sqlx::Error> {
    let Some(b) = clock.boot() else {
        return Ok(None);
    };
    let row: Option<(i64, i64)> =
        sqlx::query_as("SELECT wall, since FROM oncebox_purge_anchors WHERE boot = $1")
            .bind(b.id)
            .fetch_optional(&mut *conn)
            .await?;
    Ok(row.map(|(wall, since)| BootAnchor {
        boot: b.id,
        wall: Timestamp(wall),
        since: Duration::from_millis(u64::try_from(since).unwrap_or(0)),
    }))
}
