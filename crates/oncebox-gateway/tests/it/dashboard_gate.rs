//! A dashboard page the request cannot be read for (a query value of another type, a path
//! segment that is not UTF-8): the session is checked first, so a visitor not signed in goes to
//! /login; signed in, the page's own 400, in HTML. The extractors' rejections used to answer
//! before the check, with a JSON problem document, to anyone. Every query parameter the
//! OpenAPI document gives a page is one the page reads, and a sign-in proxy's own credential
//! does not shut a signed-in page out of the admin API. Beyond loopback without a token the
//! dashboard is closed; a session logged out stays ended across a clock stepped back.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use oncebox_core::Clock;
use oncebox_testkit::run;
use serde_json::Value;

use crate::dashboard::{csrf, gateway, get, login, text};
use crate::support::{TestGateway, config, local_get};

const UNREADABLE: [&str; 5] = [
    "/events?after=abc",
    "/deliveries/dead?after=x",
    "/deliveries/uncertain?after=1.5",
    "/conflicts?after=x",
    "/events/open/%FF",
];

#[test]
fn unreadable_page_requests_are_gated_first_then_answered_as_pages() {
    run(async {
        let gw = gateway();
        for path in UNREADABLE {
            let r = gw.send(get(path, "")).await;
            assert_eq!(r.status, StatusCode::SEE_OTHER, "{path}: {r:?}");
            assert_eq!(r.headers["location"], "/login", "{path}");
        }
        let cookie = login(&gw).await;
        for path in UNREADABLE {
            let r = gw.send(get(path, &cookie)).await;
            assert_eq!(r.status, StatusCode::BAD_REQUEST, "{path}: {r:?}");
            let kind = r.headers["content-type"].to_str().unwrap();
            assert!(kind.starts_with("text/html"), "{path}: {kind}");
        }
    });
}

/// A value no page takes for a parameter of `schema`.
fn unreadable(schema: &Value) -> &'static str {
    match schema["type"].as_str() {
        Some("integer") => "x",
        // A control character: no source, event id or key holds one.
        Some("string") => "%01",
        _ => "no-such-value",
    }
}

/// The gateway's OpenAPI document.
async fn document(gw: &TestGateway) -> Value {
    let doc = gw.send_local(local_get("/openapi.json")).await;
    serde_json::from_slice(&doc.body).unwrap()
}

/// The dashboard's pages in `doc`: each path with its `GET`.
fn pages(doc: &Value) -> Vec<(&String, &Value)> {
    let paths = doc["paths"].as_object().unwrap();
    paths
        .iter()
        .map(|(path, item)| (path, &item["get"]))
        .filter(|(_, op)| {
            op["tags"]
                .as_array()
                .is_some_and(|t| t.contains(&"dashboard".into()))
        })
        .collect()
}

/// Each documented query parameter of a dashboard page, given a value it cannot take (the
/// page's other required parameters valid), is answered 400: a name the page did not read
/// would be ignored, and the page shown.
#[test]
fn every_documented_page_parameter_is_read_by_its_page() {
    run(async {
        let gw = TestGateway::tokenless();
        let doc = document(&gw).await;
        let mut checked = 0;
        for (path, op) in pages(&doc) {
            let params = op["parameters"].as_array().cloned().unwrap_or_default();
            let query: Vec<&Value> = params.iter().filter(|p| p["in"] == "query").collect();
            for p in &query {
                let name = p["name"].as_str().unwrap();
                let mut pairs = vec![format!("{name}={}", unreadable(&p["schema"]))];
                for other in query
                    .iter()
                    .filter(|o| o["name"] != name && o["required"] == true)
                {
                    pairs.push(format!("{}=open", other["name"].as_str().unwrap()));
                }
                let at = format!("{}?{}", path.replace("{state}", "dead"), pairs.join("&"));
                let r = gw.send_local(local_get(&at)).await;
                assert_eq!(r.status, StatusCode::BAD_REQUEST, "{at}: {r:?}");
                checked += 1;
            }
        }
        assert!(checked >= 9, "{checked} parameters checked");
    });
}

/// Each value a dashboard page's parameter is documented to take is taken by the page: a
/// client built from the document can follow the pages' own links (an empty `outcome` is the
/// events page's "any").
#[test]
fn every_documented_page_parameter_value_is_taken_by_its_page() {
    run(async {
        let gw = TestGateway::tokenless();
        let doc = document(&gw).await;
        let mut checked = 0;
        for (path, op) in pages(&doc) {
            let params = op["parameters"].as_array().cloned();
            for p in params.unwrap_or_default() {
                let Some(values) = p["schema"]["enum"].as_array() else {
                    continue;
                };
                for value in values {
                    let (name, value) = (p["name"].as_str().unwrap(), value.as_str().unwrap());
                    let at = format!("{}?{name}={value}", path.replace("{state}", "dead"));
                    let r = gw.send_local(local_get(&at)).await;
                    assert_eq!(r.status, StatusCode::OK, "{at}: {r:?}");
                    checked += 1;
                }
            }
        }
        assert!(checked >= 12, "{checked} values checked");
        // And the events page's own choices are among them ("any" is the empty one).
        let page = gw.send_local(local_get("/events")).await;
        let html = String::from_utf8(page.body).unwrap();
        let events = &doc["paths"]["/events"]["get"]["parameters"];
        for name in ["outcome", "since"] {
            let documented = events
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == name)
                .map(|p| p["schema"]["enum"].clone())
                .unwrap();
            let select = html.split(&format!(r#"<select name="{name}">"#)).nth(1);
            let select = select.and_then(|s| s.split("</select>").next()).unwrap();
            for option in select.split(r#"value=""#).skip(1) {
                let value = option.split('"').next().unwrap();
                let listed = documented.as_array().unwrap().contains(&value.into());
                assert!(listed, "{name}={value:?} is not in {documented}");
            }
        }
    });
}

/// A sign-in proxy in front of the gateway adds its own `Authorization` to every request
/// (nginx's `auth_basic` passes it on; an OAuth proxy passes its bearer token): a signed-in
/// page's calls still go through on the session and its CSRF token. The proxy's credential
/// was left in place and failed the guard, and every call answered 401.
#[test]
fn a_proxys_own_credential_does_not_shut_out_a_signed_in_page() {
    run(async {
        let gw = gateway();
        let cookie = login(&gw).await;
        let page = gw.send(get("/", &cookie)).await;
        let token = csrf(&text(&page.body));
        for credential in ["Basic dTpw", "Bearer the-proxys-own"] {
            let call = Request::get("/v1/activity")
                .header("cookie", &cookie)
                .header("x-oncebox-csrf", &token)
                .header("authorization", credential)
                .body(Body::empty())
                .unwrap();
            assert_eq!(gw.send(call).await.status, StatusCode::OK, "{credential}");
        }
        // Without the session, the credential alone is what the guard judges.
        let alone = Request::get("/v1/activity")
            .header("authorization", "Bearer the-proxys-own")
            .body(Body::empty())
            .unwrap();
        assert_eq!(gw.send(alone).await.status, StatusCode::UNAUTHORIZED);
    });
}

/// Without an admin token on a listener that is not loopback-only, the pages say the dashboard
/// is closed with 403, as the admin API answers there: no token could open it.
#[test]
fn without_a_token_beyond_loopback_the_dashboard_is_closed_403() {
    run(async {
        let mut cfg = config();
        cfg.admin_token = None;
        let gw = TestGateway::with(cfg, oncebox_sqlite::Options::new);
        for path in ["/", "/events", "/login"] {
            let page = gw.send(get(path, "")).await;
            assert_eq!(page.status, StatusCode::FORBIDDEN, "{path}");
            assert!(
                text(&page.body).contains("The dashboard is closed"),
                "{path}"
            );
        }
    });
}

/// A session logged out stays refused until its cookie expires, even when the wall clock was
/// stepped back after the login: the list keeps it until the cookie's own signed expiry.
#[test]
fn a_logged_out_session_stays_refused_across_a_clock_stepped_back() {
    run(async {
        let gw = gateway();
        let logout = |cookie: &str, csrf: &str| {
            Request::post("/logout")
                .header("cookie", cookie)
                .header("content-type", "application/x-www-form-urlencoded")
                .body(Body::from(format!("csrf={csrf}")))
                .unwrap()
        };
        let first = login(&gw).await;
        let csrf_first = csrf(&text(&gw.send(get("/", &first)).await.body));
        let logged_in = gw.clock.now();
        gw.clock
            .set(logged_in.minus(Duration::from_secs(24 * 3600)));
        let out = gw.send(logout(&first, &csrf_first)).await;
        assert_eq!(out.status, StatusCode::SEE_OTHER);
        // 13 hours on: past the logout's time plus a session's 12, before the cookie expires.
        gw.clock.advance(Duration::from_secs(13 * 3600));
        // Another session's logout prunes the list.
        let second = login(&gw).await;
        let csrf_second = csrf(&text(&gw.send(get("/", &second)).await.body));
        assert_eq!(
            gw.send(logout(&second, &csrf_second)).await.status,
            StatusCode::SEE_OTHER
        );
        let again = gw.send(get("/", &first)).await;
        assert_eq!(
            again.status,
            StatusCode::SEE_OTHER,
            "the first session stays ended"
        );
        assert_eq!(again.headers["location"], "/login");
    });
}
