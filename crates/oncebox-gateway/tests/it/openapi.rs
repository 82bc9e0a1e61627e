//! The OpenAPI document against the router: every route documented, every documented route
//! routed, every path parameter declared, the error answers the router gives documented for the
//! operation that gave them, and the declared bodies, keys and forms as the handlers read and
//! write them.

mod bodies;
mod conform;
mod inputs;
mod security;

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use oncebox_core::{Event, Key};
use oncebox_testkit::run;
use serde_json::Value;

use crate::support::{ADMIN_TOKEN, TestGateway, post};

#[test]
fn openapi_documents_every_route_and_every_documented_route_exists() {
    run(async {
        let gw = TestGateway::new();
        let doc = gw
            .send(Request::get("/openapi.json").body(Body::empty()).unwrap())
            .await
            .json();
        let paths = doc["paths"].as_object().unwrap();
        for (method, path) in oncebox_gateway::openapi::ROUTES {
            assert!(
                paths.get(*path).and_then(|p| p.get(*method)).is_some(),
                "{method} {path} undocumented"
            );
            let uri = path
                .replace("{source}", "open")
                .replace("{event_id}", "e1")
                .replace("{state}", "dead");
            let req = Request::builder()
                .method(method.to_uppercase().as_str())
                .uri(uri)
                .header(
                    "authorization",
                    format!("Bearer {}", crate::support::ADMIN_TOKEN),
                )
                .body(Body::from("{}"))
                .unwrap();
            let a = gw.send(req).await;
            // An unrouted path gets the router's own 404, as a problem named `not-found`;
            // a routed one may answer 404 too, but with its own name or an HTML page.
            let unrouted = a.status == StatusCode::NOT_FOUND
                && a.headers["content-type"] == "application/problem+json"
                && a.slug() == "not-found";
            assert!(
                a.status != StatusCode::METHOD_NOT_ALLOWED && !unrouted,
                "{method} {path} not routed: {a:?}"
            );
        }
        assert_eq!(
            paths.len(),
            oncebox_gateway::openapi::ROUTES
                .iter()
                .map(|r| r.1)
                .collect::<std::collections::BTreeSet<_>>()
                .len()
        );
    });
}

/// The document as the router serves it.
async fn document(gw: &TestGateway) -> Value {
    gw.send(Request::get("/openapi.json").body(Body::empty()).unwrap())
        .await
        .json()
}

#[test]
fn every_path_parameter_is_declared_and_every_operation_can_be_busy() {
    run(async {
        let gw = TestGateway::new();
        let doc = document(&gw).await;
        for (method, path) in oncebox_gateway::openapi::ROUTES {
            let op = &doc["paths"][*path][*method];
            let declared: Vec<&str> = op["parameters"]
                .as_array()
                .map(|ps| {
                    ps.iter()
                        .filter(|p| p["in"] == "path" && p["required"] == true)
                        .filter_map(|p| p["name"].as_str())
                        .collect()
                })
                .unwrap_or_default();
            let mut named = oncebox_gateway::openapi::template_names(path);
            named.sort_unstable();
            let mut declared_sorted = declared.clone();
            declared_sorted.sort_unstable();
            // OpenAPI 3.1: each template expression matches exactly one declared path parameter.
            assert_eq!(named, declared_sorted, "{method} {path}: {op}");
            // The edge's concurrency limit answers any route but `/healthz` with a 503 and
            // Retry-After.
            let busy = &op["responses"]["503"];
            if *path == "/healthz" {
                assert!(busy.is_null(), "{method} {path}: {busy}");
            } else {
                assert!(
                    busy["headers"]["Retry-After"].is_object(),
                    "{method} {path}: {busy}"
                );
            }
        }
        assert_eq!(
            oncebox_gateway::openapi::template_names("/v1/sources/{source}/events/{event_id}"),
            ["source", "event_id"]
        );
    });
}

/// Requests that the router answers with an error, each sent for real: the status it gives
/// must be among the operation's documented responses, under the slug the document names.
#[test]
fn error_answers_are_documented_for_their_operation() {
    run(async {
        let gw = TestGateway::new();
        let doc = document(&gw).await;
        let admin = |method: &str, uri: &str, body: &str| {
            Request::builder()
                .method(method)
                .uri(uri)
                .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
                .body(Body::from(body.to_owned()))
                .unwrap()
        };
        let cases: Vec<(&str, &str, Request<Body>)> = vec![
            (
                "post",
                "/v1/sources/{source}/events",
                post("open", &[], "{"),
            ),
            (
                "post",
                "/v1/sources/{source}/events",
                post("open", &[], "{}"),
            ),
            ("get", "/v1/events", admin("GET", "/v1/events?after=x", "")),
            // A body is read whole within the limit on a GET too, before the handler.
            (
                "get",
                "/v1/events",
                admin("GET", "/v1/events", &"x".repeat(70 * 1024)),
            ),
            (
                "get",
                "/",
                Request::get("/")
                    .body(Body::from("x".repeat(70 * 1024)))
                    .unwrap(),
            ),
            (
                "get",
                "/v1/events",
                Request::get("/v1/events").body(Body::empty()).unwrap(),
            ),
            (
                "get",
                "/v1/sources/{source}/events/{event_id}",
                admin("GET", "/v1/sources/open/events/nope", ""),
            ),
            (
                "get",
                "/v1/deliveries",
                admin("GET", "/v1/deliveries?state=lost", ""),
            ),
            (
                "post",
                "/v1/deliveries/{id}/retry",
                admin("POST", "/v1/deliveries/abc/retry", ""),
            ),
            (
                "post",
                "/v1/deliveries/{id}/retry",
                admin("POST", "/v1/deliveries/7/retry", ""),
            ),
            (
                "post",
                "/v1/deliveries/{id}/resolve",
                admin("POST", "/v1/deliveries/7/resolve", "{"),
            ),
            (
                "post",
                "/v1/deliveries/{id}/resolve",
                admin("POST", "/v1/deliveries/7/resolve", r#"{"outcome":"dead"}"#),
            ),
            (
                "post",
                "/v1/sources/{source}/events/{event_id}/redeliver",
                admin("POST", "/v1/sources/open/events/nope/redeliver", ""),
            ),
            (
                "post",
                "/v1/deliveries/{id}/retry",
                admin("POST", "/v1/deliveries/7/retry", &" ".repeat(65 << 10)),
            ),
            ("get", "/v1/events", admin("GET", "/v1/events?limit=-1", "")),
            (
                "get",
                "/v1/events",
                admin("GET", "/v1/events?source=Shop", ""),
            ),
            (
                "get",
                "/v1/deliveries",
                admin("GET", "/v1/deliveries?limit=-1", ""),
            ),
            (
                "get",
                "/v1/sources/{source}/events/{event_id}",
                admin("GET", "/v1/sources/open/events/%01", ""),
            ),
            (
                "post",
                "/v1/sources/{source}/events",
                post("shop", &[], "{}"),
            ),
            (
                "post",
                "/v1/sources/{source}/events",
                post("open", &[("x-long", &"a".repeat(65 << 10))], "{}"),
            ),
            ("post", "/login", form("/login", None, "token=x")),
            ("post", "/logout", form("/logout", None, "csrf=x")),
            (
                "post",
                "/login",
                form(
                    "/login",
                    Some("application/x-www-form-urlencoded"),
                    "token=a&token=b",
                ),
            ),
            (
                "post",
                "/logout",
                form(
                    "/logout",
                    Some("application/x-www-form-urlencoded"),
                    "csrf=x",
                ),
            ),
            (
                "post",
                "/logout",
                form(
                    "/logout",
                    Some("application/x-www-form-urlencoded"),
                    "csrf=a&csrf=b",
                ),
            ),
        ];
        for (method, path, request) in cases {
            documented(&doc, method, path, &gw.send(request).await);
        }
        // A key another worker holds is in progress, and says when to ask again.
        let body = r#"{"id":"held"}"#;
        let event = Event::json(Key::parse("open", "held").unwrap(), body).unwrap();
        gw.inbox
            .begin(event, Duration::from_secs(30))
            .await
            .unwrap();
        let held = gw.send(post("open", &[], body)).await;
        assert_eq!(held.status, StatusCode::CONFLICT, "{held:?}");
        documented(&doc, "post", "/v1/sources/{source}/events", &held);
        // A store that cannot answer: 503 with Retry-After, from the ingress and the admin API.
        let slow = TestGateway::with(crate::support::config(), |p| {
            oncebox_sqlite::Options::new(p).busy_timeout(Duration::from_millis(50))
        });
        let lock = oncebox_sqlite::rusqlite::Connection::open(&slow.path).unwrap();
        lock.execute_batch("BEGIN IMMEDIATE").unwrap();
        let locked = slow.send(post("open", &[], r#"{"id":"e1"}"#)).await;
        assert_eq!(locked.status, StatusCode::SERVICE_UNAVAILABLE, "{locked:?}");
        documented(&doc, "post", "/v1/sources/{source}/events", &locked);
        let ready = slow
            .send(Request::get("/readyz").body(Body::empty()).unwrap())
            .await;
        documented(&doc, "get", "/readyz", &ready);
        lock.execute_batch("ROLLBACK").unwrap();
        // Without a token on a listener that is not loopback-only, the admin API is off.
        let closed = TestGateway::tokenless();
        let off = closed
            .send(Request::get("/v1/stats").body(Body::empty()).unwrap())
            .await;
        assert_eq!(off.status, StatusCode::FORBIDDEN);
        documented(&doc, "get", "/v1/stats", &off);
    });
}

/// A form posted to the dashboard, with `content_type` if given.
fn form(path: &str, content_type: Option<&str>, body: &str) -> Request<Body> {
    let mut request = Request::post(path);
    if let Some(content_type) = content_type {
        request = request.header("content-type", content_type);
    }
    request.body(Body::from(body.to_owned())).unwrap()
}

/// Checks that answer `a`, given by operation `method path`, is documented there: its status,
/// its slug as a whole word of that response's description, its body as the declared problem,
/// the headers a client acts on, and every header declared as always sent.
fn documented(doc: &Value, method: &str, path: &str, a: &crate::support::Answer) {
    assert!(
        a.status.is_client_error() || a.status.is_server_error(),
        "{method} {path}: an error case answered {}",
        a.status
    );
    let documented = &doc["paths"][path][method]["responses"][a.status.as_str()];
    let schema = &documented["content"]["application/problem+json"]["schema"];
    let at = format!("{method} {path} {}", a.status);
    conform::conforms(doc, schema, &a.json(), &at).unwrap();
    let description = documented["description"].as_str().unwrap_or_default();
    let slug = a.slug();
    let words: Vec<&str> = description
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .collect();
    assert!(
        words.contains(&slug.as_str()),
        "{method} {path}: {} {slug} not documented ({documented})",
        a.status
    );
    for header in ["retry-after", "www-authenticate"] {
        if a.headers.contains_key(header) {
            let listed = documented["headers"]
                .as_object()
                .is_some_and(|h| h.keys().any(|k| k.eq_ignore_ascii_case(header)));
            assert!(
                listed,
                "{method} {path}: {header} not documented ({documented})"
            );
        }
    }
    for (header, declared) in documented["headers"].as_object().into_iter().flatten() {
        if declared["required"] == true {
            assert!(
                a.headers.contains_key(header.as_str()),
                "{at}: no {header}: {a:?}"
            );
        }
    }
}

/// The dashboard's queue page is documented for the states it serves, and any other state is
/// the page's documented 404.
#[test]
fn the_dashboard_queues_are_the_documented_states() {
    run(async {
        let gw = TestGateway::tokenless();
        let doc = document(&gw).await;
        let op = &doc["paths"]["/deliveries/{state}"]["get"];
        let state = op["parameters"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["in"] == "path"))
            .expect("the state parameter");
        let states: Vec<&str> = state["schema"]["enum"]
            .as_array()
            .expect("an enum of states")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let page = async |state: &str| {
            let request = crate::support::local_get(&format!("/deliveries/{state}"));
            gw.send_local(request).await.status
        };
        assert!(!states.is_empty());
        for state in &states {
            assert_eq!(page(state).await, StatusCode::OK, "{state}");
        }
        for state in oncebox_core::delivery::DeliveryState::NAMES {
            if !states.contains(&state) {
                assert_eq!(page(state).await, StatusCode::NOT_FOUND, "{state}");
            }
        }
        assert!(op["responses"]["404"].is_object(), "{op}");
    });
}
