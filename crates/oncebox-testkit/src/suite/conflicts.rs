//! Conformance tests of the operators' read of refused conflicting payloads
//! (`EventStore::conflicts`): what each record holds, its order, the key filter and the cursor;
//! and what is no conflict: a record stored under the event's earlier fingerprint.

use oncebox_core::json::Pointer;
use oncebox_core::store::{ConflictFilter, ConflictRecord, EventStore, Page};
use oncebox_core::{Clock, Event, Fingerprint, FingerprintMode, Key, Timestamp};

use super::reads::{SECOND, accept, duplicate, fresh, json, key, ordered, refuse};
use crate::relay::DeliveryBackend;

/// One conflict as a test compares it: key, stored and offered fingerprints, payload, time.
type Seen = (
    Key,
    Option<Fingerprint>,
    Option<Fingerprint>,
    Vec<u8>,
    Timestamp,
);

fn seen(c: &ConflictRecord) -> Seen {
    (
        c.key.clone(),
        c.stored_fingerprint,
        c.offered_fingerprint,
        c.payload.clone(),
        c.at,
    )
}

fn expect(stored: &Event, offered: &Event, at: Timestamp) -> Seen {
    (
        offered.key.clone(),
        Some(stored.fingerprint),
        Some(offered.fingerprint),
        offered.payload.clone(),
        at,
    )
}

async fn list<S: EventStore>(
    s: &S,
    key: Option<Key>,
    after: Option<i64>,
    limit: usize,
) -> Page<ConflictRecord> {
    let filter = ConflictFilter { key, after, limit };
    s.conflicts(filter).await.expect("conflicts")
}

fn payloads(page: &Page<ConflictRecord>) -> Vec<String> {
    let text = |c: &ConflictRecord| String::from_utf8(c.payload.clone()).expect("utf-8");
    page.items.iter().map(text).collect()
}

pub async fn conflicts_are_listed_oldest_first_with_both_fingerprints_and_the_refused_payload<
    B: DeliveryBackend,
>() {
    let (s, clock) = fresh::<B>().await;
    let shop = json("shop", "evt-1", r#"{"amount":1}"#);
    accept(&s, &shop).await;
    clock.advance(SECOND);
    // Kept byte for byte as offered: spacing, key order and all.
    let first = json("shop", "evt-1", r#"{ "note" : "x",  "amount" : 2 }"#);
    refuse(&s, &first, &shop).await;
    let t1 = clock.now();
    // The same payload in another spelling is a duplicate, not a conflict.
    duplicate(&s, &json("shop", "evt-1", r#"{ "amount" : 1.0 }"#)).await;
    clock.advance(2 * SECOND);
    // The same event id from another source is another key, with conflicts of its own.
    let bank = json("bank", "evt-1", r#"{"amount":5}"#);
    accept(&s, &bank).await;
    let second = json("bank", "evt-1", r#"{"amount":6}"#);
    refuse(&s, &second, &bank).await;
    let t2 = clock.now();
    clock.advance(3 * SECOND);
    // The first payload stays the reference, however often the key is reused.
    let third = json("shop", "evt-1", r#"{"amount":3}"#);
    refuse(&s, &third, &shop).await;
    let t3 = clock.now();

    let page = list(&s, None, None, 10).await;
    let got: Vec<Seen> = page.items.iter().map(seen).collect();
    assert_eq!(
        got,
        vec![
            expect(&shop, &first, t1),
            expect(&bank, &second, t2),
            expect(&shop, &third, t3),
        ]
    );
    assert_eq!(page.next, None);
    let seqs: Vec<i64> = page.items.iter().map(|c| c.seq).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    assert!(seqs[0] > 0, "{seqs:?}");
    // Each event counts its own conflicts.
    let stored = s.event(&key("shop", "evt-1")).await.expect("event");
    assert_eq!(stored.expect("stored").conflicts, 2);
    let stored = s.event(&key("bank", "evt-1")).await.expect("event");
    assert_eq!(stored.expect("stored").conflicts, 1);
    assert_eq!(s.stats().await.expect("stats").conflicts, 3);
}

/// Five conflicts on three keys, recorded in the order `a:2 b:2 a:3 bank-a:2 a:4` (payload
/// `{"amount":N}`, `a` and `b` of source `shop`).
async fn five_conflicts<S: EventStore>(s: &S) {
    let a = json("shop", "a", r#"{"amount":1}"#);
    let b = json("shop", "b", r#"{"amount":1}"#);
    let bank = json("bank", "a", r#"{"amount":1}"#);
    for e in [&a, &b, &bank] {
        accept(s, e).await;
    }
    let offers = [(&a, 2), (&b, 2), (&a, 3), (&bank, 2), (&a, 4)];
    for (stored, amount) in offers {
        let k = &stored.key;
        let payload = format!(r#"{{"amount":{amount}}}"#);
        let offered = json(k.source.as_str(), k.event_id.as_str(), &payload);
        refuse(s, &offered, stored).await;
    }
}

fn amounts(ns: &[i64]) -> Vec<String> {
    ns.iter().map(|n| format!(r#"{{"amount":{n}}}"#)).collect()
}

pub async fn conflicts_filter_by_key_and_page_after_the_cursor<B: DeliveryBackend>() {
    let (s, _) = fresh::<B>().await;
    five_conflicts(&s).await;
    let all = list(&s, None, None, 100).await;
    assert_eq!(all.items.len(), 5);
    assert_eq!(all.next, None);
    let seq: Vec<i64> = all.items.iter().map(|c| c.seq).collect();
    let keys: Vec<Key> = all.items.iter().map(|c| c.key.clone()).collect();
    let (a, b, bank) = (key("shop", "a"), key("shop", "b"), key("bank", "a"));
    assert_eq!(
        keys,
        [a.clone(), b.clone(), a.clone(), bank.clone(), a.clone()]
    );

    // By key: the source counts, not only the event id.
    let only_a = list(&s, Some(a.clone()), None, 100).await;
    assert_eq!(payloads(&only_a), amounts(&[2, 3, 4]));
    assert!(only_a.items.iter().all(|c| c.key == a));
    assert_eq!(only_a.next, None);
    let only_bank = list(&s, Some(bank.clone()), None, 100).await;
    assert_eq!(only_bank.items.len(), 1);
    assert_eq!(
        (only_bank.items[0].seq, &only_bank.items[0].key),
        (seq[3], &bank)
    );
    let only_b = list(&s, Some(b), None, 100).await;
    assert_eq!(
        only_b.items.iter().map(|c| c.seq).collect::<Vec<_>>(),
        [seq[1]]
    );
    let none = list(&s, Some(key("shop", "c")), None, 100).await;
    assert_eq!((none.items.len(), none.next), (0, None));

    // Pages of two: the cursor is the last item's seq while more follow.
    let p1 = list(&s, None, None, 2).await;
    assert_eq!(p1.items.iter().map(|c| c.seq).collect::<Vec<_>>(), seq[..2]);
    assert_eq!(p1.next, Some(seq[1]));
    let p2 = list(&s, None, p1.next, 2).await;
    assert_eq!(
        p2.items.iter().map(|c| c.seq).collect::<Vec<_>>(),
        seq[2..4]
    );
    assert_eq!(p2.next, Some(seq[3]));
    let p3 = list(&s, None, p2.next, 2).await;
    assert_eq!(p3.items.iter().map(|c| c.seq).collect::<Vec<_>>(), seq[4..]);
    assert_eq!(p3.next, None);
    // A page that holds exactly what is left has no next page.
    let rest = list(&s, None, Some(seq[1]), 3).await;
    assert_eq!(
        rest.items.iter().map(|c| c.seq).collect::<Vec<_>>(),
        seq[2..]
    );
    assert_eq!(rest.next, None);
    // After the last one: nothing.
    let past = list(&s, None, Some(seq[4]), 10).await;
    assert_eq!((past.items.len(), past.next), (0, None));

    // The key filter and the cursor together.
    let k1 = list(&s, Some(a.clone()), None, 2).await;
    assert_eq!(payloads(&k1), amounts(&[2, 3]));
    assert_eq!(k1.next, Some(seq[2]));
    let k2 = list(&s, Some(a.clone()), k1.next, 2).await;
    assert_eq!(payloads(&k2), amounts(&[4]));
    assert_eq!(k2.next, None);
    // A cursor between two of the key's conflicts.
    let mid = list(&s, Some(a), Some(seq[3]), 10).await;
    assert_eq!(payloads(&mid), amounts(&[4]));
}

pub async fn conflicts_of_a_store_without_any_are_an_empty_page<B: DeliveryBackend>() {
    let (s, clock) = fresh::<B>().await;
    let page = list(&s, None, None, 10).await;
    assert_eq!((page.items.len(), page.next), (0, None));
    // New events, duplicates, equal JSON in another spelling and stale events are no conflicts.
    let e = json("shop", "evt-1", r#"{"amount":1}"#);
    accept(&s, &e).await;
    duplicate(&s, &e).await;
    duplicate(&s, &json("shop", "evt-1", r#"{"amount": 1.00}"#)).await;
    clock.advance(SECOND);
    let newer = ordered(&s, &json("shop", "evt-3", "{}"), 3).await;
    assert!(newer.is_applied(), "{newer:?}");
    let older = ordered(&s, &json("shop", "evt-2", "{}"), 2).await;
    assert!(older.is_stale(), "{older:?}");
    for k in [None, Some(key("shop", "evt-1"))] {
        let page = list(&s, k, None, 10).await;
        assert_eq!((page.items.len(), page.next), (0, None));
    }
    assert_eq!(s.stats().await.expect("stats").conflicts, 0);
}

/// A record an earlier version stored under another fingerprint (its source's fingerprint mode
/// changed since) is compared by its stored payload, for an event that says its records may be
/// such (`Event::recheck`): a retry, even with fields the new mode leaves out changed, is a
/// duplicate, where it would otherwise be refused as another payload under its key; another
/// payload still is. Without the recheck the first retry is refused.
pub async fn a_record_stored_under_an_events_earlier_fingerprint_is_that_event<
    B: DeliveryBackend,
>() {
    let (s, _) = fresh::<B>().await;
    let stored = json("shop", "evt-up", r#"{"amount":1,"pending":2}"#);
    accept(&s, &stored).await;
    let only_amount = FingerprintMode::Fields(vec![Pointer::parse("/amount").unwrap()]);
    let now = |payload: &str, recheck: bool| Event {
        recheck: recheck.then(|| std::sync::Arc::new(only_amount.clone())),
        ..Event::new(stored.key.clone(), payload.into(), &only_amount).expect("event")
    };
    refuse(&s, &now(r#"{"amount":1,"pending":2}"#, false), &stored).await;
    duplicate(&s, &now(r#"{"amount":1,"pending":2}"#, true)).await;
    duplicate(&s, &now(r#"{"amount":1,"pending":1}"#, true)).await;
    refuse(&s, &now(r#"{"amount":2,"pending":2}"#, true), &stored).await;
}
