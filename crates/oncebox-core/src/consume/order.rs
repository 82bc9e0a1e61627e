//! Deliveries of one key applied in the order they arrived. A broker consumer applies the
//! messages in hand side by side, so of two with one key and different payloads in one
//! prefetch window, the one whose commit came first won, often the later one: the earlier,
//! first published, was then refused as `key-reused` (G4 says the first payload wins). Each
//! delivery takes a [`Ticket`] as it arrives, says its key once decoded, and waits for its
//! turn: until every delivery that arrived before it has said its key, and none of those with
//! the same key is still in hand.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;

use crate::Key;

/// The arrival order of a consumer's deliveries. Cheap to share.
#[derive(Debug, Default, Clone)]
pub struct Arrivals(Arc<Shared>);

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    changed: Notify,
}

#[derive(Debug, Default)]
struct State {
    issued: u64,
    /// Tickets that have not said their key yet.
    unsaid: BTreeSet<u64>,
    /// The tickets in hand per key, in arrival order.
    keys: HashMap<Key, BTreeSet<u64>>,
}

impl Arrivals {
    /// A ticket for the delivery that arrived now: take them in arrival order.
    pub fn ticket(&self) -> Ticket {
        let mut s = self.state();
        let seq = s.issued;
        s.issued += 1;
        s.unsaid.insert(seq);
        Ticket {
            arrivals: self.clone(),
            seq,
            key: None,
            said: false,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.0.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Deliveries in hand (tickets not yet dropped).
    pub fn in_hand(&self) -> usize {
        let s = self.state();
        s.unsaid.len() + s.keys.values().map(BTreeSet::len).sum::<usize>()
    }
}

/// One delivery's place in the arrival order; it gives its place up when dropped.
#[derive(Debug)]
pub struct Ticket {
    arrivals: Arrivals,
    seq: u64,
    key: Option<Key>,
    said: bool,
}

impl Ticket {
    /// Says the delivery's key (`None` for one that has none, a message refused before its
    /// key was known), then waits until the deliveries of that key that arrived earlier are
    /// done. Those of other keys are not waited for, beyond their saying which they are.
    pub async fn turn(&mut self, key: Option<&Key>) {
        if !self.said {
            let mut s = self.arrivals.state();
            s.unsaid.remove(&self.seq);
            if let Some(key) = key {
                s.keys.entry(key.clone()).or_default().insert(self.seq);
                self.key = Some(key.clone());
            }
            self.said = true;
            drop(s);
            self.arrivals.0.changed.notify_waiters();
        }
        let Some(key) = self.key.clone() else {
            return;
        };
        loop {
            // Enabled before the look, so a change between the look and the wait is not lost.
            let changed = self.arrivals.0.changed.notified();
            let mut changed = std::pin::pin!(changed);
            changed.as_mut().enable();
            {
                let s = self.arrivals.state();
                let earlier_unsaid = s.unsaid.range(..self.seq).next().is_some();
                let first_of_key = s
                    .keys
                    .get(&key)
                    .and_then(|seqs| seqs.first())
                    .is_none_or(|first| *first == self.seq);
                if !earlier_unsaid && first_of_key {
                    return;
                }
            }
            changed.await;
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut s = self.arrivals.state();
        s.unsaid.remove(&self.seq);
        if let Some(key) = &self.key
            && let Some(seqs) = s.keys.get_mut(key)
        {
            seqs.remove(&self.seq);
            if seqs.is_empty() {
                s.keys.remove(key);
            }
        }
        drop(s);
        self.arrivals.0.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn key(id: &str) -> Key {
        Key::parse("shop", id).unwrap()
    }

    /// Whether `turn` completes without waiting.
    async fn goes_now(ticket: &mut Ticket, k: Option<&Key>) -> bool {
        tokio::time::timeout(Duration::from_millis(50), ticket.turn(k))
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn a_later_delivery_of_a_key_waits_for_the_earlier_one_and_others_do_not() {
        let arrivals = Arrivals::default();
        let (mut first, mut second, mut other) =
            (arrivals.ticket(), arrivals.ticket(), arrivals.ticket());
        // The later one decoded first: it waits, the earlier having said nothing yet.
        assert!(!goes_now(&mut second, Some(&key("a"))).await);
        assert!(goes_now(&mut first, Some(&key("a"))).await);
        assert!(!goes_now(&mut second, Some(&key("a"))).await);
        // Another key waits only for the earlier ones to say theirs.
        assert!(goes_now(&mut other, Some(&key("b"))).await);
        let waiting = tokio::spawn(async move {
            second.turn(Some(&key("a"))).await;
            second
        });
        drop(first);
        let second = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("its turn came when the earlier one was done")
            .unwrap();
        drop((second, other));
        assert_eq!(arrivals.in_hand(), 0);
    }

    #[tokio::test]
    async fn a_delivery_dropped_before_saying_its_key_holds_nobody_back() {
        let arrivals = Arrivals::default();
        let (gone, mut keyless, mut next) =
            (arrivals.ticket(), arrivals.ticket(), arrivals.ticket());
        assert!(!goes_now(&mut next, Some(&key("a"))).await);
        drop(gone);
        assert!(goes_now(&mut keyless, None).await);
        assert!(goes_now(&mut next, Some(&key("a"))).await);
    }
}
