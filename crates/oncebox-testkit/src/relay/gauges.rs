//! Delivery conformance test of the gauges operators read: deliveries per state, the oldest
//! one still owed, and what is owed per route.

use std::collections::BTreeMap;

use oncebox_core::Clock;
use oncebox_core::delivery::Verdict;
use oncebox_core::relay_store::{DeliveryGauges, DeliveryStore, Resolve};

use super::operator::each_state;
use super::{DeliveryBackend, answered, claim, fresh};

fn counts(g: &DeliveryGauges) -> BTreeMap<String, i64> {
    // A backend may list a state with no deliveries as 0 or leave it out.
    g.by_state.iter().filter(|(_, n)| *n > 0).cloned().collect()
}

pub async fn gauges_count_by_state_and_report_the_oldest_owed_delivery<B: DeliveryBackend>() {
    let (b, clock) = fresh::<B>().await;
    let empty = b.gauges().await.expect("gauges");
    assert_eq!(
        (counts(&empty), empty.oldest_pending),
        (BTreeMap::new(), None)
    );
    let each = each_state(&b, &clock).await;
    let g = b.gauges().await.expect("gauges");
    let one_each: BTreeMap<String, i64> = [
        "delivered",
        "dead",
        "uncertain",
        "retrying",
        "in_flight",
        "pending",
    ]
    .into_iter()
    .map(|s| (s.to_owned(), 1))
    .collect();
    assert_eq!(counts(&g), one_each);
    // Owed: pending, retrying or in flight. The retrying delivery of evt-2 is the oldest.
    assert_eq!(g.oldest_pending, Some(each.created[1]));
    let owed = |g: &oncebox_core::relay_store::DeliveryGauges| -> i64 {
        g.owed_by_route.iter().map(|(_, n)| n).sum()
    };
    assert_eq!(owed(&g), 3, "{:?}", g.owed_by_route);
    let now = clock.now();
    assert!(
        b.resolve(each.retrying.id, Resolve::Dead, "gave up", now)
            .await
            .expect("resolve")
    );
    assert_eq!(
        b.gauges().await.expect("gauges").oldest_pending,
        Some(each.created[2])
    );
    let held = &each.in_flight;
    b.record(held, answered(200, now), Verdict::Delivered, now)
        .await
        .expect("record");
    let last = claim(&b, now, 10).await.remove(0);
    b.record(&last, answered(200, now), Verdict::Delivered, now)
        .await
        .expect("record");
    let g = b.gauges().await.expect("gauges");
    let expect: BTreeMap<String, i64> = [("delivered", 3), ("dead", 2), ("uncertain", 1)]
        .into_iter()
        .map(|(s, n)| (s.to_owned(), n))
        .collect();
    assert_eq!((counts(&g), g.oldest_pending), (expect, None));
    assert_eq!(owed(&g), 0, "{:?}", g.owed_by_route);
}
