//! Errors the framework answers by itself still reach the client as problem documents with
//! their status and headers: a path segment or query that does not parse, a method a route
//! does not take, a path no route has.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use oncebox_testkit::run;

use crate::support::{TestGateway, admin_get, admin_post, post};

#[test]
fn a_path_segment_that_is_not_utf8_is_a_problem_and_stores_nothing() {
    run(async {
        let gw = TestGateway::new();
        // As a source name, it names no source: the ingress answers it like any other.
        let a = gw.send(post("%FF", &[], r#"{"id":"e1"}"#)).await;
        assert_eq!(
            (a.status, a.slug().as_str()),
            (StatusCode::NOT_FOUND, "unknown-source"),
            "{a:?}"
        );
        // As an event's address it names no valid key, as the document says.
        for get in [
            admin_get("/v1/sources/open/events/%FF"),
            admin_post("/v1/sources/open/events/%FF/redeliver", ""),
        ] {
            let a = gw.send(get).await;
            assert_eq!(
                (a.status, a.slug().as_str()),
                (StatusCode::BAD_REQUEST, "invalid-key"),
                "{a:?}"
            );
            assert!(
                a.json()["detail"].as_str().unwrap().contains("UTF-8"),
                "{a:?}"
            );
        }
        // Elsewhere the framework refuses it, as a problem document.
        let a = gw.send(admin_post("/v1/deliveries/%FF/retry", "")).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{a:?}");
        assert_eq!(a.headers["content-type"], "application/problem+json");
        let page = gw.send(admin_get("/v1/events")).await.json();
        assert_eq!(page["items"].as_array().unwrap().len(), 0, "{page}");
    });
}

/// Every problem document tells a browser not to sniff it: the gateway's own (an unknown
/// source, a bad signature, a missing admin token) and the framework's rewritten ones (a
/// method not taken, a path no route has, a segment that does not parse).
#[test]
fn every_problem_says_nosniff() {
    run(async {
        let gw = TestGateway::new();
        let unsigned = Request::post("/v1/sources/shop/events")
            .header("content-type", "application/json")
            .body(Body::from(r#"{"id":"e1"}"#))
            .unwrap();
        let no_token = Request::get("/v1/stats").body(Body::empty()).unwrap();
        for request in [
            post("nowhere", &[], r#"{"id":"e1"}"#),
            unsigned,
            no_token,
            Request::delete("/v1/sources/shop/events")
                .body(Body::empty())
                .unwrap(),
            admin_get("/v1/no-such-path"),
            admin_post("/v1/deliveries/%FF/retry", ""),
        ] {
            let what = format!("{} {}", request.method(), request.uri());
            let a = gw.send(request).await;
            assert_eq!(
                a.headers["content-type"], "application/problem+json",
                "{what}: {a:?}"
            );
            assert_eq!(
                a.headers
                    .get("x-content-type-options")
                    .map(|v| v.as_bytes()),
                Some(&b"nosniff"[..]),
                "{what}: {a:?}"
            );
        }
    });
}

#[test]
fn a_method_a_route_does_not_take_is_a_405_problem_with_allow() {
    run(async {
        let gw = TestGateway::new();
        for method in ["GET", "PUT", "DELETE"] {
            let a = gw
                .send(
                    Request::builder()
                        .method(method)
                        .uri("/v1/sources/open/events")
                        .body(Body::empty())
                        .unwrap(),
                )
                .await;
            assert_eq!(
                (a.status, a.slug().as_str()),
                (StatusCode::METHOD_NOT_ALLOWED, "method-not-allowed"),
                "{method}"
            );
            assert_eq!(a.headers["allow"], "POST", "{method}");
            assert_eq!(a.json()["status"], 405);
        }
    });
}

#[test]
fn a_path_no_route_has_is_a_404_problem() {
    run(async {
        let gw = TestGateway::new();
        for path in ["/v2/nothing", "/v1/sources/open/events/e1/unknown"] {
            let a = gw.send(admin_get(path)).await;
            assert_eq!(
                (a.status, a.slug().as_str()),
                (StatusCode::NOT_FOUND, "not-found"),
                "{path}"
            );
        }
    });
}

#[test]
fn a_query_or_id_that_does_not_parse_is_a_problem() {
    run(async {
        let gw = TestGateway::new();
        for path in [
            "/v1/events?after=x",
            "/v1/events?limit=-1",
            "/v1/deliveries?after=x",
            "/v1/deliveries?limit=many",
        ] {
            let a = gw.send(admin_get(path)).await;
            assert_eq!(
                (a.status, a.slug().as_str()),
                (StatusCode::BAD_REQUEST, "invalid-query"),
                "{path}"
            );
        }
        let retry = Request::post("/v1/deliveries/abc/retry")
            .header(
                "authorization",
                format!("Bearer {}", crate::support::ADMIN_TOKEN),
            )
            .body(Body::empty())
            .unwrap();
        let a = gw.send(retry).await;
        assert_eq!(
            (a.status, a.slug().as_str()),
            (StatusCode::BAD_REQUEST, "bad-request"),
            "{a:?}"
        );
    });
}

/// Headers past what an event stores are refused as a problem, not stored: a source's body
/// limit could otherwise be passed in them.
#[test]
fn headers_past_what_an_event_stores_are_refused_and_nothing_is_stored() {
    run(async {
        let gw = TestGateway::new();
        let long = "a".repeat(oncebox_gateway::MAX_HEADER_BYTES);
        let a = gw
            .send(post("open", &[("x-long", long.as_str())], r#"{"id":"e1"}"#))
            .await;
        assert_eq!(
            (a.status, a.slug().as_str()),
            (
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "headers-too-large"
            ),
            "{a:?}"
        );
        assert_eq!(gw.rows(), 0);
        let fits = "a".repeat(oncebox_gateway::MAX_HEADER_BYTES / 2);
        let a = gw
            .send(post("open", &[("x-long", fits.as_str())], r#"{"id":"e1"}"#))
            .await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "{a:?}");
        assert_eq!(gw.rows(), 1);
    });
}
