//! Delivery conformance tests of operators' actions — retry, resolve, redeliver — and of the
//! listing they read (the gauges are in `gauges.rs`).

use std::time::Duration;

use oncebox_core::delivery::{DeliveryState, Verdict};
use oncebox_core::relay_store::{
    Budget, Claimed, DeliveryFilter, DeliveryStore, Resolve, STATUS_RECHECK,
};
use oncebox_core::{Clock, LeaseError, ManualClock, Timestamp};

use super::{DeliveryBackend, Stores, accept, answered, claim, failed, fresh, key, of_event, view};

/// One delivery in each state. Events `evt-1`, `evt-2`, `evt-3` arrived a second apart, each
/// routed to `a` and `b`; their deliveries are, in order: delivered, dead, uncertain, retrying
/// (for a minute), in flight (under a live lease), pending.
pub(crate) struct Each {
    pub(crate) delivered: Claimed,
    pub(crate) dead: Claimed,
    pub(crate) uncertain: Claimed,
    pub(crate) retrying: Claimed,
    pub(crate) in_flight: Claimed,
    pub(crate) pending: i64,
    pub(crate) created: [Timestamp; 3],
}

impl Each {
    pub(crate) fn ids(&self) -> [i64; 6] {
        [
            self.delivered.id,
            self.dead.id,
            self.uncertain.id,
            self.retrying.id,
            self.in_flight.id,
            self.pending,
        ]
    }
}

pub(crate) async fn each_state<S: Stores>(b: &S, clock: &ManualClock) -> Each {
    let mut created = [clock.now(); 3];
    for (i, id) in ["evt-1", "evt-2", "evt-3"].into_iter().enumerate() {
        if i > 0 {
            clock.advance(Duration::from_secs(1));
        }
        created[i] = clock.now();
        accept(b, id).await;
    }
    let now = clock.now();
    let mut c = claim(b, now, 5).await.into_iter();
    let mut next = || c.next().expect("five claimed");
    let (delivered, dead, uncertain, retrying, in_flight) =
        (next(), next(), next(), next(), next());
    let outcomes = [
        (&delivered, answered(200, now), Verdict::Delivered),
        (
            &dead,
            answered(410, now),
            Verdict::Dead("receiver answered 410".into()),
        ),
        (
            &uncertain,
            failed("timeout", now),
            Verdict::Uncertain(STATUS_RECHECK.0),
        ),
        (
            &retrying,
            answered(503, now),
            Verdict::Retry(Duration::from_secs(60)),
        ),
    ];
    for (claimed, attempt, verdict) in outcomes {
        b.record(claimed, attempt, verdict, now)
            .await
            .expect("record");
    }
    let pending = of_event(b, "evt-3").await[1].id;
    Each {
        delivered,
        dead,
        uncertain,
        retrying,
        in_flight,
        pending,
        created,
    }
}

async fn state<S: Stores>(b: &S, id: i64) -> DeliveryState {
    view(b, id).await.state
}

pub async fn retry_makes_dead_uncertain_and_retrying_due_now_and_refuses_other_states<
    B: DeliveryBackend,
>() {
    let (b, clock) = fresh::<B>().await;
    let each = each_state(&b, &clock).await;
    clock.advance(Duration::from_secs(1));
    let now = clock.now();
    let missing = each.ids().into_iter().max().unwrap_or(0) + 1000;
    for (id, was) in [
        (each.delivered.id, DeliveryState::Delivered),
        (each.in_flight.id, DeliveryState::InFlight),
        (each.pending, DeliveryState::Pending),
    ] {
        assert!(!b.retry(id, now).await.expect("retry"), "{was}");
        assert_eq!(state(&b, id).await, was);
    }
    assert!(!b.retry(missing, now).await.expect("retry"));
    let settled = [&each.dead, &each.uncertain, &each.retrying];
    // Each gets a budget as fresh as a new delivery's: its one attempt no longer counts, nor
    // its age, so after an outage longer than the route's `max_age` it is not dead again at
    // its first failure.
    let fresh = Budget {
        attempts_before: 1,
        since: now,
    };
    for c in settled {
        let first = Budget {
            attempts_before: 0,
            since: c.created_at,
        };
        assert_eq!(view(&b, c.id).await.budget, first);
        assert!(b.retry(c.id, now).await.expect("retry"));
        let v = view(&b, c.id).await;
        assert_eq!(
            (v.state, v.next_attempt_at, v.attempts, v.budget),
            (DeliveryState::Pending, Some(now), 1, fresh)
        );
    }
    let again = claim(&b, now, 10).await;
    let mut ids: Vec<i64> = again.iter().map(|c| c.id).collect();
    ids.sort_unstable();
    let mut expect = vec![
        each.dead.id,
        each.uncertain.id,
        each.retrying.id,
        each.pending,
    ];
    expect.sort_unstable();
    assert_eq!(ids, expect);
    for c in settled {
        let same = again.iter().find(|a| a.id == c.id).expect("claimed again");
        assert_eq!(
            (&same.idempotency_key, same.attempts, same.budget),
            (&c.idempotency_key, 1, fresh)
        );
    }
}

pub async fn resolve_settles_any_owed_or_dead_and_refuses_in_flight_and_delivered<
    B: DeliveryBackend,
>() {
    let (b, clock) = fresh::<B>().await;
    let each = each_state(&b, &clock).await;
    let now = clock.now();
    let missing = each.ids().into_iter().max().unwrap_or(0) + 1000;
    for (id, was) in [
        (each.in_flight.id, DeliveryState::InFlight),
        (each.delivered.id, DeliveryState::Delivered),
    ] {
        for how in [Resolve::Delivered, Resolve::Dead] {
            assert!(
                !b.resolve(id, how, "no", now).await.expect("resolve"),
                "{was}"
            );
        }
        let v = view(&b, id).await;
        assert_eq!((v.state, v.note), (was, None));
    }
    assert!(
        !b.resolve(missing, Resolve::Dead, "no", now)
            .await
            .expect("resolve")
    );
    for (c, how, note, to) in [
        (
            &each.uncertain,
            Resolve::Delivered,
            "receiver confirmed by phone",
            DeliveryState::Delivered,
        ),
        (
            &each.retrying,
            Resolve::Dead,
            "customer closed the account",
            DeliveryState::Dead,
        ),
        (
            &each.dead,
            Resolve::Delivered,
            "applied by hand",
            DeliveryState::Delivered,
        ),
    ] {
        assert!(b.resolve(c.id, how, note, now).await.expect("resolve"));
        let v = view(&b, c.id).await;
        assert_eq!((v.state, v.note.as_deref()), (to, Some(note)));
    }
    // One never sent (owed to a route since removed, say) is given up by hand too.
    assert!(
        b.resolve(each.pending, Resolve::Dead, "route retired", now)
            .await
            .expect("resolve")
    );
    let v = view(&b, each.pending).await;
    assert_eq!(
        (v.state, v.note.as_deref()),
        (DeliveryState::Dead, Some("route retired"))
    );
    // Settled again without a note, it keeps the one it had (a status URL's, an operator's).
    assert!(
        b.resolve(each.pending, Resolve::Delivered, "", now)
            .await
            .expect("resolve")
    );
    let v = view(&b, each.pending).await;
    assert_eq!(
        (v.state, v.note.as_deref()),
        (DeliveryState::Delivered, Some("route retired"))
    );
    // The relay holding the delivery in flight still records its own outcome.
    let held = &each.in_flight;
    b.record(held, answered(200, now), Verdict::Delivered, now)
        .await
        .expect("record");
    clock.advance(Duration::from_secs(24 * 3600));
    let later = claim(&b, clock.now(), 10).await;
    assert!(later.is_empty(), "settled deliveries are never claimed");
}

/// A relay that died (or stalled) mid-send leaves its delivery in flight; past its lease, an
/// operator settles it, or one owed to a route since removed would stay in flight for good,
/// claimed by no relay. The stalled relay's late record is fenced.
pub async fn resolve_takes_an_in_flight_delivery_whose_lease_ended_and_fences_its_relay<
    B: DeliveryBackend,
>() {
    let (b, clock) = fresh::<B>().await;
    let each = each_state(&b, &clock).await;
    let held = &each.in_flight;
    clock.set(held.lease_expires_at.minus(Duration::from_millis(1)));
    assert!(
        !b.resolve(held.id, Resolve::Dead, "too soon", clock.now())
            .await
            .expect("resolve"),
        "its relay's lease lives"
    );
    clock.set(held.lease_expires_at);
    let now = clock.now();
    assert!(
        b.resolve(held.id, Resolve::Dead, "route retired", now)
            .await
            .expect("resolve")
    );
    let v = view(&b, held.id).await;
    assert_eq!(
        (v.state, v.note.as_deref()),
        (DeliveryState::Dead, Some("route retired"))
    );
    assert_eq!(
        b.record(held, answered(200, now), Verdict::Delivered, now)
            .await,
        Err(LeaseError::Fenced),
        "the stalled relay's outcome comes too late"
    );
    assert_eq!(view(&b, held.id).await.state, DeliveryState::Dead);
}

pub async fn redeliver_replays_every_delivery_with_the_same_key_except_in_flight<
    B: DeliveryBackend,
>() {
    let (b, clock) = fresh::<B>().await;
    let each = each_state(&b, &clock).await;
    clock.advance(Duration::from_secs(1));
    let now = clock.now();
    assert_eq!(b.redeliver(&key("evt-1"), now).await.expect("redeliver"), 2);
    for c in [&each.delivered, &each.dead] {
        let v = view(&b, c.id).await;
        assert_eq!(
            (v.state, v.next_attempt_at),
            (DeliveryState::Pending, Some(now))
        );
    }
    assert_eq!(b.redeliver(&key("evt-3"), now).await.expect("redeliver"), 1);
    assert_eq!(state(&b, each.in_flight.id).await, DeliveryState::InFlight);
    assert_eq!(b.redeliver(&key("evt-9"), now).await.expect("redeliver"), 0);
    // Owed ones too: an uncertain delivery is sent again (the operator's call, as `retry`),
    // a retrying one at once rather than after its backoff.
    assert_eq!(b.redeliver(&key("evt-2"), now).await.expect("redeliver"), 2);
    for c in [&each.uncertain, &each.retrying] {
        let v = view(&b, c.id).await;
        assert_eq!(
            (v.state, v.next_attempt_at),
            (DeliveryState::Pending, Some(now))
        );
    }
    let again = claim(&b, now, 10).await;
    let seen: Vec<(i64, &str, u32, Budget)> = again
        .iter()
        .map(|c| (c.id, c.idempotency_key.as_str(), c.attempts, c.budget))
        .collect();
    let replayed = Budget {
        attempts_before: 1,
        since: now,
    };
    let unsent = Budget {
        attempts_before: 0,
        since: now,
    };
    let expect = [
        (each.delivered.id, "shop:evt-1", 1, replayed),
        (each.dead.id, "shop:evt-1", 1, replayed),
        (each.uncertain.id, "shop:evt-2", 1, replayed),
        (each.retrying.id, "shop:evt-2", 1, replayed),
        (each.pending, "shop:evt-3", 0, unsent),
    ];
    assert_eq!(
        seen, expect,
        "same rows, same keys, history kept, budgets fresh"
    );
    let held = &each.in_flight;
    b.record(held, answered(200, now), Verdict::Delivered, now)
        .await
        .expect("lease untouched");
}

pub async fn listing_filters_by_state_route_and_key_and_pages_with_a_cursor<B: DeliveryBackend>() {
    let (b, clock) = fresh::<B>().await;
    let each = each_state(&b, &clock).await;
    let list = |filter: DeliveryFilter| {
        let b = b.clone();
        async move {
            let page = b.deliveries(filter).await.expect("deliveries");
            (
                page.items.iter().map(|d| d.id).collect::<Vec<_>>(),
                page.next,
            )
        }
    };
    let all = DeliveryFilter {
        limit: 100,
        ..DeliveryFilter::default()
    };
    assert_eq!(list(all.clone()).await, (each.ids().to_vec(), None));
    for (state, id) in [
        (DeliveryState::Delivered, each.delivered.id),
        (DeliveryState::Dead, each.dead.id),
        (DeliveryState::Uncertain, each.uncertain.id),
        (DeliveryState::Retrying, each.retrying.id),
        (DeliveryState::InFlight, each.in_flight.id),
        (DeliveryState::Pending, each.pending),
    ] {
        let filter = DeliveryFilter {
            state: Some(state),
            ..all.clone()
        };
        assert_eq!(list(filter).await, (vec![id], None), "{state}");
    }
    let route_b = DeliveryFilter {
        route: Some("b".into()),
        ..all.clone()
    };
    let expect = vec![each.dead.id, each.retrying.id, each.pending];
    assert_eq!(list(route_b.clone()).await, (expect, None));
    let dead_b = DeliveryFilter {
        state: Some(DeliveryState::Dead),
        ..route_b
    };
    assert_eq!(list(dead_b).await, (vec![each.dead.id], None));
    let evt_2 = DeliveryFilter {
        key: Some(key("evt-2")),
        ..all.clone()
    };
    assert_eq!(
        list(evt_2.clone()).await,
        (vec![each.uncertain.id, each.retrying.id], None)
    );
    let evt_2_a = DeliveryFilter {
        route: Some("a".into()),
        ..evt_2
    };
    assert_eq!(list(evt_2_a).await, (vec![each.uncertain.id], None));
    let nowhere = DeliveryFilter {
        route: Some("z".into()),
        ..all.clone()
    };
    assert_eq!(list(nowhere).await, (vec![], None));
    // Pages of two: the cursor is the last id shown, and the last page has none.
    let ids = each.ids();
    let mut after = None;
    for chunk in ids.chunks(2) {
        let (got, next) = list(DeliveryFilter {
            after,
            limit: 2,
            ..all.clone()
        })
        .await;
        assert_eq!(got, chunk);
        after = next;
    }
    assert_eq!(after, None);
    let zero = DeliveryFilter { limit: 0, ..all };
    assert_eq!(
        list(zero).await,
        (vec![ids[0]], Some(ids[0])),
        "a limit of 0 shows one"
    );
    let retrying = view(&b, each.retrying.id).await;
    assert_eq!(
        retrying.next_attempt_at,
        Some(each.created[2].plus(Duration::from_secs(60)))
    );
    assert_eq!(
        (retrying.last_status, retrying.created_at),
        (Some(503), each.created[1])
    );
    assert_eq!(view(&b, each.delivered.id).await.next_attempt_at, None);
}
