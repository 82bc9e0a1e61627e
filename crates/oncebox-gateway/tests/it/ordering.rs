//! The ordering guard through the real router: an event older than the newest applied one for
//! its entity is 202 `stale`, kept and never delivered; what the guard reads and refuses.

use axum::http::StatusCode;
use oncebox_core::Source;
use oncebox_core::json::Pointer;
use oncebox_gateway::policy::{OrderGuard, SourcePolicy};
use oncebox_testkit::run;

use crate::support::{TestGateway, config, post};

#[test]
fn older_entity_version_is_202_stale_and_replayed_as_such() {
    run(async {
        let gw = TestGateway::new();
        let ev = crate::support::ordered_event;
        assert_eq!(
            gw.send(post("ordered", &[], ev("paid", 20))).await.status,
            StatusCode::ACCEPTED
        );
        let late = gw.send(post("ordered", &[], ev("created", 10))).await;
        assert_eq!(late.status, StatusCode::ACCEPTED);
        assert_eq!(late.json()["stale"], true);
        let again = gw.send(post("ordered", &[], ev("created", 10))).await;
        assert!(again.replayed());
        assert_eq!(again.body, late.body);
        let newer = gw.send(post("ordered", &[], ev("refunded", 30))).await;
        assert!(newer.json().get("stale").is_none(), "{newer:?}");
        // Events without the guarded fields are not ordered, and are counted so.
        let unguarded = || {
            let text = crate::support::metrics().render();
            let name = r#"oncebox_order_unguarded_total{source="ordered"}"#;
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        let before = unguarded();
        let other = gw.send(post("ordered", &[], r#"{"id":"ping"}"#)).await;
        assert_eq!(other.status, StatusCode::ACCEPTED);
        assert!(unguarded() >= before + 1.0, "counted unguarded");
        let bad = gw
            .send(post(
                "ordered",
                &[],
                r#"{"id":"x","created":"yesterday","data":{"object":{"id":"pi_1"}}}"#,
            ))
            .await;
        assert_eq!(
            (bad.status, bad.slug().as_str()),
            (StatusCode::BAD_REQUEST, "order-field-invalid")
        );
        // An entity no key can hold: a NUL, or longer than an event id may be.
        let long = "p".repeat(256);
        let digits = "9".repeat(256);
        for entity in [
            "\"pi\\u0000x\"".to_owned(),
            format!("\"{long}\""),
            "\" \"".to_owned(),
            digits,
        ] {
            let body = format!(
                r#"{{"id":"e-{}","created":1,"data":{{"object":{{"id":{entity}}}}}}}"#,
                entity.len()
            );
            let refused = gw.send(post("ordered", &[], body)).await;
            assert_eq!(
                (refused.status, refused.slug().as_str()),
                (StatusCode::BAD_REQUEST, "order-field-invalid"),
                "{entity:?}: {refused:?}"
            );
        }
    });
}

/// Versions in whole seconds (Stripe's `/created`) are often equal for two events of one
/// entity: neither is older, so both are applied, in arrival order.
#[test]
fn an_equal_entity_version_is_applied_not_stale() {
    run(async {
        let gw = TestGateway::new();
        let ev = crate::support::ordered_event;
        let first = gw.send(post("ordered", &[], ev("created", 20))).await;
        assert_eq!(first.status, StatusCode::ACCEPTED);
        let same = gw.send(post("ordered", &[], ev("captured", 20))).await;
        assert_eq!(same.status, StatusCode::ACCEPTED);
        assert!(same.json().get("stale").is_none(), "{same:?}");
        let older = gw.send(post("ordered", &[], ev("pending", 19))).await;
        assert_eq!(older.json()["stale"], true, "the guard still holds");
    });
}

#[test]
fn a_numeric_entity_is_the_same_entity_in_any_spelling_of_its_integer() {
    run(async {
        let gw = TestGateway::new();
        let at = |id: &str, entity: &str, created: i64| {
            format!(r#"{{"id":"{id}","created":{created},"data":{{"object":{{"id":{entity}}}}}}}"#)
        };
        let first = gw.send(post("ordered", &[], at("n-1", "1000", 20))).await;
        assert_eq!(first.status, StatusCode::ACCEPTED, "{first:?}");
        assert!(first.json().get("stale").is_none(), "{first:?}");
        // The same entity written as a string and as `1e3`: both older, so both stale.
        for (id, entity) in [("n-2", r#""1000""#), ("n-3", "1e3"), ("n-4", "10.0e2")] {
            let late = gw.send(post("ordered", &[], at(id, entity, 10))).await;
            assert_eq!(late.status, StatusCode::ACCEPTED, "{entity}: {late:?}");
            assert_eq!(late.json()["stale"], true, "{entity}: {late:?}");
        }
        // A fraction is no entity id.
        let half = gw.send(post("ordered", &[], at("n-5", "1.5", 30))).await;
        assert_eq!(
            (half.status, half.slug().as_str()),
            (StatusCode::BAD_REQUEST, "order-field-invalid"),
            "{half:?}"
        );
    });
}

/// A sender whose ids are unique only within a type (customer 7, order 7): with `type` named,
/// each (type, id) is its own entity, so an order's low version is not stale behind a
/// customer's high one; without it, the two are one entity.
#[test]
fn a_named_type_keeps_entities_of_one_id_apart() {
    run(async {
        let pointer = |p: &str| Pointer::parse(p).unwrap();
        let mut config = config();
        let mut guard = OrderGuard::new(pointer("/data/id"), pointer("/version"));
        for (name, kind) in [("typed", Some(pointer("/type"))), ("untyped", None)] {
            guard.kind = kind;
            let policy = SourcePolicy {
                order: Some(guard.clone()),
                ..SourcePolicy::open()
            };
            config.sources.insert(Source::new(name).unwrap(), policy);
        }
        let gw = TestGateway::with(config, oncebox_sqlite::Options::new);
        let event = |id: &str, kind: &str, version: i64| {
            format!(r#"{{"id":"{id}","type":"{kind}","data":{{"id":7}},"version":{version}}}"#)
        };
        for (source, order_stale) in [("typed", false), ("untyped", true)] {
            let customer = gw
                .send(post(source, &[], event("c", "customer", 100)))
                .await;
            assert!(customer.json().get("stale").is_none(), "{customer:?}");
            let order = gw.send(post(source, &[], event("o", "order", 3))).await;
            assert_eq!(order.status, StatusCode::ACCEPTED, "{order:?}");
            assert_eq!(
                order.json().get("stale").is_some(),
                order_stale,
                "{source}: {order:?}"
            );
            // Within one type the guard holds as ever.
            let old = gw
                .send(post(source, &[], event("c-old", "customer", 50)))
                .await;
            assert_eq!(old.json()["stale"], true, "{source}: {old:?}");
        }
        // A type of the wrong kind is refused, as an id is; an event without one is unguarded.
        let bad = r#"{"id":"b","type":{},"data":{"id":7},"version":1}"#;
        let refused = gw.send(post("typed", &[], bad)).await;
        assert_eq!(
            (refused.status, refused.slug().as_str()),
            (StatusCode::BAD_REQUEST, "order-field-invalid"),
            "{refused:?}"
        );
        let untyped = gw
            .send(post(
                "typed",
                &[],
                r#"{"id":"u","data":{"id":7},"version":1}"#,
            ))
            .await;
        assert!(untyped.json().get("stale").is_none(), "{untyped:?}");
    });
}
