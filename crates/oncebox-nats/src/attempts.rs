//! A failing handler's attempts, counted by the consumer itself per stored message: the
//! server's delivery count also counts the deliveries the store could not answer (an outage),
//! those requeued for a key in progress or uncertain, and ack waits that ran out, none of which
//! is the handler's fault; counted as failures, they would quarantine a message after an outage
//! at its first real failure.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

/// Messages remembered at most; past this the messages whose handler never failed are
/// dropped first (only requeued, then settled by another process sharing the durable, they
/// are never forgotten otherwise), and if that is not enough the memory is cleared: the
/// messages in it fall back to the server's count (quarantined sooner, never looped).
const MAX_REMEMBERED: usize = 10_000;

/// A stored message: the stream's creation time (a recreated stream reuses sequences) and
/// the stream sequence, stable across redeliveries.
type MessageId = (i128, u64);

#[derive(Debug, Default)]
pub(crate) struct Attempts(Mutex<HashMap<MessageId, Tally>>);

#[derive(Debug)]
struct Tally {
    /// Deliveries before this consumer first saw the message unsettled, taken as failures.
    unknown: u64,
    failures: u64,
}

impl Attempts {
    /// Notes a delivery of the message that was not settled (`handler_failed` or requeued for
    /// another reason) and returns the handler's attempt number for it.
    ///
    /// The first time this consumer sees the message, the server's earlier deliveries are
    /// counted as failures: they happened before a restart (or to another process sharing the
    /// durable), and nothing says why they failed. Taking them as failures can only quarantine
    /// sooner, while taking them as nothing would let a handler that always fails loop across
    /// restarts. From then on only real failures count.
    pub(crate) fn unsettled(&self, id: MessageId, delivered: i64, handler_failed: bool) -> u32 {
        let mut seen = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if seen.len() >= MAX_REMEMBERED && !seen.contains_key(&id) {
            // A churn of requeues must not reset the counts of messages whose handler keeps
            // failing.
            seen.retain(|_, t| t.failures > 0);
            // Little freed, it would be pruned again soon, a full pass each time: cleared.
            if seen.len() >= MAX_REMEMBERED / 10 * 9 {
                seen.clear();
            }
        }
        let tally = seen.entry(id).or_insert(Tally {
            unknown: u64::try_from(delivered.saturating_sub(1)).unwrap_or(0),
            failures: 0,
        });
        if handler_failed {
            tally.failures += 1;
        }
        u32::try_from(tally.unknown + tally.failures.max(1)).unwrap_or(u32::MAX)
    }

    /// The message was acknowledged (applied, duplicate, stale or quarantined).
    pub(crate) fn settled(&self, id: MessageId) {
        let mut seen = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        seen.remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_handler_failures_count_once_the_message_is_known() {
        let a = Attempts::default();
        let id = (1, 7);
        // Five deliveries the store could not answer, then the handler fails twice.
        for delivered in 1..=5 {
            a.unsettled(id, delivered, false);
        }
        assert_eq!(a.unsettled(id, 6, true), 1);
        assert_eq!(a.unsettled(id, 7, true), 2);
        a.settled(id);
        // Unknown again, say after a restart: the server's earlier deliveries count.
        assert_eq!(a.unsettled(id, 4, true), 4);
        // Another stream under the same name is another message.
        assert_eq!(a.unsettled((2, 7), 1, true), 1);
    }

    #[test]
    fn a_churn_of_requeues_leaves_failing_messages_counted() {
        let a = Attempts::default();
        let boom = (1, 1);
        // Requeued five times (an outage), then its handler fails twice.
        for delivered in 1..=5 {
            a.unsettled(boom, delivered, false);
        }
        assert_eq!(a.unsettled(boom, 6, true), 1);
        assert_eq!(a.unsettled(boom, 7, true), 2);
        // Requeued only, then settled elsewhere: never `settled` here.
        for seq in 2..=(MAX_REMEMBERED as u64 + 10) {
            a.unsettled((1, seq), 1, false);
        }
        assert_eq!(a.unsettled(boom, 8, true), 3, "its count survived");
        let kept = a.0.lock().unwrap().len();
        assert!(kept < MAX_REMEMBERED, "the churn was pruned: {kept}");
    }
}
