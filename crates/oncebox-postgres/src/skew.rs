//! How far this node's wall clock runs ahead of the database server's: every node dates the
//! records it finishes by its own clock, and a purge on a node whose clock runs ahead would
//! take records for older than they are; a node whose clock is behind would date its records
//! early, for every node's purge. The server's clock is the one all nodes share.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A difference up to this is taken as the ordinary spread of clocks kept by NTP (and the
/// round trip's own uncertainty), not as a clock set wrong.
pub(crate) const TOLERANCE: Duration = Duration::from_secs(60);

fn system_ms() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i128::try_from(d.as_millis()).unwrap_or(i128::MAX))
}

/// This process's wall clock (the system's, not an injected one: tests drive those, and the
/// question is whether the machine's clock is set wrong) minus the server's, in ms, read at the
/// round trip's midpoint. Negative when this node's clock is behind.
pub(crate) async fn ahead_of_server(conn: &mut sqlx::PgConnection) -> Result<i128, sqlx::Error> {
    let before = system_ms();
    let server: i64 =
        sqlx::query_scalar("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint")
            .fetch_one(conn)
            .await?;
    let after = system_ms();
    Ok((before + after) / 2 - i128::from(server))
}

/// How much a purge's time must be moved back so that it runs by the server's clock: the
/// whole difference when this node is ahead by more than [`TOLERANCE`], else nothing.
pub(crate) fn purge_correction(ahead_ms: i128) -> Option<Duration> {
    let ms = u64::try_from(ahead_ms.clamp(0, i128::from(u64::MAX))).unwrap_or(u64::MAX);
    let ahead = Duration::from_millis(ms);
    (ahead > TOLERANCE).then_some(ahead)
}

/// How much later than its own clock says this node must date the records it finishes so that
/// they are dated by the server's clock: the whole difference when this node is behind by more
/// than [`TOLERANCE`], else nothing.
pub(crate) fn stamp_correction(ahead_ms: i128) -> Duration {
    purge_correction(ahead_ms.saturating_neg()).unwrap_or_default()
}

/// How far a node's clock may be off the server's before its leases are said to suffer. Leases
/// end by each node's own clock, and a relay records an attempt up to 5 s before its claim's
/// end (the relay's record margin): a node ahead by more takes over a delivery another node
/// may still be sending, and on a route that does not honour the key, asks its status URL and
/// sends it again. Far below [`TOLERANCE`], which only purges and stamps go by.
pub(crate) const LEASE_TOLERANCE: Duration = Duration::from_secs(1);

/// Whether leases suffer from a node `ahead_ms` ahead of the server (negative: behind), and
/// which way: `Some(true)` ahead, `Some(false)` behind, `None` within [`LEASE_TOLERANCE`].
pub(crate) fn lease_skew(ahead_ms: i128) -> Option<bool> {
    (ahead_ms.unsigned_abs() > LEASE_TOLERANCE.as_millis()).then_some(ahead_ms > 0)
}

/// Says at open that this node's clock is off the server's past [`LEASE_TOLERANCE`]: leases
/// (a relay's claims, a two-phase `begin`) end by each node's own clock, so one ahead takes
/// over what other nodes still hold, that much early. One behind past [`TOLERANCE`] was said
/// already, by [`observe`].
pub(crate) fn warn_of_lease_skew(ahead_ms: i128) {
    match lease_skew(ahead_ms) {
        Some(true) => tracing::warn!(
            ahead_ms = ahead_ms,
            "this node's clock is ahead of the database server's: it takes leases other \
             nodes still hold (deliveries in flight, two-phase keys) over that much early, and \
             past 5 s a delivery another node is still sending; set this machine's clock right"
        ),
        Some(false) if stamp_correction(ahead_ms).is_zero() => tracing::warn!(
            behind_ms = ahead_ms.unsigned_abs(),
            "this node's clock is behind the database server's: the leases it takes \
             (deliveries it sends, two-phase keys) end that much early for other nodes, which \
             may take them over while this node still holds them; set this machine's clock \
             right"
        ),
        _ => {}
    }
}

/// Measures this node's clock against the server's and has `stamps` date records by the
/// server's when this node's is behind (saying so once it is, and once it is right again).
/// Its leases are not moved: each node judges a lease by its own clock, so a lease written
/// later than this node's clock says would be held by this node past the time other nodes
/// see it end. The warning says so instead.
/// Returns the difference, in ms, as [`ahead_of_server`] does.
pub(crate) async fn observe(
    conn: &mut sqlx::PgConnection,
    stamps: &oncebox_core::Stamps,
) -> Result<i128, sqlx::Error> {
    let ahead = ahead_of_server(conn).await?;
    let behind = stamp_correction(ahead);
    let was = stamps.set_behind(behind);
    if !behind.is_zero() && was.is_zero() {
        tracing::warn!(
            behind_ms = behind.as_millis(),
            "this node's clock is behind the database server's: dating the records it \
             finishes by the server's time, but the leases it takes (deliveries it sends, \
             two-phase keys) end that much early for other nodes, which may take them over \
             while this node still holds them; set this machine's clock right"
        );
    } else if behind.is_zero() && !was.is_zero() {
        tracing::info!("this node's clock agrees with the database server's again");
    }
    Ok(ahead)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_are_said_to_suffer_past_a_second_either_way() {
        assert_eq!(lease_skew(0), None);
        assert_eq!(lease_skew(1_000), None);
        assert_eq!(lease_skew(-1_000), None);
        assert_eq!(lease_skew(1_001), Some(true));
        assert_eq!(lease_skew(-20_000), Some(false));
        assert_eq!(lease_skew(i128::MIN), Some(false));
    }

    #[test]
    fn only_a_difference_past_the_tolerance_moves_a_purge_or_a_stamp() {
        assert_eq!(purge_correction(-86_400_000), None);
        assert_eq!(purge_correction(0), None);
        assert_eq!(purge_correction(60_000), None);
        assert_eq!(
            purge_correction(60_001),
            Some(Duration::from_millis(60_001))
        );
        assert_eq!(
            purge_correction(i128::MAX),
            Some(Duration::from_millis(u64::MAX))
        );
    }
}
