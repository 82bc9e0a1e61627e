//! The figures of TESTING.md for the multi-node run, computed from the senders' answers, the
//! final database state and the receiver's counts. Event ids are `mn-{n}` from source `mn`.

use std::collections::{BTreeSet, HashMap};

/// Keys (event ids) behind each figure; every list must be empty.
#[derive(Debug, Default)]
pub struct Figures {
    /// D: stored more than once in the inbox, or queued more than once for the route.
    pub d: Vec<String>,
    /// L: answered 2xx, but not completed in the inbox, not delivered, or never seen by the
    /// receiver.
    pub l: Vec<String>,
    /// F: answered as a replay while the key had no committed record (none at all, or one
    /// committed after the answer).
    pub f: Vec<String>,
    /// Answers that said `Idempotent-Replayed`.
    pub replays: usize,
    /// Keys the receiver got more than once: at-least-once delivery, which the receiver
    /// deduplicates by `Idempotency-Key`. Reported, not a failure.
    pub redelivered: usize,
}

impl Figures {
    /// `accepted` holds `(key, replayed, answered at ms)` of every 2xx; `inbox` rows are
    /// `(event_id, state, completed_at)`, `outbox` rows `(event_id, state)`; `receiver` counts
    /// deliveries per idempotency key.
    pub fn compute(
        keys: &BTreeSet<usize>,
        accepted: &[(usize, bool, i64)],
        inbox: &[(String, String, Option<i64>)],
        outbox: &[(String, String)],
        receiver: &HashMap<String, u32>,
    ) -> Figures {
        let mut f = Figures::default();
        let mut stored: HashMap<&str, Vec<(&str, Option<i64>)>> = HashMap::new();
        for (id, state, completed_at) in inbox {
            stored
                .entry(id)
                .or_default()
                .push((state.as_str(), *completed_at));
        }
        let mut queued: HashMap<&str, Vec<&str>> = HashMap::new();
        for (id, state) in outbox {
            queued.entry(id).or_default().push(state.as_str());
        }
        f.d.extend(
            stored
                .iter()
                .filter(|(_, rows)| rows.len() > 1)
                .map(|(id, _)| (*id).to_owned()),
        );
        f.d.extend(
            queued
                .iter()
                .filter(|(_, rows)| rows.len() > 1)
                .map(|(id, _)| (*id).to_owned()),
        );
        for key in keys {
            let id = format!("mn-{key}");
            let completed = stored
                .get(id.as_str())
                .is_some_and(|rows| rows.iter().any(|(state, _)| *state == "completed"));
            let delivered = queued
                .get(id.as_str())
                .is_some_and(|rows| rows.contains(&"delivered"));
            let seen = receiver.get(&format!("mn:{id}")).copied().unwrap_or(0);
            if !completed || !delivered || seen == 0 {
                f.l.push(id);
            }
            if seen > 1 {
                f.redelivered += 1;
            }
        }
        for (key, _, at) in accepted.iter().filter(|a| a.1) {
            f.replays += 1;
            let id = format!("mn-{key}");
            // The record's commit stamp is taken before its COMMIT; a replay read it afterwards,
            // on the same machine's clock, so it cannot be later than the answer.
            let committed_before = stored.get(id.as_str()).is_some_and(|rows| {
                rows.iter()
                    .any(|(state, done)| *state == "completed" && done.is_some_and(|d| d <= *at))
            });
            if !committed_before {
                f.f.push(id);
            }
        }
        f
    }

    pub fn assert_zero(&self) {
        let first = |v: &[String]| v.iter().take(10).cloned().collect::<Vec<_>>();
        assert!(
            self.d.is_empty() && self.l.is_empty() && self.f.is_empty(),
            "D = {} {:?}, L = {} {:?}, F = {} {:?}",
            self.d.len(),
            first(&self.d),
            self.l.len(),
            first(&self.l),
            self.f.len(),
            first(&self.f),
        );
    }
}

/// The checker catches what it is for: a double row, an accepted key lost, a replay before any
/// commit; a clean history has all three at zero.
#[test]
fn figures_catch_a_double_a_loss_and_a_false_replay() {
    let row = |id: &str, at: i64| (id.to_owned(), "completed".to_owned(), Some(at));
    let sent = |id: &str| (id.to_owned(), "delivered".to_owned());
    let keys: BTreeSet<usize> = [1, 2, 3].into();
    let seen: HashMap<String, u32> = [("mn:mn-1", 1), ("mn:mn-2", 2), ("mn:mn-3", 1)]
        .map(|(k, n)| (k.to_owned(), n))
        .into();
    let clean = Figures::compute(
        &keys,
        &[
            (1, false, 10),
            (2, false, 10),
            (3, false, 10),
            (3, true, 20),
        ],
        &[row("mn-1", 5), row("mn-2", 5), row("mn-3", 5)],
        &[sent("mn-1"), sent("mn-2"), sent("mn-3")],
        &seen,
    );
    assert_eq!((clean.d.len(), clean.l.len(), clean.f.len()), (0, 0, 0));
    assert_eq!((clean.replays, clean.redelivered), (1, 1));

    let broken = Figures::compute(
        &keys,
        // Key 3 replayed at 4, before its commit at 5.
        &[(1, false, 10), (2, false, 10), (3, true, 4)],
        // Key 1 stored twice; key 2 never stored.
        &[row("mn-1", 5), row("mn-1", 6), row("mn-3", 5)],
        &[sent("mn-1"), sent("mn-2"), sent("mn-3")],
        &seen,
    );
    assert_eq!(broken.d, ["mn-1"]);
    assert_eq!(broken.l, ["mn-2"]);
    assert_eq!(broken.f, ["mn-3"]);
}
