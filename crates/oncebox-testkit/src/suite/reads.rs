//! What the operators' reads of the gateway's store (`EventStore::conflicts` and
//! `EventStore::activity`) are tested with: events as the gateway hands them over, and the
//! macro that runs those tests on each backend's store through [`DeliveryBackend`].

use std::time::Duration;

use oncebox_core::store::{EventStore, Ingest, Order};
use oncebox_core::{Event, Key, ManualClock, ProcessError, Processed};

use crate::relay::DeliveryBackend;

pub(crate) const SECOND: Duration = Duration::from_secs(1);
pub(crate) const MINUTE: Duration = Duration::from_secs(60);

/// A fresh store of `B` on a manual clock at [`crate::EPOCH`].
pub(crate) async fn fresh<B: DeliveryBackend>() -> (B::Store, ManualClock) {
    crate::relay::fresh::<B>().await
}

pub(crate) fn key(source: &str, id: &str) -> Key {
    Key::parse(source, id).expect("valid test key")
}

/// A JSON event with `payload` exactly as spelled.
pub(crate) fn json(source: &str, id: &str, payload: &str) -> Event {
    Event::json(key(source, id), payload).expect("valid test payload")
}

/// `event` as the gateway hands it over, without routes, under the ordering guard when `order`
/// is `(entity, version)`.
pub(crate) fn arrival(event: &Event, order: Option<(&str, i64)>) -> Ingest {
    Ingest {
        event: event.clone(),
        order: order.map(|(entity, version)| Order {
            entity: entity.into(),
            version,
        }),
        accepted: b"accepted".to_vec(),
        stale: b"stale".to_vec(),
        routes: Vec::new(),
    }
}

/// Ingests a new event, which must be applied.
pub(crate) async fn accept<S: EventStore>(s: &S, event: &Event) {
    let out = s.ingest(arrival(event, None)).await;
    assert!(matches!(out, Ok(Processed::Applied(_))), "{out:?}");
}

/// Ingests a new event under the ordering guard; its outcome.
pub(crate) async fn ordered<S: EventStore>(s: &S, event: &Event, version: i64) -> Processed {
    let out = s.ingest(arrival(event, Some(("order-1", version)))).await;
    out.expect("ordered ingest")
}

/// Ingests a delivery of a known key, which must be a duplicate.
pub(crate) async fn duplicate<S: EventStore>(s: &S, event: &Event) {
    let out = s.ingest(arrival(event, None)).await;
    assert!(out.as_ref().is_ok_and(Processed::is_duplicate), "{out:?}");
}

/// Ingests `offered` for a key whose stored payload is `stored`: a conflict naming both.
pub(crate) async fn refuse<S: EventStore>(s: &S, offered: &Event, stored: &Event) {
    let out = s.ingest(arrival(offered, None)).await;
    match out {
        Err(ProcessError::Conflict {
            stored: st,
            offered: of,
        }) => assert_eq!((st, of), (stored.fingerprint, offered.fingerprint)),
        other => panic!("expected a conflict, got {other:?}"),
    }
}

/// Instantiates the tests of the operators' reads for a backend type: one `#[test]` each, on
/// the store of its [`DeliveryBackend`].
#[macro_export]
macro_rules! read_conformance {
    ($backend:ty) => {
        $crate::read_conformance!(@tests $backend;
            conflicts_are_listed_oldest_first_with_both_fingerprints_and_the_refused_payload,
            a_record_stored_under_an_events_earlier_fingerprint_is_that_event,
            conflicts_filter_by_key_and_page_after_the_cursor,
            conflicts_of_a_store_without_any_are_an_empty_page,
            activity_of_an_empty_store_is_empty,
            activity_counts_records_per_source_and_state_and_conflicts_per_source,
            activity_buckets_arrivals_since_an_instant_per_bucket_and_source,
        );
    };
    (@tests $backend:ty; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                if <$backend as $crate::relay::DeliveryBackend>::available() {
                    $crate::run($crate::suite::$name::<$backend>());
                }
            }
        )*
    };
}
