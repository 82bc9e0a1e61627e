//! A route's pace (`Route::rate`): its requests go out one per interval, never two closer, and
//! the relay claims for it no more than the near future's slots.
//!
//! Written here rather than taken from a rate-limiting crate: those answer whether one request
//! may go now, while the relay must know before it claims how many may go soon. A claim holds
//! its rows under a lease, so claiming what must then wait long only moves the wait under the
//! lease, and past it the claims are given back unsent.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use oncebox_core::route::Rate;
use tokio::time::Instant;

/// How far ahead a claim looks: the requests whose slots fall within it are claimed together,
/// each sent at its slot.
pub(super) const AHEAD: Duration = Duration::from_millis(100);

/// One route's pace.
#[derive(Debug)]
pub(super) struct Pace {
    interval: Duration,
    slots: Mutex<Slots>,
}

#[derive(Debug)]
struct Slots {
    /// The earliest a next request may go: one interval after the last one. In the past when
    /// the route was idle: an idle route banks no slots, so no burst follows a pause.
    next: Instant,
    /// Claims in hand that have neither taken their slot nor given up on it: the slots soon
    /// free are theirs first.
    promised: usize,
}

impl Pace {
    pub(super) fn new(rate: Rate) -> Pace {
        Pace {
            // At most a century (as configuration allows): a library caller's rate of one per
            // `Duration::MAX` would overflow the `Instant` of the next slot.
            interval: rate
                .interval()
                .clamp(Duration::from_nanos(1), super::CENTURY),
            slots: Mutex::new(Slots {
                next: Instant::now(),
                promised: 0,
            }),
        }
    }

    fn slots(&self) -> MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many more requests the route may claim now: the slots within [`AHEAD`] of `now`
    /// not promised to claims in hand. `Err` when there are none, with how long until one
    /// of them comes within reach.
    pub(super) fn room(&self, now: Instant) -> Result<usize, Duration> {
        let s = self.slots();
        let first = s.next.max(now);
        let horizon = now + AHEAD;
        let reach = horizon.saturating_duration_since(first);
        let slots = usize::try_from(reach.as_nanos() / self.interval.as_nanos())
            .map_or(usize::MAX, |n| {
                n.saturating_add(usize::from(first <= horizon))
            });
        match slots.checked_sub(s.promised) {
            Some(room) if room > 0 => Ok(room),
            _ => {
                let ahead = self.interval.saturating_mul(saturate(s.promised));
                Err(first
                    .checked_add(ahead)
                    .map_or(ahead, |free_at| free_at.saturating_duration_since(horizon))
                    .max(Duration::from_millis(1)))
            }
        }
    }

    /// Counts a claim in hand for the route: it takes a slot, or gives its promise back.
    pub(super) fn promise(&self) -> Promise<'_> {
        self.slots().promised += 1;
        Promise {
            pace: self,
            kept: false,
        }
    }
}

/// A claim's place in its route's pace, given back when dropped untaken (the claim was given
/// back, found expired, or the relay stopped).
#[derive(Debug)]
pub(super) struct Promise<'p> {
    pace: &'p Pace,
    kept: bool,
}

impl Promise<'_> {
    /// Takes the next slot: now, or as soon as one is free. `Err` with the wait when the slot
    /// is not free yet; the caller waits that long and asks again (other claims may take the
    /// slot meanwhile).
    pub(super) fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let mut s = self.pace.slots();
        if s.next > now {
            return Err(s.next - now);
        }
        s.next = now + self.pace.interval;
        s.promised = s.promised.saturating_sub(1);
        self.kept = true;
        Ok(())
    }
}

impl Drop for Promise<'_> {
    fn drop(&mut self) {
        if !self.kept {
            let mut s = self.pace.slots();
            s.promised = s.promised.saturating_sub(1);
        }
    }
}

fn saturate(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pace(requests: u32) -> Pace {
        Pace::new(Rate {
            requests,
            per: Duration::from_secs(1),
        })
    }

    #[test]
    fn an_idle_route_may_claim_the_slots_of_the_next_100_ms() {
        let p = pace(50);
        // 20 ms apart: now, 20, 40, 60, 80 and 100 ms.
        assert_eq!(p.room(Instant::now()), Ok(6));
        // Slower than one per 100 ms: one at a time.
        assert_eq!(pace(1).room(Instant::now()), Ok(1));
    }

    #[test]
    fn promised_slots_are_not_offered_again_and_come_back_when_dropped() {
        let p = pace(50);
        let now = Instant::now();
        let promises: Vec<_> = (0..6).map(|_| p.promise()).collect();
        // Six promised: the seventh slot is at 120 ms, 20 ms past reach.
        assert_eq!(p.room(now), Err(Duration::from_millis(20)));
        drop(promises);
        assert_eq!(p.room(now), Ok(6));
    }

    #[test]
    fn slots_are_taken_one_interval_apart_and_an_idle_pause_banks_none() {
        let p = pace(10);
        let start = Instant::now();
        let mut first = p.promise();
        let mut second = p.promise();
        assert_eq!(first.take(start), Ok(()));
        assert_eq!(second.take(start), Err(Duration::from_millis(100)));
        assert_eq!(
            second.take(start + Duration::from_millis(60)),
            Err(Duration::from_millis(40))
        );
        assert_eq!(second.take(start + Duration::from_millis(100)), Ok(()));
        // Both taken: nothing is promised any more.
        drop((first, second));
        let later = start + Duration::from_secs(10);
        assert_eq!(p.room(later), Ok(2));
        let mut a = p.promise();
        let mut b = p.promise();
        assert_eq!(a.take(later), Ok(()));
        assert!(b.take(later).is_err(), "ten idle seconds banked a burst");
    }
}
