//! Claims failing round after round (the store unreachable, its disk full): the loop polled
//! again every `idle_poll` (10 ms) and logged each failure, about 80 warnings a second per relay
//! for as long as the outage lasted. It now waits longer after each failed round, up to
//! [`LONGEST_PAUSE`], says so at most once per [`SAY_EVERY`], and says when claims work again.

use std::time::{Duration, Instant};

use oncebox_core::Unavailable;
use oncebox_core::relay_store::Claimed;

/// The longest pause between failed claims: an outage's end is noticed within it.
pub(super) const LONGEST_PAUSE: Duration = Duration::from_secs(1);
/// How often a lasting outage is said again.
pub(super) const SAY_EVERY: Duration = Duration::from_secs(60);

/// Claims failed in a row, and when that was last said; and when a claim that failed beside
/// others that worked (a split claim's) was last said.
#[derive(Debug, Default)]
pub(super) struct Outage {
    rounds: u32,
    said: Option<Instant>,
    partly_said: Option<Instant>,
}

impl Outage {
    /// A claim's answer: its claims, or none after a failure, which is counted (and said, the
    /// first time and then once per [`SAY_EVERY`]).
    pub(super) fn read(&mut self, answer: Result<Vec<Claimed>, Unavailable>) -> Vec<Claimed> {
        match answer {
            Ok(claimed) => {
                if self.rounds > 0 {
                    tracing::info!(failed_rounds = self.rounds, "relay: claims work again");
                }
                (self.rounds, self.said) = (0, None);
                claimed
            }
            Err(e) => {
                self.rounds = self.rounds.saturating_add(1);
                if self.said.is_none_or(|at| at.elapsed() >= SAY_EVERY) {
                    tracing::warn!(
                        error = %e,
                        failed_rounds = self.rounds,
                        "relay round failed; claiming again after growing pauses (at most 1 s)"
                    );
                    self.said = Some(Instant::now());
                }
                Vec::new()
            }
        }
    }

    /// A claim that failed beside others that brought claims: said as a failed round is, at
    /// most once per [`SAY_EVERY`], since such rounds follow each other as fast as sends end.
    pub(super) fn partly(&mut self, e: &Unavailable) {
        if self.partly_said.is_none_or(|at| at.elapsed() >= SAY_EVERY) {
            tracing::warn!(error = %e, "a claim failed beside others that worked");
            self.partly_said = Some(Instant::now());
        }
    }

    /// The pause before the next claim when nothing else calls for one sooner: `idle` while
    /// claims work, doubling from it with each failed round (from 10 ms when `idle` is
    /// shorter) up to [`LONGEST_PAUSE`].
    pub(super) fn pause(&self, idle: Duration) -> Duration {
        if self.rounds == 0 {
            return idle;
        }
        let first = idle.max(Duration::from_millis(10));
        let doublings = self.rounds.saturating_sub(1).min(16);
        first
            .saturating_mul(1 << doublings)
            .min(LONGEST_PAUSE)
            .max(idle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_grow_while_claims_fail_and_end_with_the_first_that_works() {
        let idle = Duration::from_millis(10);
        let mut outage = Outage::default();
        assert_eq!(outage.pause(idle), idle);
        let mut pauses = Vec::new();
        for _ in 0..10 {
            assert!(outage.read(Err(Unavailable::Busy)).is_empty());
            pauses.push(outage.pause(idle).as_millis());
        }
        assert_eq!(pauses, [10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000]);
        assert_eq!(outage.rounds, 10);
        // Said once, not at each of the ten rounds.
        let said = outage.said;
        assert!(said.is_some());
        outage.read(Err(Unavailable::Busy));
        assert_eq!(outage.said, said, "not said again within a minute");
        assert!(outage.read(Ok(Vec::new())).is_empty());
        assert_eq!(outage.rounds, 0);
        assert_eq!(outage.pause(idle), idle);
        // A poll longer than the longest pause is kept.
        let slow = Duration::from_secs(5);
        outage.read(Err(Unavailable::Busy));
        assert_eq!(outage.pause(slow), slow);
    }

    /// A claim failing beside others that work is said once a minute, though the rounds that
    /// bring claims (and end an outage's count) follow each other at once.
    #[test]
    fn a_partial_failure_is_said_once_a_minute_across_working_rounds() {
        let mut outage = Outage::default();
        outage.partly(&Unavailable::Busy);
        let said = outage.partly_said;
        assert!(said.is_some());
        assert!(outage.read(Ok(Vec::new())).is_empty());
        outage.partly(&Unavailable::Busy);
        assert_eq!(outage.partly_said, said, "not said again within a minute");
    }
}
