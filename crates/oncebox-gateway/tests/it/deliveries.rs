//! The deliveries admin API through the router: events fan out to matching routes, and
//! operators list, retry, resolve and redeliver.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use oncebox_core::delivery::Verdict;
use oncebox_core::relay_store::{AttemptRecord, DeliveryStore, STATUS_RECHECK};
use oncebox_core::route::Route;
use oncebox_core::{Clock, Source};
use oncebox_testkit::run;

use crate::support::{ADMIN_TOKEN, TestGateway, admin_get, admin_post, config, post, route};

/// A gateway with one route taking every event of `open`, and the delivery of its event `e1`.
async fn one_delivery() -> (TestGateway, i64) {
    let mut cfg = config();
    cfg.routes = vec![route("all", None)];
    let gw = TestGateway::with(cfg, oncebox_sqlite::Options::new);
    gw.send(post("open", &[], r#"{"id":"e1"}"#)).await;
    let id = gw.send(admin_get("/v1/deliveries")).await.json()["items"][0]["id"]
        .as_i64()
        .unwrap();
    (gw, id)
}

/// What a relay claims at `now`: every due delivery, each under a minute's lease.
/// Claims every due delivery and records the first one's attempt as timed out: uncertain.
async fn left_uncertain(gw: &TestGateway) -> oncebox_core::relay_store::Claimed {
    let now = gw.clock.now();
    let claimed = claim_all(gw, now).await;
    let attempt = AttemptRecord {
        started_at: now,
        duration: Duration::ZERO,
        status: None,
        error: Some("timeout".into()),
    };
    let verdict = Verdict::Uncertain(STATUS_RECHECK.0);
    DeliveryStore::record(&gw.inbox, &claimed[0], attempt, verdict, now)
        .await
        .unwrap();
    claimed.into_iter().next().unwrap()
}

async fn claim_all(
    gw: &TestGateway,
    now: oncebox_core::Timestamp,
) -> Vec<oncebox_core::relay_store::Claimed> {
    gw.inbox
        .claim(now, 10, Duration::from_secs(60), &[])
        .await
        .unwrap()
}

/// A `raw` source's body need not be JSON even when a route filters its events: such a body
/// matches no filter, and routes without one still take it.
#[test]
fn a_raw_source_routes_a_form_body_past_filters() {
    run(async {
        let mut cfg = config();
        cfg.routes = [route("all", None), route("paid", Some(("/type", "paid")))]
            .map(|r| Route {
                sources: vec![Source::new("plain").unwrap()],
                ..r
            })
            .to_vec();
        let gw = TestGateway::with(cfg, oncebox_sqlite::Options::new);
        let form = gw
            .send(post("plain", &[("idempotency-key", "f1")], "type=paid"))
            .await;
        assert_eq!(form.status, StatusCode::ACCEPTED, "{form:?}");
        let json = gw
            .send(post(
                "plain",
                &[("idempotency-key", "j1")],
                r#"{"type":"paid"}"#,
            ))
            .await;
        assert_eq!(json.status, StatusCode::ACCEPTED, "{json:?}");
        let items = gw.send(admin_get("/v1/deliveries")).await.json()["items"].clone();
        let mut taken: Vec<(String, String)> = items
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                let text = |k: &str| d[k].as_str().unwrap_or_default().to_owned();
                (text("route"), text("event_id"))
            })
            .collect();
        taken.sort();
        let expected = [("all", "f1"), ("all", "j1"), ("paid", "j1")]
            .map(|(r, e)| (r.to_owned(), e.to_owned()));
        assert_eq!(taken, expected, "{items}");
    });
}

#[test]
fn accepted_events_fan_out_to_matching_routes_only() {
    run(async {
        let mut cfg = config();
        cfg.routes = vec![route("all", None), route("paid", Some(("/type", "paid")))];
        let gw = TestGateway::with(cfg, oncebox_sqlite::Options::new);
        gw.send(post("open", &[], r#"{"id":"e1","type":"paid"}"#))
            .await;
        gw.send(post("open", &[], r#"{"id":"e2","type":"created"}"#))
            .await;
        gw.send(post("open", &[], r#"{"id":"e1","type":"paid"}"#))
            .await; // a replay adds none
        gw.send(post("derived", &[], r#"{"order_id":"1","type":"paid"}"#))
            .await; // other source
        let list = gw
            .send(admin_get("/v1/deliveries?state=pending"))
            .await
            .json();
        let got: Vec<(String, String)> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                (
                    d["route"].as_str().unwrap().to_owned(),
                    d["event_id"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("all".into(), "e1".into()),
                ("paid".into(), "e1".into()),
                ("all".into(), "e2".into())
            ]
        );
        let paid = gw.send(admin_get("/v1/deliveries?route=paid")).await.json();
        assert_eq!(paid["items"][0]["idempotency_key"], "open:e1");
        let event = gw
            .send(admin_get("/v1/sources/open/events/e1"))
            .await
            .json();
        assert_eq!(event["deliveries"].as_array().unwrap().len(), 2);
        let bad = gw.send(admin_get("/v1/deliveries?state=lost")).await;
        assert_eq!(
            (bad.status, bad.slug().as_str()),
            (StatusCode::BAD_REQUEST, "invalid-query")
        );
    });
}

#[test]
fn operators_retry_resolve_and_redeliver_with_the_same_key() {
    run(async {
        let (gw, id) = one_delivery().await;
        // Pending: owed already, so not retryable.
        assert_eq!(
            gw.send(admin_post(&format!("/v1/deliveries/{id}/retry"), ""))
                .await
                .status,
            StatusCode::CONFLICT
        );
        let resolve = |outcome: &str| {
            admin_post(
                &format!("/v1/deliveries/{id}/resolve"),
                &format!(r#"{{"outcome":"{outcome}","note":"checked"}}"#),
            )
        };
        // A relay's attempt ends uncertain.
        left_uncertain(&gw).await;
        let bad = gw
            .send(admin_post(
                &format!("/v1/deliveries/{id}/resolve"),
                r#"{"outcome":"maybe"}"#,
            ))
            .await;
        assert_eq!(bad.status, StatusCode::BAD_REQUEST);
        let ok = gw.send(resolve("delivered")).await;
        assert_eq!(ok.status, StatusCode::OK, "{ok:?}");
        let d = &gw
            .send(admin_get("/v1/deliveries?state=delivered"))
            .await
            .json()["items"][0];
        assert_eq!(
            (d["id"].as_i64(), d["note"].as_str()),
            (Some(id), Some("checked"))
        );
        // Redeliver: due again, same key.
        let again = gw
            .send(admin_post("/v1/sources/open/events/e1/redeliver", ""))
            .await;
        assert_eq!(again.json()["redelivered"], 1);
        let d = &gw
            .send(admin_get("/v1/deliveries?state=pending"))
            .await
            .json()["items"][0];
        assert_eq!(d["idempotency_key"], "open:e1");
        // Nothing to redeliver: an unknown event, and one that no route took, are told apart.
        let none = gw
            .send(admin_post("/v1/sources/open/events/nope/redeliver", ""))
            .await;
        assert_eq!(
            (none.status, none.slug().as_str()),
            (StatusCode::NOT_FOUND, "event-not-found")
        );
        let unrouted = gw
            .send(post("fields", &[], r#"{"id":"e2","amount":1}"#))
            .await;
        assert_eq!(unrouted.status, StatusCode::ACCEPTED);
        let none = gw
            .send(admin_post("/v1/sources/fields/events/e2/redeliver", ""))
            .await;
        assert_eq!(
            (none.status, none.slug().as_str()),
            (StatusCode::NOT_FOUND, "no-deliveries")
        );
    });
}

#[test]
fn delivery_endpoints_need_the_token_and_change_nothing_without_it() {
    run(async {
        let (gw, _) = one_delivery().await;
        // An uncertain delivery: retry, resolve and redeliver would each change it.
        let id = left_uncertain(&gw).await.id;
        let state = || async {
            let d = gw.send(admin_get("/v1/deliveries")).await.json();
            d["items"][0]["state"].as_str().unwrap().to_owned()
        };
        assert_eq!(state().await, "uncertain");
        let writes = [
            (format!("/v1/deliveries/{id}/retry"), String::new()),
            (
                format!("/v1/deliveries/{id}/resolve"),
                r#"{"outcome":"delivered","note":"forged"}"#.to_owned(),
            ),
            (
                "/v1/sources/open/events/e1/redeliver".to_owned(),
                String::new(),
            ),
        ];
        for (path, body) in &writes {
            // None, a wrong token, and the right token without its `Bearer` scheme.
            for token in [None, Some("Bearer wrong-token-0123456"), Some(ADMIN_TOKEN)] {
                let mut r = Request::post(path.as_str());
                if let Some(t) = token {
                    r = r.header("authorization", t);
                }
                let a = gw.send(r.body(Body::from(body.clone())).unwrap()).await;
                assert_eq!(
                    (a.status, a.slug().as_str()),
                    (StatusCode::UNAUTHORIZED, "unauthorized"),
                    "{path} with {token:?}"
                );
            }
        }
        for path in ["/v1/deliveries", "/v1/activity"] {
            let a = gw
                .send(Request::get(path).body(Body::empty()).unwrap())
                .await;
            assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{path}");
        }
        assert_eq!(state().await, "uncertain", "no refused request changed it");
        let attempts = gw.inbox.attempts(id).await.unwrap();
        assert_eq!(attempts.len(), 1);
        // The same request with the token does take effect.
        let ok = gw.send(admin_post(&writes[1].0, &writes[1].1)).await;
        assert_eq!(ok.status, StatusCode::OK, "{ok:?}");
        assert_eq!(state().await, "delivered");
    });
}

#[test]
fn retry_and_resolve_tell_a_missing_delivery_from_a_refusing_state() {
    run(async {
        let (gw, id) = one_delivery().await;
        // In flight: a relay holds it and its outcome is on the way.
        assert_eq!(claim_all(&gw, gw.clock.now()).await.len(), 1);
        let resolve = r#"{"outcome":"dead"}"#;
        // A note may be left out or `null`: both mean none, not a malformed request.
        let null_note = r#"{"outcome":"dead","note":null}"#;
        for (action, body) in [("retry", ""), ("resolve", resolve), ("resolve", null_note)] {
            let missing = gw
                .send(admin_post(
                    &format!("/v1/deliveries/{}/{action}", id + 1),
                    body,
                ))
                .await;
            assert_eq!(
                (missing.status, missing.slug().as_str()),
                (StatusCode::NOT_FOUND, "no-delivery"),
                "{action}"
            );
            let held = gw
                .send(admin_post(&format!("/v1/deliveries/{id}/{action}"), body))
                .await;
            let slug = if action == "retry" {
                "not-retryable"
            } else {
                "not-resolvable"
            };
            assert_eq!(
                (held.status, held.slug().as_str()),
                (StatusCode::CONFLICT, slug),
                "{action}"
            );
            let detail = held.json()["detail"].as_str().unwrap().to_owned();
            assert!(detail.contains("is in_flight"), "{action}: {detail}");
        }
    });
}

#[test]
fn empty_query_parameters_mean_no_filter() {
    run(async {
        let (gw, _) = one_delivery().await;
        // The URL templates of the API, sent as written.
        for path in [
            "/v1/deliveries?state=&route=",
            "/v1/deliveries?state=&route=&after=&limit=",
            "/v1/events?source=&after=&limit=",
        ] {
            let a = gw.send(admin_get(path)).await;
            assert_eq!(a.status, StatusCode::OK, "{path}: {a:?}");
            assert_eq!(a.json()["items"].as_array().unwrap().len(), 1, "{path}");
        }
        // A value that is given must still parse, and a parameter must be one the listing
        // takes: a misspelt filter listed everything.
        for path in [
            "/v1/events?after=abc",
            "/v1/deliveries?limit=-1",
            "/v1/deliveries?status=uncertain",
            "/v1/deliveries?State=dead",
            "/v1/events?state=completed",
        ] {
            let a = gw.send(admin_get(path)).await;
            assert_eq!(
                (a.status, a.slug().as_str()),
                (StatusCode::BAD_REQUEST, "invalid-query"),
                "{path}"
            );
            assert_eq!(a.json()["title"], "Invalid request");
        }
    });
}

/// Redeliver never re-sends a delivery a relay holds: with every delivery of the event in
/// flight, nothing changes and the answer says why (409 `in-flight`), not that no route took it.
#[test]
fn redeliver_of_an_event_whose_deliveries_are_in_flight_is_409() {
    run(async {
        let (gw, id) = one_delivery().await;
        let now = gw.clock.now();
        let claimed = claim_all(&gw, now).await;
        assert_eq!(claimed.len(), 1);
        let a = gw
            .send(admin_post("/v1/sources/open/events/e1/redeliver", ""))
            .await;
        assert_eq!(
            (a.status, a.slug().as_str()),
            (StatusCode::CONFLICT, "in-flight"),
            "{a:?}"
        );
        let d = gw.send(admin_get("/v1/deliveries")).await.json()["items"][0].clone();
        assert_eq!(
            (d["id"].as_i64(), d["state"].as_str()),
            (Some(id), Some("in_flight"))
        );
    });
}

/// What no store could take, or could read two ways, is a 400 before the store is asked: a NUL
/// in a route filter or a note (PostgreSQL cannot bind one, and answered `503`: retry for ever),
/// and a resolve body naming a member twice (an operator's settlement is final: not its last).
#[test]
fn a_nul_or_a_member_named_twice_is_refused_before_the_store() {
    run(async {
        let (gw, id) = one_delivery().await;
        let a = gw.send(admin_get("/v1/deliveries?route=a%00b")).await;
        assert_eq!(
            (a.status, a.slug().as_str()),
            (StatusCode::BAD_REQUEST, "invalid-query")
        );
        let resolve = format!("/v1/deliveries/{id}/resolve");
        for body in [
            r#"{"outcome":"dead","outcome":"delivered"}"#,
            r#"{"outcome":"dead","note":"a\u0000b"}"#,
            r#"{"outcome":"dead","note":"a","note":"b"}"#,
        ] {
            let a = gw.send(admin_post(&resolve, body)).await;
            assert_eq!(
                (a.status, a.slug().as_str()),
                (StatusCode::BAD_REQUEST, "invalid-json"),
                "{body}"
            );
        }
        // A note with other control characters (a line break) is a note: the pending delivery
        // is given up with it.
        let a = gw
            .send(admin_post(&resolve, r#"{"outcome":"dead","note":"a\nb"}"#))
            .await;
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
    });
}
