//! How far this node's wall clock runs ahead of the database server's: every node dates the
//! records it finishes by its own clock, and a purge on a node whose clock runs ahead would
//! take records for older than they are; a node whose clock is behind would date its records
//! early, for every node's purge. The server's clock is the one all nodes share.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use oncebox_core::{Clock, Timestamp};

/// A difference up to this is taken as the ordinary spread of clocks kept by NTP (and the
/// round trip's own uncertainty), not as a clock set wrong.
pub(crate) const TOLERANCE: Duration = Duration::from_secs(60);

/// One reading of this node's clock against the server's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reading {
    /// This machine's wall clock minus the server's, in ms, at the round trip's midpoint.
    /// Negative when this node's clock is behind.
    pub ahead_ms: i128,
    /// The round trip's length in ms: the reading is off by up to half of it, should the way
    /// there and the way back take different times.
    pub round_trip_ms: i128,
}

/// Readings a measurement takes at most, keeping the one with the shortest round trip; it stops
/// at one whose round trip is short enough to judge leases by.
const READINGS: usize = 3;

/// This machine's wall clock (the system's, not the store's clock, which tests drive far from
/// it: the question is whether the machine's clock is set wrong; a test stands in one set
/// wrong, `Options::machine_clock`) against the server's: the reading of the shortest round
/// trip of up to [`READINGS`].
pub(crate) async fn ahead_of_server(
    conn: &mut sqlx::PgConnection,
    machine: &dyn Clock,
) -> Result<Reading, sqlx::Error> {
    let mut best = read_once(conn, machine).await?;
    for _ in 1..READINGS {
        if judges_leases(&best) {
            break;
        }
        let reading = read_once(conn, machine).await?;
        if reading.round_trip_ms < best.round_trip_ms {
            best = reading;
        }
    }
    Ok(best)
}

/// One round trip's reading.
async fn read_once(
    conn: &mut sqlx::PgConnection,
    machine: &dyn Clock,
) -> Result<Reading, sqlx::Error> {
    let before = i128::from(machine.now().millis());
    let server: i64 =
        sqlx::query_scalar("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint")
            .fetch_one(&mut *conn)
            .await?;
    let after = i128::from(machine.now().millis());
    Ok(Reading {
        ahead_ms: (before + after) / 2 - i128::from(server),
        round_trip_ms: after - before,
    })
}

/// Whether `reading` is sure enough to move leases by: half its round trip, all it can be off
/// by, within [`LEASE_TOLERANCE`]; or a difference past the tolerance even by that much (a
/// node half a minute off, read over a slow path, is still moved, the midpoint the least
/// wrong).
pub(crate) fn judges_leases(reading: &Reading) -> bool {
    let tolerance = i128::try_from(LEASE_TOLERANCE.as_millis()).unwrap_or(i128::MAX);
    // Doubled rather than the round trip halved: 2 001 ms is past it.
    reading.round_trip_ms <= tolerance.saturating_mul(2)
        || reading.ahead_ms.unsigned_abs() > (reading.round_trip_ms / 2 + tolerance).unsigned_abs()
}

/// How often a node that takes leases measures its clock against the server's again.
const REMEASURE: Duration = Duration::from_secs(60);

/// The server's clock as this node reads it, for leases: the relay's claims and records, an
/// operator's `resolve` of one in flight, the two-phase `begin` and `complete`. Each node wrote
/// and judged lease ends by its own clock, so a node ahead of the others took over, that much
/// early, a delivery another node was still sending (and on a route that does not honour
/// the key, sent it again), and a node behind wrote leases that ended early for every other
/// node. Lease ends are now written and judged on the server's clock: a node's `now` less how
/// far its clock is ahead, once that passes [`LEASE_TOLERANCE`] (within it, the spread of
/// clocks NTP keeps and the measurement's own uncertainty, nothing is moved, so a lease's
/// length is exactly what its holder asked). What a holder is told (`Claimed`'s and
/// `Lease`'s ends) stays on its own clock, which it judges its turn by.
pub(crate) struct LeaseClock {
    machine: Arc<dyn Clock>,
    /// How far to move a node's time back to the server's, in ms; zero within the tolerance.
    ahead_ms: AtomicI64,
    /// When it was last measured; `None` before the first.
    measured: Mutex<Option<Instant>>,
    /// The machine clock's wall and monotonic readings when `ahead_ms` was last stored: a step
    /// of the wall clock since (NTP setting it right) shows as the two having moved apart.
    base: Mutex<Option<(Timestamp, Duration)>>,
}

impl LeaseClock {
    pub(crate) fn new(machine: Arc<dyn Clock>) -> LeaseClock {
        LeaseClock {
            machine,
            ahead_ms: AtomicI64::new(0),
            measured: Mutex::new(None),
            base: Mutex::new(None),
        }
    }

    pub(crate) fn machine(&self) -> &dyn Clock {
        self.machine.as_ref()
    }

    /// Takes a measurement ([`ahead_of_server`]); one whose round trip was too long to tell
    /// the clocks apart within [`LEASE_TOLERANCE`] is left out (false), the leases moved as
    /// before: through a path slow one way (seconds, under load or a failing link) the
    /// midpoint moved leases by up to half the round trip.
    pub(crate) fn set(&self, reading: Reading) -> bool {
        *self.measured.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        if !judges_leases(&reading) {
            // The step since the last measurement folded into it, so that the next step is
            // told from this one, and a clock stepped once is not measured again at every
            // call while the server answers slowly.
            let step = self.stepped_ms();
            if step != 0 {
                self.ahead_ms.fetch_add(step, Ordering::Relaxed);
                self.rebase();
            }
            return false;
        }
        let ahead_ms = reading.ahead_ms;
        let moved = lease_skew(ahead_ms).map_or(0, |_| {
            i64::try_from(ahead_ms.clamp(i128::from(i64::MIN), i128::from(i64::MAX))).unwrap_or(0)
        });
        self.ahead_ms.store(moved, Ordering::Relaxed);
        self.rebase();
        true
    }

    /// Notes the machine clock's readings that `ahead_ms` now holds for.
    fn rebase(&self) {
        *self.base.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((self.machine.now(), self.machine.monotonic()));
    }

    /// How far this node's wall clock was stepped since the last measurement, in ms (ahead
    /// positive): its move less the monotonic time that passed, once past
    /// [`LEASE_TOLERANCE`]; else 0. A node set right by NTP after it measured itself a minute
    /// off wrote, until it measured again, leases a minute off the other way: ended before
    /// they began for every other node (which took its deliveries over while it sent them), or
    /// taking theirs over while they still held them.
    fn stepped_ms(&self) -> i64 {
        let Some((wall, mono)) = *self.base.lock().unwrap_or_else(|p| p.into_inner()) else {
            return 0;
        };
        let now = (self.machine.now(), self.machine.monotonic());
        let step = oncebox_core::clock::stepped_ms((wall, mono), now);
        match lease_skew(step) {
            Some(_) => i64::try_from(step).unwrap_or(if step < 0 { i64::MIN } else { i64::MAX }),
            None => 0,
        }
    }

    /// `now`, a time on this node's clock, on the server's: less how far the clock was ahead
    /// when measured, and how far it was stepped since.
    pub(crate) fn server(&self, now: Timestamp) -> Timestamp {
        let ahead = self.ahead_ms.load(Ordering::Relaxed);
        Timestamp(
            now.millis()
                .saturating_sub(ahead.saturating_add(self.stepped_ms())),
        )
    }

    /// Measures again when the last measurement is older than [`REMEASURE`] (clocks drift), or
    /// the clock was stepped since ([`LeaseClock::stepped_ms`]). Called before each
    /// claim, `process`, `begin` and `complete`. A failure keeps the last one.
    /// Called before a connection is taken for the work itself: one held while another is
    /// asked for could wait on a pool that callers like it emptied.
    pub(crate) async fn refresh(&self, pool: &sqlx::PgPool, lost_after: Duration) {
        {
            // Taken by the first caller that finds it stale, so the others go on unmeasured
            // rather than all asking the pool for a connection at once.
            let mut measured = self.measured.lock().unwrap_or_else(|p| p.into_inner());
            // A step of the clock since is measured at once: `server` allows for it meanwhile.
            if measured.is_some_and(|at| at.elapsed() < REMEASURE) && self.stepped_ms() == 0 {
                return;
            }
            *measured = Some(Instant::now());
        }
        let Ok(mut conn) = pool.acquire().await else {
            return;
        };
        let ahead = ahead_of_server(&mut conn, self.machine.as_ref());
        if let Some(Ok(reading)) = crate::silent::within(lost_after, ahead).await {
            let was = self.ahead_ms.load(Ordering::Relaxed);
            if !self.set(reading) {
                warn_of_round_trip(&reading);
                return;
            }
            let ahead = reading.ahead_ms;
            let now = self.ahead_ms.load(Ordering::Relaxed);
            // Said when leases start or stop being moved, or move by more than the tolerance,
            // not at every measurement's jitter.
            let tolerance = i64::try_from(LEASE_TOLERANCE.as_millis()).unwrap_or(i64::MAX);
            if (was == 0) != (now == 0) || now.abs_diff(was) > tolerance.unsigned_abs() {
                if now == 0 {
                    tracing::info!("this node's clock agrees with the database server's again");
                } else {
                    warn_of_lease_skew(ahead);
                }
            }
        }
    }
}

/// Says that a measurement's round trip was too long to move leases by.
fn warn_of_round_trip(reading: &Reading) {
    tracing::warn!(
        round_trip_ms = reading.round_trip_ms,
        "the database server answered too slowly to tell this node's clock from its own within \
         a second: leases stay judged as they were until a measurement answers sooner"
    );
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

/// How far a node's clock may be off the server's before its leases are moved to the server's
/// clock ([`LeaseClock`]). A relay records an attempt up to 5 s before its claim's end (the
/// relay's record margin), so a difference within this one harms no lease. Far below
/// [`TOLERANCE`], which only purges and stamps go by.
pub(crate) const LEASE_TOLERANCE: Duration = Duration::from_secs(1);

/// Whether leases suffer from a node `ahead_ms` ahead of the server (negative: behind), and
/// which way: `Some(true)` ahead, `Some(false)` behind, `None` within [`LEASE_TOLERANCE`].
pub(crate) fn lease_skew(ahead_ms: i128) -> Option<bool> {
    (ahead_ms.unsigned_abs() > LEASE_TOLERANCE.as_millis()).then_some(ahead_ms > 0)
}

/// Says that this node's clock is off the server's past [`LEASE_TOLERANCE`] (at open, and when
/// a later measurement moves leases differently): its leases are judged by the server's clock,
/// but the schedules it writes (when a delivery is due) still go by its own.
pub(crate) fn warn_of_lease_skew(ahead_ms: i128) {
    match lease_skew(ahead_ms) {
        Some(true) => tracing::warn!(
            ahead_ms = ahead_ms,
            "this node's clock is ahead of the database server's: its leases (deliveries in \
             flight, two-phase keys) are judged by the server's clock, but what it schedules \
             is due that much late; set this machine's clock right"
        ),
        Some(false) => tracing::warn!(
            behind_ms = ahead_ms.unsigned_abs(),
            "this node's clock is behind the database server's: its leases (deliveries in \
             flight, two-phase keys) are judged by the server's clock, but what it schedules \
             is due that much early; set this machine's clock right"
        ),
        None => {}
    }
}

/// Measures this node's clock against the server's, has `stamps` date records by the
/// server's when this node's is behind (saying so once it is, and once it is right again), and
/// has `leases` judge leases by the server's ([`LeaseClock`]).
/// Returns the difference, in ms, and whether leases are judged by it (not a reading too slow
/// to tell within [`LEASE_TOLERANCE`]).
pub(crate) async fn observe(
    conn: &mut sqlx::PgConnection,
    stamps: &oncebox_core::Stamps,
    leases: &LeaseClock,
) -> Result<(i128, bool), sqlx::Error> {
    let reading = ahead_of_server(conn, leases.machine()).await?;
    let judged = leases.set(reading);
    if !judged {
        warn_of_round_trip(&reading);
    }
    // Purges and stamps go by a tolerance of a minute: half a round trip of seconds is well
    // within it.
    let ahead = reading.ahead_ms;
    let behind = stamp_correction(ahead);
    let was = stamps.set_behind(behind);
    if !behind.is_zero() && was.is_zero() {
        tracing::warn!(
            behind_ms = behind.as_millis(),
            "this node's clock is behind the database server's: dating the records it \
             finishes by the server's time; set this machine's clock right"
        );
    } else if behind.is_zero() && !was.is_zero() {
        tracing::info!("this node's clock agrees with the database server's again");
    }
    Ok((ahead, judged))
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

    /// A reading whose round trip was long enough to be off by more than the tolerance moves
    /// no lease, and leaves those moved before as they were.
    #[test]
    fn a_reading_of_a_long_round_trip_moves_no_lease() {
        let leases = LeaseClock::new(Arc::new(oncebox_core::SystemClock));
        let at = Timestamp(1_000_000);
        let slow = Reading {
            ahead_ms: 1_500,
            round_trip_ms: 3_000,
        };
        assert!(!leases.set(slow));
        assert_eq!(leases.server(at), at, "not moved by a slow reading");
        let quick = Reading {
            ahead_ms: 1_500,
            round_trip_ms: 40,
        };
        assert!(leases.set(quick));
        assert_eq!(leases.server(at), Timestamp(998_500));
        assert!(!leases.set(Reading {
            ahead_ms: 0,
            round_trip_ms: 2_001,
        }));
        assert_eq!(leases.server(at), Timestamp(998_500), "kept as it was");
        // Off by more than the tolerance even allowing for half the round trip: moved.
        assert!(leases.set(Reading {
            ahead_ms: -30_000,
            round_trip_ms: 3_000,
        }));
        assert_eq!(leases.server(at), Timestamp(1_030_000));
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
