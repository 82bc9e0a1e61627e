//! How long terminal inbox records are kept, and the safety check against purging inside a
//! sender's redelivery horizon.

use std::collections::BTreeMap;
use std::time::Duration;

use std::sync::Arc;

use crate::clock::{Boot, Clock, Timestamp};
use crate::key::Source;

/// Seven days: longer than every common sender's retry window (Stripe retries for three).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// Refused retention settings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RetentionError {
    /// Purging earlier than the sender stops redelivering would turn an old event into a new one.
    #[error(
        "retention of {source_name} ({retention:?}) is shorter than its redelivery horizon ({horizon:?})"
    )]
    ShorterThanHorizon {
        source_name: Source,
        retention: Duration,
        horizon: Duration,
    },
}

/// Retention per source, with a default for sources not named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    default: Duration,
    per_source: BTreeMap<Source, Duration>,
}

impl Default for Retention {
    fn default() -> Retention {
        Retention {
            default: DEFAULT_RETENTION,
            per_source: BTreeMap::new(),
        }
    }
}

impl Retention {
    pub fn new(default: Duration) -> Retention {
        Retention {
            default,
            per_source: BTreeMap::new(),
        }
    }

    /// Sets a source's retention, refusing one shorter than the sender's known redelivery horizon.
    pub fn set(
        &mut self,
        source: Source,
        retention: Duration,
        horizon: Option<Duration>,
    ) -> Result<(), RetentionError> {
        if let Some(horizon) = horizon
            && retention < horizon
        {
            return Err(RetentionError::ShorterThanHorizon {
                source_name: source,
                retention,
                horizon,
            });
        }
        self.per_source.insert(source, retention);
        Ok(())
    }

    pub fn for_source(&self, source: &Source) -> Duration {
        self.per_source.get(source).copied().unwrap_or(self.default)
    }

    pub fn default_retention(&self) -> Duration {
        self.default
    }

    /// Sources with their own retention, for backends that purge source by source.
    pub fn overrides(&self) -> impl Iterator<Item = (&Source, Duration)> {
        self.per_source.iter().map(|(s, d)| (s, *d))
    }

    /// Terminal records of `source` finished before this instant may be purged.
    pub fn cutoff(&self, source: &Source, now: Timestamp) -> Timestamp {
        now.minus(self.for_source(source))
    }

    /// The shortest retention of any source: a record received after `now` minus this is too
    /// young for every source, which lets a purge scanning in arrival order stop early.
    pub fn shortest(&self) -> Duration {
        self.overrides()
            .map(|(_, d)| d)
            .fold(self.default, Duration::min)
    }

    /// Whether a stored record may be deleted now: only terminal records (`completed`,
    /// `rejected`, `stale`) finished before their source's cutoff. A `processing` or
    /// `uncertain` key is still owed an outcome and is never purged. A source name that no
    /// longer validates still gets the default retention.
    pub fn purgeable(
        &self,
        source: &str,
        state: &str,
        completed_at: Option<Timestamp>,
        now: Timestamp,
    ) -> bool {
        let Some(completed_at) = completed_at else {
            return false;
        };
        if crate::outcome::ResponseKind::parse(state).is_none() {
            return false;
        }
        let cutoff = match Source::new(source) {
            Ok(s) => self.cutoff(&s, now),
            Err(_) => now.minus(self.default),
        };
        completed_at < cutoff
    }
}

/// Where a clock stood when it was anchored (a store's first open or purge with it): its wall
/// time then and its monotonic time then.
///
/// A purge never takes `now` further than real time allows: a purge's instant is the wall
/// clock, bounded by the anchor's wall time plus the monotonic time elapsed since. A wall clock
/// that jumps forward therefore ages no record faster than real time (purging later, never
/// earlier); one that jumps back is followed (purging less), and coming back to the present
/// after such a jump leaves no lag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PurgeAnchor {
    wall: Timestamp,
    monotonic: Duration,
}

impl PurgeAnchor {
    pub fn new(wall: Timestamp, monotonic: Duration) -> PurgeAnchor {
        PurgeAnchor { wall, monotonic }
    }

    /// The instant a purge at wall time `now` and monotonic time `monotonic` may use for `now`.
    pub fn bound(&self, now: Timestamp, monotonic: Duration) -> Timestamp {
        now.min(self.wall.plus(monotonic.saturating_sub(self.monotonic)))
    }
}

/// A store's record of a boot of the machine ([`Boot`]), taken at the store's first open or
/// purge on that boot: any purge on that boot, in whichever process, treats as now no later
/// than its wall time plus the time the boot has run since. A wall clock that jumps ahead,
/// then a restart, thus purges no record inside its window; only the first open or purge
/// after a reboot trusts the wall clock alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BootAnchor {
    pub boot: i64,
    pub wall: Timestamp,
    pub since: Duration,
}

/// The time a purge at wall time `now` on `boot` may use, given the store's anchor for that
/// boot, and the anchor to record when there is none (or it cannot be this boot's: its time
/// since boot is ahead of the clock's).
pub fn boot_bound(
    stored: Option<BootAnchor>,
    now: Timestamp,
    boot: Boot,
) -> (Timestamp, Option<BootAnchor>) {
    match stored {
        Some(a) if a.boot == boot.id && a.since <= boot.since => (
            PurgeAnchor::new(a.wall, a.since).bound(now, boot.since),
            None,
        ),
        _ => {
            let anchor = BootAnchor {
                boot: boot.id,
                wall: now,
                since: boot.since,
            };
            (now, Some(anchor))
        }
    }
}

/// The time a purge at wall time `now` may use, given the machine's `boot` and the store's
/// anchor for it (`stored`), and the anchor the store is to record for that boot, if any:
/// `now` bounded by the boot's anchor plus the boot time since ([`boot_bound`]), or, where the
/// boot is not known (not Linux, or a read that failed), by this process's first purge plus
/// its monotonic time since ([`crate::purge_now`], kept up by every purge).
///
/// Where the boot is known its anchor alone bounds: it binds every process on that boot, so a
/// process's own anchor would add nothing but a lag the operator released by deleting the row,
/// and the time a suspended machine slept (its monotonic clock stops; boot time does not).
///
/// Nothing the clock says of itself moves an anchor: the kernel marks a clock set by hand
/// synchronised again as soon as its NTP daemon has a source, while it may still be far off.
/// So a clock that was behind when the boot was anchored holds purges back by as much for the
/// whole boot; the stores warn of it past [`PURGE_LAG_WARNING`].
pub fn purge_time(
    clock: &Arc<dyn Clock>,
    now: Timestamp,
    boot: Option<Boot>,
    stored: Option<BootAnchor>,
) -> (Timestamp, Option<BootAnchor>) {
    // No later than the store's clock: a future `now` deleted records inside their senders'
    // window, and anchored the boot there, dating later records out of every purge's reach.
    let now = now.min(clock.now());
    // Kept from the first purge on, so that a purge that cannot read the boot (a failed read
    // mid-life) is still bounded by this process's own history.
    let process = crate::purge_now(clock, now);
    match boot {
        Some(b) => boot_bound(stored, now, b),
        None => (process, None),
    }
}

/// The earliest a record finished now may be dated, where the store keeps an anchor for this
/// boot: its wall time plus the boot time since. A purge treats as now no later than that same
/// time ([`boot_bound`]), so a record dated no earlier ages, as a purge sees it, by the real
/// time that passed. Dated by a wall clock that stepped back (a reset clock, a bad time
/// source) and later set right, it would look as old as the step, and a purge would delete it
/// while its sender may still send the event again. `None`: no anchor for this boot yet.
///
/// Less [`FLOOR_ROUNDING`]: the anchor's boot time is kept in whole milliseconds, cut short by
/// up to one, and the record's own time is cut to one too, so the floor could run a
/// millisecond ahead of the wall clock it stands for and date a record after the answer that
/// acknowledged it (the fault tier's P figure caught it, 1 ms late, in two scenarios of one
/// run). A record dated by the floor is thus up to that much earlier than real time.
pub fn stamp_floor(anchor: Option<BootAnchor>, boot: Option<Boot>) -> Option<Timestamp> {
    let (a, b) = (anchor?, boot?);
    (a.boot == b.id && a.since <= b.since).then(|| {
        let floor = a.wall.plus(b.since - a.since);
        let rounding = i64::try_from(FLOOR_ROUNDING.as_millis()).unwrap_or(0);
        Timestamp(floor.0.saturating_sub(rounding))
    })
}

/// How far [`stamp_floor`] is held back for the rounding of its parts to milliseconds.
pub const FLOOR_ROUNDING: Duration = Duration::from_millis(2);

/// A store's boot anchor as it last read or wrote it (at open, and at each purge), and what it
/// dates a finished record by ([`stamp_floor`]); clones share it. Where the store can tell that
/// this machine's clock is behind the one its nodes share (PostgreSQL: the server's), it also
/// keeps how far, and dates records by the shared clock instead.
#[derive(Debug, Clone, Default)]
pub struct Stamps(Arc<std::sync::Mutex<StampState>>);

#[derive(Debug, Clone, Copy, Default)]
struct StampState {
    anchor: Option<BootAnchor>,
    behind: Duration,
}

impl Stamps {
    fn state(&self) -> std::sync::MutexGuard<'_, StampState> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn set(&self, anchor: Option<BootAnchor>) {
        self.state().anchor = anchor;
    }

    /// This machine's clock is `behind` the clock the store's nodes share (zero: not, or
    /// within what the store tolerates): a record finished here is dated that much later, as
    /// the shared clock would date it, rather than early for every node's purge. Returns the
    /// lag it replaces.
    pub fn set_behind(&self, behind: Duration) -> Duration {
        std::mem::replace(&mut self.state().behind, behind)
    }

    /// The date of a record finished at `now` on `clock`: `now` (plus how far this machine's
    /// clock is behind, [`Stamps::set_behind`]), never earlier than the anchor says real time
    /// is.
    pub fn completed(&self, clock: &dyn Clock, now: Timestamp) -> Timestamp {
        let StampState { anchor, behind } = *self.state();
        let now = now.plus(behind);
        stamp_floor(anchor, clock.boot()).map_or(now, |floor| now.max(floor))
    }
}

/// How far a purge's time may trail the wall clock before the store warns that purges are
/// held back (a clock behind when the boot was anchored, or one that jumped ahead since).
pub const PURGE_LAG_WARNING: Duration = Duration::from_secs(24 * 3600);

/// What a store logs when [`purge_lag`] says purges are held back.
pub const PURGE_LAG_ADVICE: &str = "purges are held behind the wall clock: the clock was behind \
    when this boot was anchored (the store's first open on it), or jumped ahead since, and records are kept that much longer; \
    records finished on this boot while the clock was behind are dated that much early, and \
    once purges follow the clock again (this boot's row deleted from oncebox_purge_anchors, or \
    the next boot) they can be purged that much early; if the clock is right now, delete this \
    boot's row (the boot logged here) only once the longest retention has passed since it was \
    set right, and the next purge anchors at the clock";

/// How far a purge's time `bounded` trails the wall clock `now`, if by more than
/// [`PURGE_LAG_WARNING`].
pub fn purge_lag(now: Timestamp, bounded: Timestamp) -> Option<Duration> {
    let lag = Duration::from_millis(u64::try_from(now.0.saturating_sub(bounded.0)).unwrap_or(0));
    (lag > PURGE_LAG_WARNING).then_some(lag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_shorter_than_horizon_is_refused() {
        let mut r = Retention::default();
        let stripe = Source::new("stripe").unwrap();
        let three_days = Duration::from_secs(3 * 24 * 3600);
        let err = r
            .set(stripe.clone(), Duration::from_secs(3600), Some(three_days))
            .unwrap_err();
        assert!(matches!(err, RetentionError::ShorterThanHorizon { .. }));
        assert_eq!(
            r.for_source(&stripe),
            DEFAULT_RETENTION,
            "refused setting left no trace"
        );
        r.set(stripe.clone(), three_days, Some(three_days)).unwrap();
        assert_eq!(r.for_source(&stripe), three_days);
    }

    #[test]
    fn purge_anchor_follows_real_time_through_jumps() {
        let day = Duration::from_secs(24 * 3600);
        let one = Duration::from_secs(1);
        let a = PurgeAnchor::new(Timestamp(0), Duration::ZERO);
        // Time passing: the wall clock is used as it is.
        let t = Timestamp(0).plus(day);
        assert_eq!(a.bound(t, day), t);
        // A forward jump of 70 days with one real second: one second further, no more.
        assert_eq!(a.bound(t.plus(day * 70), day + one), t.plus(one));
        // A backward jump is followed at once.
        assert_eq!(a.bound(Timestamp(5), day + one), Timestamp(5));
        // Back to the present after it: no lag.
        assert_eq!(a.bound(t.plus(one * 2), day + one * 2), t.plus(one * 2));
        // A monotonic source behind the anchor (never should be) bounds at the anchor.
        assert_eq!(a.bound(t, Duration::ZERO), Timestamp(0));
    }

    #[test]
    fn cutoff_saturates_instead_of_overflowing() {
        let r = Retention::new(Duration::from_secs(u64::MAX));
        let s = Source::new("a").unwrap();
        assert_eq!(r.cutoff(&s, Timestamp(0)), Timestamp(i64::MIN));
        assert_eq!(r.cutoff(&s, Timestamp(i64::MAX)), Timestamp(i64::MIN));
    }

    #[test]
    fn boot_anchors_hold_purges_to_the_boot_time_passed() {
        let day = Duration::from_secs(24 * 3600);
        let boot = |since| Boot { id: 7, since };
        // No anchor yet: the wall clock is trusted, and becomes the anchor.
        let (now, record) = boot_bound(None, Timestamp(1_000), boot(day));
        let anchor = record.unwrap();
        assert_eq!(
            (now, anchor.wall, anchor.since),
            (Timestamp(1_000), Timestamp(1_000), day)
        );
        // Same boot, one real hour later, the wall clock ten days ahead: an hour counts.
        let hour = Duration::from_secs(3600);
        let jumped = Timestamp(1_000).plus(day * 10);
        let (now, record) = boot_bound(Some(anchor), jumped, boot(day + hour));
        assert_eq!((now, record), (Timestamp(1_000).plus(hour), None));
        // Behind is taken as is: purging less is safe.
        assert_eq!(
            boot_bound(Some(anchor), Timestamp(5), boot(day + hour)),
            (Timestamp(5), None)
        );
        // Another boot, or one younger than the anchor's: a new anchor, the wall clock as is.
        for other in [
            Boot {
                id: 8,
                since: day * 2,
            },
            boot(hour),
        ] {
            let (now, record) = boot_bound(Some(anchor), jumped, other);
            assert_eq!(now, jumped);
            assert_eq!(
                record.map(|a| (a.boot, a.since)),
                Some((other.id, other.since))
            );
        }
    }

    #[test]
    fn a_purge_held_back_more_than_a_day_is_reported() {
        let now = Timestamp(10 * 24 * 3_600_000);
        assert_eq!(purge_lag(now, now), None);
        assert_eq!(purge_lag(now, now.minus(PURGE_LAG_WARNING)), None);
        let held = now.minus(PURGE_LAG_WARNING * 2);
        assert_eq!(purge_lag(now, held), Some(PURGE_LAG_WARNING * 2));
        assert_eq!(purge_lag(held, now), None, "ahead is not held back");
    }

    /// A process that purged with its boot known, then once could not read it, after the wall
    /// clock jumped ahead: that purge is still held to the process's first purge plus the time
    /// since, not to the jumped clock.
    #[test]
    fn a_purge_that_loses_the_boot_is_held_to_the_process_history() {
        let manual = crate::ManualClock::new(Timestamp(1_000));
        let clock: Arc<dyn Clock> = Arc::new(manual.clone());
        let b = Boot {
            id: 3,
            since: Duration::from_secs(60),
        };
        let (first, record) = purge_time(&clock, manual.now(), Some(b), None);
        assert_eq!(first, Timestamp(1_000));
        let stored = record.expect("the boot is anchored");
        manual.advance(Duration::from_millis(5));
        manual.set(Timestamp(1_000).plus(Duration::from_secs(30 * 24 * 3600)));
        let later = Boot {
            since: b.since + Duration::from_millis(5),
            ..b
        };
        let held = Timestamp(1_005);
        assert_eq!(
            purge_time(&clock, manual.now(), Some(later), Some(stored)),
            (held, None)
        );
        assert_eq!(purge_time(&clock, manual.now(), None, None), (held, None));
    }
}
