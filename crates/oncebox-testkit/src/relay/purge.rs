//! Delivery conformance tests of retention: a record goes with its finished deliveries, so a
//! key accepted again after its purge is a new event delivered anew; a record whose delivery is
//! still owed outlives its retention.

use std::time::Duration;

use oncebox_core::delivery::{DeliveryState, Verdict};
use oncebox_core::relay_store::{DeliveryStore, Resolve};
use oncebox_core::store::{ConflictFilter, EventFilter, EventStore, Ingest};
use oncebox_core::{Clock, Meta, Processed, Retention};

use super::operator::each_state;
use super::{
    CONTENT_TYPE, DeliveryBackend, Stores, accept, answered, claim, failed, fresh, ingest, key,
    of_event,
};
use crate::event;

const DAY: Duration = Duration::from_secs(24 * 3600);

/// `evt-1` routed to `a` and `b`, its payload carrying `amount`.
fn evt_1(amount: i64) -> Ingest {
    Ingest {
        event: event("shop", "evt-1", amount).with_meta(Meta::new(Some(CONTENT_TYPE.into()))),
        ..ingest("evt-1", &["a", "b"], None)
    }
}

pub async fn a_key_accepted_again_after_its_purge_is_delivered_anew<B: DeliveryBackend>() {
    let (b, clock) = fresh::<B>().await;
    let retention = Retention::new(DAY);
    let first = b.ingest(evt_1(1)).await;
    assert!(matches!(first, Ok(Processed::Applied(_))), "{first:?}");
    // A conflicting payload while the record is kept: refused and recorded for operators.
    let conflict = b.ingest(evt_1(9)).await;
    assert!(conflict.is_err(), "{conflict:?}");
    let conflicts = ConflictFilter {
        key: Some(key("evt-1")),
        after: None,
        limit: 10,
    };
    assert_eq!(
        b.conflicts(conflicts.clone())
            .await
            .expect("conflicts")
            .items
            .len(),
        1
    );
    // Both deliveries end: one delivered, one given up on.
    let claimed = claim(&b, clock.now(), 10).await;
    assert_eq!(claimed.len(), 2);
    let before = Ids::of(&b).await;
    let verdicts = [Verdict::Delivered, Verdict::Dead("410 Gone".into())];
    for (c, verdict) in claimed.iter().zip(verdicts) {
        let attempt = answered(200, clock.now());
        b.record(c, attempt, verdict, clock.now())
            .await
            .expect("record");
    }
    clock.advance(DAY + Duration::from_secs(1));
    assert_eq!(b.purge(clock.now(), &retention).await.expect("purge"), 1);
    assert!(
        of_event(&b, "evt-1").await.is_empty(),
        "its deliveries went with it"
    );
    let left = b.conflicts(conflicts).await.expect("conflicts").items;
    assert!(left.is_empty(), "its conflicts went with it: {left:?}");
    // The key again, with another payload: a new event (docs/guarantees.md), delivered anew to
    // every route with what it carries now, not dropped against the old deliveries.
    let again = b.ingest(evt_1(2)).await;
    assert!(matches!(again, Ok(Processed::Applied(_))), "{again:?}");
    assert!(b.ingest(evt_1(8)).await.is_err(), "a conflict again");
    // Everything the purge took was the newest of its kind; the new rows are numbered past
    // it all the same. A listing's cursor or an operator's delivery id from before the purge
    // must not miss the new rows, nor name one of them.
    let after = Ids::of(&b).await;
    assert!(after.event > before.event, "{after:?} after {before:?}");
    assert!(
        after.conflict > before.conflict,
        "{after:?} after {before:?}"
    );
    assert!(
        after.delivery > before.delivery,
        "{after:?} after {before:?}"
    );
    let listed = b
        .events(EventFilter {
            source: None,
            after: Some(before.event),
            limit: 10,
        })
        .await
        .expect("events");
    assert_eq!(listed.items.len(), 1, "the new event, past the old cursor");
    let ds = of_event(&b, "evt-1").await;
    let states: Vec<(&str, DeliveryState, u32)> = ds
        .iter()
        .map(|d| (d.route.as_str(), d.state, d.attempts))
        .collect();
    assert_eq!(
        states,
        [
            ("a", DeliveryState::Pending, 0),
            ("b", DeliveryState::Pending, 0)
        ]
    );
    for d in &ds {
        assert!(
            b.attempts(d.id).await.expect("attempts").is_empty(),
            "{d:?}"
        );
    }
    let claimed = claim(&b, clock.now(), 10).await;
    assert_eq!(claimed.len(), 2);
    for c in &claimed {
        assert_eq!(c.payload, event("shop", "evt-1", 2).payload);
        assert_eq!(c.idempotency_key, "shop:evt-1");
    }
}

/// The highest event seq, conflict seq and delivery id of `evt-1`.
#[derive(Debug)]
struct Ids {
    event: i64,
    conflict: i64,
    delivery: i64,
}

impl Ids {
    async fn of<S: Stores>(b: &S) -> Ids {
        let all = EventFilter {
            source: None,
            after: None,
            limit: 10,
        };
        let conflicts = ConflictFilter {
            key: None,
            after: None,
            limit: 10,
        };
        let highest = |seqs: Vec<i64>| seqs.into_iter().max().expect("one at least");
        Ids {
            event: highest(
                b.events(all)
                    .await
                    .expect("events")
                    .items
                    .iter()
                    .map(|e| e.seq)
                    .collect(),
            ),
            conflict: highest(
                b.conflicts(conflicts)
                    .await
                    .expect("conflicts")
                    .items
                    .iter()
                    .map(|c| c.seq)
                    .collect(),
            ),
            delivery: highest(of_event(b, "evt-1").await.iter().map(|d| d.id).collect()),
        }
    }
}

/// The ordering guard outlives the record that set its entity's version: once the newest event
/// of an entity is delivered and purged, an older one of it is still stale, kept and never
/// delivered (a deleted record must not make an old fact new).
pub async fn an_entity_version_outlives_its_records_purge<B: DeliveryBackend>() {
    let (b, clock) = fresh::<B>().await;
    let paid = b.ingest(ingest("paid", &["a"], Some(("pi_1", 20)))).await;
    assert!(matches!(paid, Ok(Processed::Applied(_))), "{paid:?}");
    assert_eq!(super::deliver_due(&b, clock.now()).await, 1);
    clock.advance(DAY + Duration::from_secs(1));
    let purged = b.purge(clock.now(), &Retention::new(DAY)).await;
    assert_eq!(purged.expect("purge"), 1);
    let created = b
        .ingest(ingest("created", &["a"], Some(("pi_1", 10))))
        .await;
    assert!(
        created.as_ref().is_ok_and(Processed::is_stale),
        "{created:?}"
    );
    assert!(of_event(&b, "created").await.is_empty(), "never delivered");
}

pub async fn a_record_whose_delivery_is_still_owed_outlives_its_retention<B: DeliveryBackend>() {
    let (b, clock) = fresh::<B>().await;
    let retention = Retention::new(DAY);
    assert!(matches!(
        b.ingest(evt_1(1)).await,
        Ok(Processed::Applied(_))
    ));
    let claimed = claim(&b, clock.now(), 10).await;
    assert_eq!(claimed.len(), 2);
    let (a, other) = (&claimed[0], &claimed[1]);
    b.record(
        a,
        answered(200, clock.now()),
        Verdict::Delivered,
        clock.now(),
    )
    .await
    .expect("record");
    let attempt = failed("connection refused", clock.now());
    let wait = Verdict::Retry(DAY * 2);
    b.record(other, attempt, wait, clock.now())
        .await
        .expect("record");
    clock.advance(DAY + Duration::from_secs(1));
    // Purged now, a redelivery of the event would be taken as new while its first delivery
    // is still on its way.
    assert_eq!(b.purge(clock.now(), &retention).await.expect("purge"), 0);
    let redelivered = b.ingest(evt_1(1)).await.expect("ingest");
    assert!(redelivered.is_duplicate(), "{redelivered:?}");
    assert_eq!(of_event(&b, "evt-1").await.len(), 2);
    // Once that delivery ends too, the record goes at the next purge.
    clock.advance(DAY * 2);
    let retried = claim(&b, clock.now(), 10).await;
    assert_eq!(retried.len(), 1);
    b.record(
        &retried[0],
        answered(200, clock.now()),
        Verdict::Delivered,
        clock.now(),
    )
    .await
    .expect("record");
    assert_eq!(b.purge(clock.now(), &retention).await.expect("purge"), 1);
    assert!(of_event(&b, "evt-1").await.is_empty());
}

/// A record stays while any one of its deliveries is owed, in whichever state: `pending`,
/// `in_flight` (its relay's lease long over), `uncertain`, `retrying`. Each is left the last
/// one owed of its event in turn; only once it is settled does the record go.
pub async fn no_record_goes_while_any_of_its_deliveries_is_owed<B: DeliveryBackend>() {
    let (b, clock) = fresh::<B>().await;
    let retention = Retention::new(DAY);
    // evt-1: delivered, dead; evt-2: uncertain, retrying; evt-3: in flight, pending.
    let each = each_state(&b, &clock).await;
    // evt-4: delivered, in flight.
    accept(&b, "evt-4").await;
    // The claim takes evt-3's pending one too; it is given back as it was.
    let (held, back): (Vec<_>, Vec<_>) = claim(&b, clock.now(), 10)
        .await
        .into_iter()
        .partition(|c| c.idempotency_key == "shop:evt-4");
    assert_eq!((held.len(), back.len()), (2, 1), "evt-4's two, evt-3's one");
    let due = clock.now();
    b.unclaim(&back[0], due, due).await.expect("given back");
    assert_eq!(back[0].id, each.pending);
    let attempt = answered(200, clock.now());
    b.record(&held[0], attempt, Verdict::Delivered, clock.now())
        .await
        .expect("record");
    clock.advance(DAY * 2);
    assert_eq!(
        b.purge(clock.now(), &retention).await.expect("purge"),
        1,
        "evt-1 alone: nothing of it is owed"
    );
    let settle = |id: i64| {
        let b = b.clone();
        let now = clock.now();
        async move {
            let settled = b.resolve(id, Resolve::Dead, "settled", now).await;
            assert!(settled.expect("resolve"), "delivery {id} settled");
        }
    };
    // Each event left with one owed delivery: the state named.
    settle(each.retrying.id).await;
    settle(each.in_flight.id).await;
    let kept = b.purge(clock.now(), &retention).await.expect("purge");
    assert_eq!(kept, 0, "uncertain, pending and in flight each keep theirs");
    for id in ["evt-2", "evt-3", "evt-4"] {
        let again = b
            .ingest(ingest(id, &["a", "b"], None))
            .await
            .expect("ingest");
        assert!(again.is_duplicate(), "{id}: {again:?}");
    }
    settle(each.uncertain.id).await;
    settle(each.pending).await;
    settle(held[1].id).await;
    assert_eq!(b.purge(clock.now(), &retention).await.expect("purge"), 3);
    for id in ["evt-1", "evt-2", "evt-3", "evt-4"] {
        assert!(of_event(&b, id).await.is_empty(), "{id}");
    }
}
