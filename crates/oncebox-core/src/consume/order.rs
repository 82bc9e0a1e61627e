//! Deliveries of one key applied in the order they arrived. A broker consumer applies the
//! messages in hand side by side, so of two with one key and different payloads in one
//! prefetch window, the one whose commit came first won, often the later one: the earlier,
//! first published, was then refused as `key-reused` (G4 says the first payload wins). Each
//! delivery takes a [`Ticket`] as it arrives, says its key and fingerprint once decoded, and
//! waits for its turn: until every delivery that arrived before it has said its key, and none
//! of those with the same key and another payload is still in hand. Copies of one payload (a
//! redelivery while the first is still at work) go side by side, as before: whichever commits,
//! the other is its duplicate.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;

use crate::{Fingerprint, Key};

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
    /// The tickets in hand per key, in arrival order, with their payloads' fingerprints.
    keys: HashMap<Key, BTreeMap<u64, Fingerprint>>,
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
        s.unsaid.len() + s.keys.values().map(BTreeMap::len).sum::<usize>()
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
    /// Says the delivery's key and fingerprint (`None` for one that has no key, a message
    /// refused before its key was known), then waits until the deliveries of that key with
    /// another payload that arrived earlier are done. Those of other keys, and copies of the
    /// same payload, are not waited for, beyond their saying which they are.
    pub async fn turn(&mut self, said: Option<(&Key, Fingerprint)>) {
        if !self.said {
            let mut s = self.arrivals.state();
            s.unsaid.remove(&self.seq);
            if let Some((key, fingerprint)) = said {
                s.keys
                    .entry(key.clone())
                    .or_default()
                    .insert(self.seq, fingerprint);
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
                let earlier_other = s.keys.get(&key).is_some_and(|seqs| {
                    let own = seqs.get(&self.seq);
                    seqs.range(..self.seq).any(|(_, f)| Some(f) != own)
                });
                if !earlier_unsaid && !earlier_other {
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

    fn payload(n: u8) -> Fingerprint {
        Fingerprint::from_slice(&[n; 32]).unwrap()
    }

    /// Whether `turn` completes without waiting.
    async fn goes_now(ticket: &mut Ticket, said: Option<(&Key, Fingerprint)>) -> bool {
        tokio::time::timeout(Duration::from_millis(50), ticket.turn(said))
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn a_later_delivery_of_a_key_waits_for_the_earlier_one_and_others_do_not() {
        let arrivals = Arrivals::default();
        let (mut first, mut second, mut other) =
            (arrivals.ticket(), arrivals.ticket(), arrivals.ticket());
        let (a, b) = (key("a"), key("b"));
        // The later one decoded first: it waits, the earlier having said nothing yet.
        assert!(!goes_now(&mut second, Some((&a, payload(2)))).await);
        assert!(goes_now(&mut first, Some((&a, payload(1)))).await);
        assert!(!goes_now(&mut second, Some((&a, payload(2)))).await);
        // Another key waits only for the earlier ones to say theirs.
        assert!(goes_now(&mut other, Some((&b, payload(1)))).await);
        let waiting = tokio::spawn(async move {
            second.turn(Some((&key("a"), payload(2)))).await;
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
        assert!(!goes_now(&mut next, Some((&key("a"), payload(1)))).await);
        drop(gone);
        assert!(goes_now(&mut keyless, None).await);
        assert!(goes_now(&mut next, Some((&key("a"), payload(1)))).await);
    }

    #[tokio::test]
    async fn copies_of_one_payload_go_side_by_side_and_another_payload_waits_for_both() {
        let arrivals = Arrivals::default();
        let a = key("a");
        let (mut first, mut copy, mut other) =
            (arrivals.ticket(), arrivals.ticket(), arrivals.ticket());
        assert!(goes_now(&mut first, Some((&a, payload(1)))).await);
        assert!(goes_now(&mut copy, Some((&a, payload(1)))).await);
        assert!(!goes_now(&mut other, Some((&a, payload(2)))).await);
        drop(first);
        assert!(!goes_now(&mut other, Some((&a, payload(2)))).await);
        drop(copy);
        assert!(goes_now(&mut other, Some((&a, payload(2)))).await);
    }
}
