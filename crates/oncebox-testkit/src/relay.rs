//! The delivery conformance suite (DESIGN §2 delivery states, §6 relay), written once and run
//! against each backend through [`DeliveryBackend`] and `delivery_conformance!`: ingest here,
//! claims and verdicts in `relay/claim.rs`, operators' actions in `relay/operator.rs`, the
//! relay's own settlements in `relay/settle.rs`, retention in `relay/purge.rs`; a wall clock
//! set back under scheduled deliveries in `relay/jumps.rs` (SQLite only).

mod claim;
mod gauges;
mod holding;
mod jumps;
mod operator;
mod purge;
mod settle;

use std::future::Future;
use std::time::Duration;

use oncebox_core::delivery::{DeliveryState, Verdict};
use oncebox_core::relay_store::{
    AttemptRecord, Claimed, DeliveryFilter, DeliveryStore, DeliveryView,
};
use oncebox_core::store::{EventFilter, EventStore, Ingest, Order};
use oncebox_core::{Clock, Key, ManualClock, Meta, Processed, Timestamp};

pub use claim::*;
pub use gauges::*;
pub use holding::{Holding, OnClaim, OnWait};
pub use jumps::*;
pub use operator::*;
pub use purge::*;
pub use settle::*;

use crate::{EPOCH, event};

/// The gateway's and the relay's store on one storage: what the delivery suite exercises.
pub trait Stores: EventStore + DeliveryStore {}

impl<S: EventStore + DeliveryStore> Stores for S {}

/// A backend under the delivery suite: how to get a fresh store of it. Implemented on a type of
/// the backend's own tests, so the store itself needs no wrapper.
pub trait DeliveryBackend: 'static {
    type Store: EventStore + DeliveryStore;

    /// A new, empty store on `clock`.
    fn fresh_store(clock: ManualClock) -> impl Future<Output = Self::Store> + Send;

    /// Two handles on one new, empty storage, both open, as two processes or nodes open it (a
    /// gateway and a relay, two relays).
    fn fresh_pair(clock: ManualClock) -> impl Future<Output = (Self::Store, Self::Store)> + Send;

    /// Whether the storage this backend needs is there; a backend on an outside service
    /// answers with [`crate::service_url`], which skips (or fails under
    /// `ONCEBOX_REQUIRE_SERVICES=1`) when it is not.
    fn available() -> bool {
        true
    }
}

/// Every claim in the suite holds its lease this long.
pub const LEASE: Duration = Duration::from_secs(30);

const CONTENT_TYPE: &str = "application/vnd.test+json";

pub(crate) async fn fresh<B: DeliveryBackend>() -> (B::Store, ManualClock) {
    let clock = ManualClock::new(EPOCH);
    (B::fresh_store(clock.clone()).await, clock)
}

pub(crate) fn key(id: &str) -> Key {
    Key::parse("shop", id).expect("valid test key")
}

/// An event from `shop`, as the gateway hands it over, routed to `routes`.
pub(crate) fn ingest(id: &str, routes: &[&str], order: Option<(&str, i64)>) -> Ingest {
    let meta = Meta::new(Some(CONTENT_TYPE.into()));
    Ingest {
        event: event("shop", id, 1).with_meta(meta),
        order: order.map(|(entity, version)| Order {
            entity: entity.into(),
            version,
        }),
        accepted: b"accepted".to_vec(),
        stale: b"stale".to_vec(),
        routes: routes.iter().map(|r| (*r).to_owned()).collect(),
    }
}

/// Ingests a new event routed to `a` and `b`.
pub(crate) async fn accept<S: Stores>(b: &S, id: &str) {
    let out = b.ingest(ingest(id, &["a", "b"], None)).await;
    assert!(matches!(out, Ok(Processed::Applied(_))), "{id}: {out:?}");
}

/// The deliveries of one event, oldest first.
pub(crate) async fn of_event<S: Stores>(b: &S, id: &str) -> Vec<DeliveryView> {
    let filter = DeliveryFilter {
        key: Some(key(id)),
        limit: 100,
        ..DeliveryFilter::default()
    };
    b.deliveries(filter).await.expect("deliveries").items
}

pub(crate) async fn view<S: Stores>(b: &S, id: i64) -> DeliveryView {
    let filter = DeliveryFilter {
        after: Some(id - 1),
        limit: 1,
        ..DeliveryFilter::default()
    };
    let page = b.deliveries(filter).await.expect("deliveries");
    let found = page.items.into_iter().next().expect("delivery exists");
    assert_eq!(found.id, id);
    found
}

/// Claims on every route under [`LEASE`].
pub(crate) async fn claim<S: Stores>(b: &S, now: Timestamp, limit: usize) -> Vec<Claimed> {
    b.claim(now, limit, LEASE, &[]).await.expect("claim")
}

/// Claims every delivery due at `now` and records it delivered, as a relay whose receiver
/// answered 200 does; returns how many. For tests that need a record's deliveries finished.
pub async fn deliver_due<S: DeliveryStore>(store: &S, now: Timestamp) -> usize {
    let due = store
        .claim(now, usize::MAX, LEASE, &[])
        .await
        .expect("claim");
    for c in &due {
        store
            .record(c, answered(200, now), Verdict::Delivered, now)
            .await
            .expect("record delivered");
    }
    due.len()
}

pub(crate) fn answered(status: u16, at: Timestamp) -> AttemptRecord {
    AttemptRecord {
        started_at: at,
        duration: Duration::from_millis(120),
        status: Some(status),
        error: None,
    }
}

pub(crate) fn failed(error: &str, at: Timestamp) -> AttemptRecord {
    AttemptRecord {
        started_at: at,
        duration: Duration::from_millis(5000),
        status: None,
        error: Some(error.into()),
    }
}

pub(crate) fn keys_and_routes(claimed: &[Claimed]) -> Vec<(String, String)> {
    let pairs = claimed
        .iter()
        .map(|c| (c.idempotency_key.clone(), c.route.clone()));
    pairs.collect()
}

pub(crate) fn pair(key: &str, route: &str) -> (String, String) {
    (key.to_owned(), route.to_owned())
}

pub async fn accepted_event_gets_one_pending_delivery_per_route_keyed_by_source_and_event_id<
    B: DeliveryBackend,
>() {
    let (b, clock) = fresh::<B>().await;
    accept(&b, "evt-1").await;
    let ds = of_event(&b, "evt-1").await;
    let routes: Vec<&str> = ds.iter().map(|d| d.route.as_str()).collect();
    assert_eq!(routes, ["a", "b"]);
    for d in &ds {
        assert_eq!(
            (d.key.clone(), d.state, d.attempts),
            (key("evt-1"), DeliveryState::Pending, 0)
        );
        assert_eq!(
            (d.created_at, d.next_attempt_at),
            (clock.now(), Some(clock.now()))
        );
        assert_eq!(
            (d.last_status, &d.last_error, &d.note),
            (None, &None, &None)
        );
    }
    let claimed = claim(&b, clock.now(), 10).await;
    assert_eq!(
        keys_and_routes(&claimed),
        [pair("shop:evt-1", "a"), pair("shop:evt-1", "b")]
    );
    for c in &claimed {
        assert_eq!(
            (c.key.clone(), c.attempts, c.created_at),
            (key("evt-1"), 0, clock.now())
        );
        assert_eq!(c.payload, event("shop", "evt-1", 1).payload);
        assert_eq!(c.content_type, CONTENT_TYPE);
    }
}

/// An event whose delivery no target could carry (a route name with a space, a key ending with
/// one: the library takes both, the gateway neither) is refused as input, alone: before, it
/// failed its whole batch as a storage error, on every try. Its batch-mate is applied.
pub async fn an_event_no_delivery_could_carry_is_refused_alone<B: DeliveryBackend>() {
    use oncebox_core::{Invalid, ProcessError};
    let (b, _) = fresh::<B>().await;
    for order in [None, Some(("order-1", 1))] {
        let (bad_route, bad_key, good) = tokio::join!(
            b.ingest(ingest("evt-route", &["a b"], order)),
            b.ingest(ingest("evt-key ", &["a"], order)),
            b.ingest(ingest("evt-good", &["a"], None)),
        );
        for (what, out) in [("route", bad_route), ("key", bad_key)] {
            assert!(
                matches!(out, Err(ProcessError::Invalid(Invalid::Delivery(_)))),
                "{what}, {order:?}: {out:?}"
            );
        }
        let good = good.expect("the batch-mate");
        assert!(
            matches!(good, Processed::Applied(_)) || good.is_duplicate(),
            "{good:?}"
        );
        for id in ["evt-route", "evt-key "] {
            assert_eq!(
                b.event(&key(id)).await.expect("read"),
                None,
                "{id} kept nothing"
            );
        }
    }
    assert_eq!(of_event(&b, "evt-good").await.len(), 1);
}

pub async fn duplicate_ingest_adds_no_delivery<B: DeliveryBackend>() {
    let (b, _) = fresh::<B>().await;
    accept(&b, "evt-1").await;
    // Even with routes added since: a duplicate changes nothing, it only replays the answer.
    let again = b
        .ingest(ingest("evt-1", &["a", "b", "c"], None))
        .await
        .expect("ingest");
    assert!(again.is_duplicate(), "{again:?}");
    assert_eq!(of_event(&b, "evt-1").await.len(), 2);
}

/// A content type no header can carry on (blank, or past 1024 bytes) is delivered as JSON's, as
/// is an event without one, whichever way the store takes the event in (a guarded event and an
/// unguarded one take different paths on PostgreSQL).
pub async fn a_content_type_no_header_carries_is_delivered_as_jsons<B: DeliveryBackend>() {
    let (b, clock) = fresh::<B>().await;
    let long = "application/".to_owned() + &"x".repeat(1100);
    let cases = [
        ("blank", Some(""), None),
        ("long", Some(long.as_str()), None),
        ("none", None, None),
        ("blank-guarded", Some(""), Some(("order-1", 1))),
        ("long-guarded", Some(long.as_str()), Some(("order-2", 1))),
    ];
    for (id, content_type, order) in cases {
        let mut one = ingest(id, &["a"], order);
        one.event = one
            .event
            .with_meta(Meta::new(content_type.map(str::to_owned)));
        let out = b.ingest(one).await;
        assert!(matches!(out, Ok(Processed::Applied(_))), "{id}: {out:?}");
    }
    let claimed = claim(&b, clock.now(), 10).await;
    assert_eq!(claimed.len(), cases.len());
    for c in &claimed {
        assert_eq!(c.content_type, "application/json", "{}", c.key);
    }
}

/// The loop guard (`oncebox_core::hops`): each delivery carries one hop more than its event
/// arrived with, whichever way the store takes the event in.
pub async fn a_delivery_carries_one_hop_more_than_its_event_arrived_with<B: DeliveryBackend>() {
    let (b, clock) = fresh::<B>().await;
    let cases = [
        ("outside", 0, None),
        ("relayed", 3, None),
        ("relayed-guarded", 7, Some(("order-1", 1))),
    ];
    for (id, hops, order) in cases {
        let mut one = ingest(id, &["a"], order);
        one.event.meta = one.event.meta.clone().with_hops(hops);
        let out = b.ingest(one).await;
        assert!(matches!(out, Ok(Processed::Applied(_))), "{id}: {out:?}");
    }
    // Operators see it too.
    let listed = of_event(&b, "relayed").await;
    assert_eq!(listed.iter().map(|d| d.hops).collect::<Vec<_>>(), [4]);
    let claimed = claim(&b, clock.now(), 10).await;
    let mut sent: Vec<(String, u32)> = claimed
        .iter()
        .map(|c| (c.key.event_id.as_str().to_owned(), c.hops))
        .collect();
    sent.sort();
    let expect = |id: &str, hops| (id.to_owned(), hops);
    assert_eq!(
        sent,
        [
            expect("outside", 1),
            expect("relayed", 4),
            expect("relayed-guarded", 8)
        ]
    );
}

pub async fn stale_event_gets_no_delivery<B: DeliveryBackend>() {
    let (b, _) = fresh::<B>().await;
    let newer = b
        .ingest(ingest("evt-2", &["a", "b"], Some(("order-7", 2))))
        .await;
    assert!(matches!(newer, Ok(Processed::Applied(_))), "{newer:?}");
    let older = b
        .ingest(ingest("evt-1", &["a", "b"], Some(("order-7", 1))))
        .await;
    assert!(older.as_ref().is_ok_and(Processed::is_stale), "{older:?}");
    assert!(of_event(&b, "evt-1").await.is_empty());
    assert_eq!(of_event(&b, "evt-2").await.len(), 2);
}

/// A listing leaves out what it never shows (a page could otherwise hold 500 bodies of up to
/// `max_body` each); one event's own view has its payload and first answer.
pub async fn listed_events_leave_their_payloads_out_and_one_events_view_has_them<
    B: DeliveryBackend,
>() {
    let (b, _) = fresh::<B>().await;
    accept(&b, "evt-1").await;
    accept(&b, "evt-2").await;
    let filter = EventFilter {
        limit: 10,
        ..EventFilter::default()
    };
    let page = b.events(filter).await.expect("events");
    let listed: Vec<(&str, usize, Option<usize>, Option<&str>)> = page
        .items
        .iter()
        .map(|e| {
            let response = e.response.as_ref().map(|r| r.body.len());
            let ct = e.meta.content_type.as_deref();
            (e.key.event_id.as_str(), e.payload.len(), response, ct)
        })
        .collect();
    let expect = (0, Some(0), Some(CONTENT_TYPE));
    let expect = |id| (id, expect.0, expect.1, expect.2);
    assert_eq!(listed, [expect("evt-1"), expect("evt-2")]);
    let key = Key::parse("shop", "evt-1").expect("key");
    let one = b.event(&key).await.expect("event").expect("stored");
    assert_eq!(one.payload, event("shop", "evt-1", 1).payload);
    assert_eq!(one.response.map(|r| r.body), Some(b"accepted".to_vec()));
}

/// Instantiates the delivery conformance suite for a backend type: one `#[test]` per behaviour.
#[macro_export]
macro_rules! delivery_conformance {
    ($backend:ty) => {
        $crate::read_conformance!($backend);
        $crate::delivery_conformance!(@tests $backend;
            accepted_event_gets_one_pending_delivery_per_route_keyed_by_source_and_event_id,
            duplicate_ingest_adds_no_delivery,
            an_event_no_delivery_could_carry_is_refused_alone,
            a_content_type_no_header_carries_is_delivered_as_jsons,
            a_delivery_carries_one_hop_more_than_its_event_arrived_with,
            stale_event_gets_no_delivery,
            listed_events_leave_their_payloads_out_and_one_events_view_has_them,
            claim_returns_due_deliveries_oldest_first_and_not_twice_while_leased,
            expired_lease_is_reclaimed_with_a_higher_token_and_the_old_holder_is_fenced,
            a_second_handle_on_the_storage_takes_over_with_a_higher_token,
            a_claimer_behind_by_less_than_a_lease_leaves_the_lease_alone,
            a_claim_with_a_stale_now_cuts_no_live_lease,
            record_sets_state_attempts_and_last_result_for_each_verdict,
            retrying_delivery_is_claimable_only_from_its_next_attempt,
            claim_takes_only_the_given_routes,
            retry_makes_dead_uncertain_and_retrying_due_now_and_refuses_other_states,
            resolve_settles_any_owed_or_dead_and_refuses_in_flight_and_delivered,
            resolve_takes_an_in_flight_delivery_whose_lease_ended_and_fences_its_relay,
            redeliver_replays_every_delivery_with_the_same_key_except_in_flight,
            listing_filters_by_state_route_and_key_and_pages_with_a_cursor,
            gauges_count_by_state_and_report_the_oldest_owed_delivery,
            unclaim_gives_a_claim_back_due_when_asked_without_an_attempt_and_only_to_its_holder,
            an_expired_claim_nobody_took_over_is_given_back_and_claimed_afresh,
            reconcile_settles_only_an_uncertain_delivery_and_puts_off_an_unanswered_check,
            a_key_accepted_again_after_its_purge_is_delivered_anew,
            an_entity_version_outlives_its_records_purge,
            a_record_whose_delivery_is_still_owed_outlives_its_retention,
            no_record_goes_while_any_of_its_deliveries_is_owed,
            an_error_or_a_note_holding_nul_is_recorded,
        );
    };
    (@tests $backend:ty; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                if <$backend as $crate::relay::DeliveryBackend>::available() {
                    $crate::run($crate::relay::$name::<$backend>());
                }
            }
        )*
    };
}
