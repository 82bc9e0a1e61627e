//! Quarantines owed: a message the store answered as a conflict whose quarantined copy the
//! broker did not take, so it came back. Its next delivery goes straight to the quarantine
//! again rather than to the store, which keeps an audit row of the offered payload each time
//! it is asked: with the quarantine unroutable for an hour, one conflicting message retried
//! every 5 s would have written 720 copies of its payload. Only while the message is due back:
//! one settled elsewhere (another consumer of the queue) leaves nothing owed for good.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::{Reason, Settle};
use crate::fingerprint::Fingerprint;
use crate::key::Key;

/// Keys remembered at most; past this the memory is cleared, and those messages are asked of
/// the store again on their next delivery (one more audit row each, never a lost message).
const MAX_REMEMBERED: usize = 10_000;

/// How long past its requeue's wait a conflict stays owed. The message comes back then, to
/// this consumer or another; one settled elsewhere must not leave its key and payload owed
/// for good, where a later message of them would skip the store (whose record may have been
/// purged, or the key freed by an operator, meanwhile).
const OWED_SLACK: Duration = Duration::from_secs(60);

/// `wait` and the slack after `now`: a year at most, since a library's `RetryPolicy` may ask
/// for `Duration::MAX`, which added to an `Instant` panicked.
fn later(now: Instant, wait: Duration) -> Instant {
    const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);
    now + wait.saturating_add(OWED_SLACK).min(YEAR)
}

/// Per consumer: the conflicts whose quarantine is owed, by key and offered payload, each
/// until its message should have come back.
#[derive(Debug, Default)]
pub struct Owed(Mutex<HashMap<(Key, Fingerprint), (Reason, Instant)>>);

impl Owed {
    /// The reason a delivery of `key` with this payload's `fingerprint` is owed to the
    /// quarantine, if it still is; taken out of the memory until [`Owed::owe`] puts it back.
    pub fn take(&self, key: &Key, fingerprint: Fingerprint) -> Option<Reason> {
        let mut owed = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let (reason, until) = owed.remove(&(key.clone(), fingerprint))?;
        (Instant::now() < until).then_some(reason)
    }

    /// Before a conflict (`decided` quarantines it as `key-reused`) is settled: remembers it,
    /// as its quarantine may fail and its message be requeued, to come back after `wait`. It
    /// is remembered first because a requeued message can be delivered again, to another task
    /// of this consumer, before the settling returns.
    pub fn owe(&self, key: &Key, fingerprint: Fingerprint, decided: &Settle, wait: Duration) {
        let Settle::Quarantine(reason @ Reason::KeyReused { .. }) = decided else {
            return;
        };
        let now = Instant::now();
        let mut owed = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if owed.len() >= MAX_REMEMBERED {
            owed.retain(|_, (_, until)| now < *until);
            if owed.len() >= MAX_REMEMBERED {
                owed.clear();
            }
        }
        let until = later(now, wait);
        owed.insert((key.clone(), fingerprint), (reason.clone(), until));
    }

    /// After the settling: a message quarantined (or acknowledged) is owed nothing more; one
    /// requeued stays owed until its wait from now is over (a copy may have waited its turn
    /// long before the requeue).
    pub fn settled(&self, key: &Key, fingerprint: Fingerprint, settled: &Settle) {
        let mut owed = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match settled {
            Settle::Requeue { after, .. } => {
                if let Some((_, until)) = owed.get_mut(&(key.clone(), fingerprint)) {
                    *until = later(Instant::now(), *after);
                }
            }
            _ => {
                owed.remove(&(key.clone(), fingerprint));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consume::Requeue;

    #[test]
    fn only_a_conflict_whose_quarantine_was_requeued_stays_owed() {
        let owed = Owed::default();
        let key = Key::parse("shop", "evt_1").unwrap();
        let (stored, offered) = (Fingerprint::from([1; 32]), Fingerprint::from([2; 32]));
        let reused = Settle::Quarantine(Reason::KeyReused { stored, offered });
        let requeued = Settle::Requeue {
            why: Requeue::Unavailable,
            after: Duration::from_secs(5),
        };
        let wait = Duration::from_secs(5);
        // Quarantined as decided: nothing owed.
        owed.owe(&key, offered, &reused, wait);
        owed.settled(&key, offered, &reused);
        assert_eq!(owed.take(&key, offered), None);
        // Another reason: asked of the store again.
        let invalid = Settle::Quarantine(Reason::InvalidJson("x".into()));
        owed.owe(&key, offered, &invalid, wait);
        owed.settled(&key, offered, &requeued);
        assert_eq!(owed.take(&key, offered), None);
        // Owed from before the settling ends: its message may be back before that.
        owed.owe(&key, offered, &reused, wait);
        assert_eq!(owed.take(&key, stored), None, "another payload is not owed");
        assert!(owed.take(&key, offered).is_some());
        owed.owe(&key, offered, &reused, wait);
        owed.settled(&key, offered, &requeued);
        assert!(matches!(
            owed.take(&key, offered),
            Some(Reason::KeyReused { .. })
        ));
        assert_eq!(owed.take(&key, offered), None, "taken");
        // Its message not back long past its wait (settled elsewhere): the store is asked.
        owed.owe(&key, offered, &reused, wait);
        let mut memory = owed.0.lock().unwrap();
        let (_, until) = memory.get_mut(&(key.clone(), offered)).unwrap();
        *until = Instant::now();
        drop(memory);
        assert_eq!(owed.take(&key, offered), None, "no longer owed");
    }

    /// A library's retry delay of `Duration::MAX`: owed for as long as an `Instant` can say,
    /// not a panic in the consumer's task (which left the delivery neither acked nor nacked).
    #[test]
    fn a_wait_past_any_instant_is_owed_without_a_panic() {
        let owed = Owed::default();
        let key = Key::parse("shop", "evt_1").unwrap();
        let (stored, offered) = (Fingerprint::from([1; 32]), Fingerprint::from([2; 32]));
        let reused = Settle::Quarantine(Reason::KeyReused { stored, offered });
        let forever = Settle::Requeue {
            why: Requeue::Unavailable,
            after: Duration::MAX,
        };
        owed.owe(&key, offered, &reused, Duration::MAX);
        owed.settled(&key, offered, &forever);
        assert!(owed.take(&key, offered).is_some());
    }
}
