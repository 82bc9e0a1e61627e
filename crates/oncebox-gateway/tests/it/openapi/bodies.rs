//! The JSON bodies the document declares against real ones: the ingress's answer, the lists'
//! pages, one event with its deliveries, and the resolve body the handler reads.

use std::time::Duration;

use axum::http::StatusCode;
use oncebox_core::Clock;
use oncebox_core::delivery::Verdict;
use oncebox_core::relay_store::{AttemptRecord, DeliveryStore, STATUS_RECHECK};
use oncebox_testkit::run;
use serde_json::Value;

use super::{conform, document};
use crate::support::{TestGateway, admin_get, admin_post, post};

/// A gateway whose `open` events are delivered by one route, holding `e1` (replayed, its
/// delivery tried once and now uncertain) and `e2` from `open`, and two `ordered` events, the
/// second stale; with the answers to those posts.
pub(super) async fn populated() -> (TestGateway, Vec<crate::support::Answer>) {
    let mut config = crate::support::config();
    config.routes = vec![crate::support::route("all", None)];
    let gw = TestGateway::with(config, oncebox_sqlite::Options::new);
    let ordered = crate::support::ordered_event;
    let mut answers = Vec::new();
    for (source, body) in [
        ("open", r#"{"id":"e1"}"#.to_owned()),
        ("open", r#"{"id":"e1"}"#.to_owned()),
        ("open", r#"{"id":"e2"}"#.to_owned()),
        ("ordered", ordered("o2", 2)),
        ("ordered", ordered("o1", 1)),
    ] {
        answers.push(gw.send(post(source, &[], body)).await);
    }
    let now = gw.clock.now();
    let claimed = gw.inbox.claim(now, 1, Duration::from_secs(60), &[]).await;
    let attempt = AttemptRecord {
        started_at: now,
        duration: Duration::from_millis(12),
        status: Some(503),
        error: None,
    };
    DeliveryStore::record(
        &gw.inbox,
        &claimed.unwrap()[0],
        attempt,
        Verdict::Uncertain(STATUS_RECHECK.0),
        now,
    )
    .await
    .unwrap();
    (gw, answers)
}

/// Checks that answer `a` of `method path` has a declared JSON body it fits.
fn fits(doc: &Value, method: &str, path: &str, a: &crate::support::Answer) {
    let response = &doc["paths"][path][method]["responses"][a.status.as_str()];
    let schema = &response["content"]["application/json"]["schema"];
    assert!(
        schema.is_object(),
        "{method} {path} {}: no body declared",
        a.status
    );
    let at = format!("{method} {path} {}", a.status);
    conform::conforms(doc, schema, &a.json(), &at).unwrap();
}

/// Every JSON body the ingress and the lists answer fits its declared schema: the 202 of a new,
/// replayed and stale event, a list's first and last page, and an event with its deliveries.
#[test]
fn declared_bodies_fit_real_answers() {
    run(async {
        let (gw, answers) = populated().await;
        let doc = document(&gw).await;
        for a in &answers {
            assert_eq!(a.status, StatusCode::ACCEPTED, "{a:?}");
            fits(&doc, "post", "/v1/sources/{source}/events", a);
        }
        assert!(answers[1].replayed(), "{:?}", answers[1]);
        assert_eq!(answers[4].json()["stale"], true, "{:?}", answers[4]);
        for (path, uri, next) in [
            ("/v1/events", "/v1/events?limit=1", true),
            ("/v1/events", "/v1/events", false),
            ("/v1/deliveries", "/v1/deliveries?limit=1", true),
            ("/v1/deliveries", "/v1/deliveries", false),
        ] {
            let page = gw.send(admin_get(uri)).await;
            assert_eq!(page.status, StatusCode::OK, "{page:?}");
            fits(&doc, "get", path, &page);
            let body = page.json();
            assert!(
                !body["items"].as_array().unwrap().is_empty(),
                "{uri}: {body}"
            );
            assert_eq!(body["next"].is_string(), next, "{uri}: {body}");
        }
        let event = gw.send(admin_get("/v1/sources/open/events/e1")).await;
        fits(
            &doc,
            "get",
            "/v1/sources/{source}/events/{event_id}",
            &event,
        );
        let log = &event.json()["deliveries"][0]["attempt_log"];
        assert_eq!(log.as_array().map(Vec::len), Some(1), "{log}");
    });
}

/// The resolve body's schema takes what the handler takes: a body it declares reaches the
/// delivery (here none: 404), any other is 400 `invalid-json`.
#[test]
fn the_resolve_body_is_declared_as_the_handler_reads_it() {
    run(async {
        let gw = TestGateway::new();
        let doc = document(&gw).await;
        let body = &doc["paths"]["/v1/deliveries/{id}/resolve"]["post"]["requestBody"];
        let schema = &body["content"]["application/json"]["schema"];
        let bodies = [
            r#"{"outcome":"delivered"}"#,
            r#"{"outcome":"dead","note":null}"#,
            r#"{"outcome":"dead","note":"by hand","by":"ops"}"#,
            r#"{}"#,
            r#"{"note":"x"}"#,
            r#"{"outcome":"lost"}"#,
            r#"{"outcome":null}"#,
            r#"{"outcome":"dead","note":5}"#,
            // PostgreSQL keeps no NUL: the handler refuses it, whichever store is behind.
            r#"{"outcome":"dead","note":"a\u0000b"}"#,
            r#"{"outcome":"dead","note":"\u0001\u007f"}"#,
            r#"[]"#,
            r#""dead""#,
            // serde would take these as the struct's fields in order; the handler does not.
            r#"["dead"]"#,
            r#"["dead","note"]"#,
        ];
        for text in bodies {
            let value: Value = serde_json::from_str(text).unwrap();
            let declared = conform::conforms(&doc, schema, &value, text).is_ok();
            let a = gw.send(admin_post("/v1/deliveries/7/resolve", text)).await;
            let expected = if declared {
                "no-delivery"
            } else {
                "invalid-json"
            };
            assert_eq!(a.slug(), expected, "{text}: {a:?}");
        }
    });
}
