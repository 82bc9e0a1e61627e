//! Conformance tests of the operators' overview (`EventStore::activity`): records per source
//! and state with refused payloads as `conflict`, and arrivals since an instant per time bucket
//! and source.

use std::time::Duration;

use oncebox_core::store::{Activity, EventStore};
use oncebox_core::{Clock, Event, ManualClock, Timestamp};

use super::reads::{MINUTE, SECOND, accept, duplicate, fresh, json, ordered, refuse};
use crate::EPOCH;
use crate::relay::DeliveryBackend;

const HOUR: Duration = Duration::from_secs(3600);

fn count(source: &str, state: &str, n: i64) -> (String, String, i64) {
    (source.to_owned(), state.to_owned(), n)
}

fn bucket(start: Timestamp, source: &str, n: i64) -> (Timestamp, String, i64) {
    (start, source.to_owned(), n)
}

/// A new event from `source` arriving at `t`.
async fn arrive<S: EventStore>(
    s: &S,
    clock: &ManualClock,
    t: Timestamp,
    source: &str,
    id: &str,
) -> Event {
    clock.set(t);
    let e = json(source, id, r#"{"amount":1}"#);
    accept(s, &e).await;
    e
}

async fn activity<S: EventStore>(s: &S, since: Timestamp, bucket: Duration) -> Activity {
    s.activity(since, bucket).await.expect("activity")
}

pub async fn activity_of_an_empty_store_is_empty<B: DeliveryBackend>() {
    let (s, _) = fresh::<B>().await;
    for since in [Timestamp(0), EPOCH, EPOCH.plus(HOUR)] {
        assert_eq!(activity(&s, since, MINUTE).await, Activity::default());
    }
}

pub async fn activity_counts_records_per_source_and_state_and_conflicts_per_source<
    B: DeliveryBackend,
>() {
    let (s, clock) = fresh::<B>().await;
    // Sources arrive out of alphabetical order; the counts come ordered by source, then state.
    let shop: Vec<_> = (1..=3)
        .map(|i| json("shop", &format!("evt-{i}"), r#"{"amount":1}"#))
        .collect();
    for e in &shop {
        accept(&s, e).await;
        clock.advance(SECOND);
    }
    // shop: one more completed under the ordering guard, then one stale.
    let newer = ordered(&s, &json("shop", "v2", "{}"), 2).await;
    assert!(newer.is_applied(), "{newer:?}");
    let older = ordered(&s, &json("shop", "v1", "{}"), 1).await;
    assert!(older.is_stale(), "{older:?}");
    // crm: one completed, two stale; replays of them are no new records.
    let crm_new = json("crm", "v5", "{}");
    let crm_old = json("crm", "v4", "{}");
    assert!(ordered(&s, &crm_new, 5).await.is_applied());
    assert!(ordered(&s, &crm_old, 4).await.is_stale());
    assert!(ordered(&s, &json("crm", "v3", "{}"), 3).await.is_stale());
    assert!(ordered(&s, &crm_old, 4).await.is_duplicate());
    // bank: one completed, one refused payload; shop: two refused payloads on one key.
    let bank = json("bank", "evt-1", r#"{"amount":1}"#);
    accept(&s, &bank).await;
    duplicate(&s, &bank).await;
    refuse(&s, &json("bank", "evt-1", r#"{"amount":2}"#), &bank).await;
    refuse(&s, &json("shop", "evt-1", r#"{"amount":2}"#), &shop[0]).await;
    refuse(&s, &json("shop", "evt-1", r#"{"amount":3}"#), &shop[0]).await;
    duplicate(&s, &shop[0]).await;

    let expected = vec![
        count("bank", "completed", 1),
        count("bank", "conflict", 1),
        count("crm", "completed", 1),
        count("crm", "stale", 2),
        count("shop", "completed", 4),
        count("shop", "conflict", 2),
        count("shop", "stale", 1),
    ];
    let now = activity(&s, EPOCH, HOUR).await;
    assert_eq!(now.counts, expected);
    // Counts are of everything stored, whatever the instant asked; only the buckets follow it.
    let later = activity(&s, clock.now().plus(HOUR), HOUR).await;
    assert_eq!(
        later,
        Activity {
            counts: expected,
            buckets: Vec::new()
        }
    );
}

pub async fn activity_buckets_arrivals_since_an_instant_per_bucket_and_source<
    B: DeliveryBackend,
>() {
    let (s, clock) = fresh::<B>().await;
    // On a minute boundary (so is EPOCH, on an hour's).
    let since = EPOCH.plus(10 * MINUTE);
    let ms = Duration::from_millis;
    let at = |d: Duration| since.plus(d);
    // Before `since`: one long before, one a millisecond before.
    arrive(&s, &clock, EPOCH, "shop", "old-1").await;
    arrive(&s, &clock, since.minus(ms(1)), "bank", "old-2").await;
    // The first minute from `since`, its first and last millisecond.
    let a = arrive(&s, &clock, since, "shop", "a").await;
    arrive(&s, &clock, at(ms(59_999)), "bank", "b").await;
    let c = arrive(&s, &clock, at(ms(59_999)), "shop", "c").await;
    // The next minute's first millisecond; the minute after stays empty.
    arrive(&s, &clock, at(MINUTE), "shop", "d").await;
    arrive(&s, &clock, at(3 * MINUTE + 5 * SECOND), "crm", "e").await;
    arrive(&s, &clock, at(3 * MINUTE + 6 * SECOND), "bank", "f").await;
    arrive(&s, &clock, at(3 * MINUTE + 59 * SECOND), "bank", "g").await;
    // Later deliveries of known keys are no arrivals, duplicate or conflicting.
    clock.set(at(4 * MINUTE));
    duplicate(&s, &a).await;
    refuse(&s, &json("shop", "c", r#"{"amount":2}"#), &c).await;

    let got = activity(&s, since, MINUTE).await;
    assert_eq!(
        got.buckets,
        vec![
            bucket(since, "bank", 1),
            bucket(since, "shop", 2),
            bucket(at(MINUTE), "shop", 1),
            bucket(at(3 * MINUTE), "bank", 2),
            bucket(at(3 * MINUTE), "crm", 1),
        ]
    );
    assert_eq!(
        got.counts,
        vec![
            count("bank", "completed", 4),
            count("crm", "completed", 1),
            count("shop", "completed", 4),
            count("shop", "conflict", 1),
        ]
    );
    // From a later boundary on, the earlier buckets are gone.
    let from_next = activity(&s, at(MINUTE), MINUTE).await;
    assert_eq!(
        from_next.buckets,
        vec![
            bucket(at(MINUTE), "shop", 1),
            bucket(at(3 * MINUTE), "bank", 2),
            bucket(at(3 * MINUTE), "crm", 1),
        ]
    );
    // One millisecond later still, the first arrival of that minute is excluded too.
    let just_after = activity(&s, at(MINUTE + ms(1)), MINUTE).await;
    assert_eq!(
        just_after.buckets,
        vec![
            bucket(at(3 * MINUTE), "bank", 2),
            bucket(at(3 * MINUTE), "crm", 1),
        ]
    );
    // Wider buckets gather them: everything since EPOCH falls within its hour.
    let hourly = activity(&s, EPOCH, HOUR).await;
    assert_eq!(
        hourly.buckets,
        vec![
            bucket(EPOCH, "bank", 4),
            bucket(EPOCH, "crm", 1),
            bucket(EPOCH, "shop", 4),
        ]
    );
    // Nothing arrived since the last arrival's next millisecond.
    let none = activity(&s, at(3 * MINUTE + 59 * SECOND + ms(1)), MINUTE).await;
    assert!(none.buckets.is_empty(), "{:?}", none.buckets);
}
