//! The dashboard through the real router on a real SQLite file: login and its cookie, the
//! session standing for the token only with its CSRF token (more of its gate in
//! `dashboard_gate.rs`), the events page scanning past rows that no longer parse, and
//! snapshots of every page with an attacker's payload in it (times are the manual clock's; the
//! CSRF token is redacted).

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use oncebox_core::delivery::{RetryPolicy, Verdict};
use oncebox_core::relay_store::{AttemptRecord, DeliveryStore, STATUS_RECHECK};
use oncebox_core::route::Route;
use oncebox_core::{Clock, Source};
use oncebox_testkit::run;

use crate::support::{ADMIN_TOKEN, TestGateway, config, post};

const XSS: &str = r#"{"id":"x1","note":"<script>document.title='pwned'</script>","amount":10}"#;

pub(crate) fn gateway() -> TestGateway {
    let mut cfg = config();
    cfg.routes = vec![Route {
        name: "hooks".to_owned(),
        sources: vec![Source::new("open").unwrap()],
        filter: None,
        url: "https://user:pw@receiver.test/hooks?token=abc".to_owned(),
        timeout: Duration::from_secs(5),
        signing_secret: None,
        idempotent: false,
        status_url: None,
        retry: RetryPolicy::default(),
        concurrency: 4,
        rate: None,
        ca_pem: None,
    }];
    TestGateway::with(cfg, oncebox_sqlite::Options::new)
}

/// Logs in and returns the cookie pair (`name=value`).
pub(crate) async fn login(gw: &TestGateway) -> String {
    let r = gw
        .send(
            Request::post("/login")
                .header("content-type", "application/x-www-form-urlencoded")
                .body(Body::from(format!("token={ADMIN_TOKEN}")))
                .unwrap(),
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{r:?}");
    let cookie = r.headers["set-cookie"].to_str().unwrap().to_owned();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(cookie.contains(attribute), "{cookie}");
    }
    cookie.split(';').next().unwrap().to_owned()
}

pub(crate) fn get(path: &str, cookie: &str) -> Request<Body> {
    Request::get(path)
        .header("cookie", cookie)
        .body(Body::empty())
        .unwrap()
}

/// The page's CSRF token, from its meta tag.
pub(crate) fn csrf(html: &str) -> String {
    let at = html.find(r#"name="oncebox-csrf" content=""#).unwrap() + 29;
    html[at..].split('"').next().unwrap().to_owned()
}

pub(crate) fn text(body: &[u8]) -> String {
    String::from_utf8(body.to_vec()).unwrap()
}

#[test]
fn pages_need_a_login_with_the_admin_token() {
    run(async {
        let gw = gateway();
        let r = gw.send(get("/", "")).await;
        assert_eq!(r.status, StatusCode::SEE_OTHER);
        assert_eq!(r.headers["location"], "/login");
        let wrong = gw
            .send(
                Request::post("/login")
                    .header("content-type", "application/x-www-form-urlencoded")
                    .body(Body::from("token=nope"))
                    .unwrap(),
            )
            .await;
        assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
        assert!(wrong.headers.get("set-cookie").is_none());
        let forged = gw
            .send(get("/", "oncebox_session=99999999999999.00.00"))
            .await;
        assert_eq!(forged.status, StatusCode::SEE_OTHER);
        let cookie = login(&gw).await;
        let page = gw.send(get("/", &cookie)).await;
        assert_eq!(page.status, StatusCode::OK);
        // Another page of this host (any port) may set a cookie of the same name with a longer
        // path, which the browser sends first: the valid one after it still counts.
        let planted = format!("oncebox_session=planted; {cookie}");
        assert_eq!(gw.send(get("/", &planted)).await.status, StatusCode::OK);
        assert!(
            page.headers["content-security-policy"]
                .to_str()
                .unwrap()
                .contains("script-src 'self'")
        );
    });
}

#[test]
fn the_admin_api_takes_a_session_only_with_its_csrf_token() {
    run(async {
        let gw = gateway();
        let cookie = login(&gw).await;
        let token = csrf(&text(&gw.send(get("/", &cookie)).await.body));
        assert_eq!(
            gw.send(get("/v1/events", &cookie)).await.status,
            StatusCode::UNAUTHORIZED,
            "the cookie alone is not enough"
        );
        let with = |path: &str, csrf: &str| {
            Request::get(path)
                .header("cookie", &cookie)
                .header("x-oncebox-csrf", csrf)
                .body(Body::empty())
                .unwrap()
        };
        assert_eq!(
            gw.send(with("/v1/events", &token)).await.status,
            StatusCode::OK
        );
        assert_eq!(
            gw.send(with("/v1/activity", &token)).await.status,
            StatusCode::OK
        );
        assert_eq!(
            gw.send(with("/v1/events", &"0".repeat(64))).await.status,
            StatusCode::UNAUTHORIZED
        );
        let cross_site = Request::post("/v1/deliveries/1/retry")
            .header("cookie", &cookie)
            .header("x-oncebox-csrf", &token)
            .header("host", "127.0.0.1:8080")
            .header("origin", "http://evil.example")
            .body(Body::empty())
            .unwrap();
        assert_eq!(gw.send(cross_site).await.status, StatusCode::UNAUTHORIZED);
        // From the dashboard's own page a change goes through (no such delivery: 404, past
        // the guard), with this session's token only: another session's is refused.
        let same_site = |csrf: &str| {
            Request::post("/v1/deliveries/1/retry")
                .header("cookie", &cookie)
                .header("x-oncebox-csrf", csrf)
                .header("host", "127.0.0.1:8080")
                .header("origin", "http://127.0.0.1:8080")
                .body(Body::empty())
                .unwrap()
        };
        assert_eq!(
            gw.send(same_site(&token)).await.status,
            StatusCode::NOT_FOUND
        );
        let other = login(&gw).await;
        let others = csrf(&text(&gw.send(get("/", &other)).await.body));
        assert_eq!(
            gw.send(same_site(&others)).await.status,
            StatusCode::UNAUTHORIZED
        );
        // The browser carries both sessions (at two paths): the logout, with the second's
        // form, ends each.
        let both = format!("{cookie}; {other}");
        let logout = |csrf: &str| {
            Request::post("/logout")
                .header("cookie", &both)
                .header("content-type", "application/x-www-form-urlencoded")
                .body(Body::from(format!("csrf={csrf}")))
                .unwrap()
        };
        assert_eq!(gw.send(logout("x")).await.status, StatusCode::FORBIDDEN);
        let out = gw.send(logout(&others)).await;
        assert_eq!(out.status, StatusCode::SEE_OTHER);
        assert!(
            out.headers["set-cookie"]
                .to_str()
                .unwrap()
                .contains("Max-Age=0")
        );
        // A copy of the cookie taken before the logout, still inside its lifetime and
        // correctly signed, no longer stands for the token: not for the API, not for a page.
        assert_eq!(
            gw.send(with("/v1/events", &token)).await.status,
            StatusCode::UNAUTHORIZED
        );
        let page = gw.send(get("/", &cookie)).await;
        assert_eq!(page.status, StatusCode::SEE_OTHER);
        assert_eq!(page.headers["location"], "/login");
        let page = gw.send(get("/", &other)).await;
        assert_eq!(
            page.status,
            StatusCode::SEE_OTHER,
            "the other session ended too"
        );
        assert_eq!(gw.send(logout(&token)).await.status, StatusCode::FORBIDDEN);
        // A new login is a new session.
        let again = login(&gw).await;
        assert_ne!(again, cookie);
        assert_eq!(gw.send(get("/", &again)).await.status, StatusCode::OK);
    });
}

/// Events (one carrying a script, one conflict), an uncertain and a dead delivery.
async fn seed(gw: &TestGateway) {
    assert_eq!(
        gw.send(post("open", &[], XSS)).await.status,
        StatusCode::ACCEPTED
    );
    let refused = post(
        "open",
        &[],
        r#"{"id":"x1","note":"<b>other</b>","amount":11}"#,
    );
    assert_eq!(gw.send(refused).await.status.as_u16(), 422);
    gw.send(post("open", &[], r#"{"id":"e2","items":[1,2]}"#))
        .await;
    let now = gw.clock.now();
    let claimed = gw
        .inbox
        .claim(now, 10, Duration::from_secs(60), &[])
        .await
        .unwrap();
    let attempt = |status, error: &str| AttemptRecord {
        started_at: now,
        duration: Duration::from_millis(250),
        status,
        error: Some(error.to_owned()),
    };
    let uncertain = attempt(None, "timed out after the request was sent");
    DeliveryStore::record(
        &gw.inbox,
        &claimed[0],
        uncertain,
        Verdict::Uncertain(STATUS_RECHECK.0),
        now,
    )
    .await
    .unwrap();
    let dead = attempt(Some(400), "<i>refused</i>");
    let verdict = Verdict::Dead("receiver refused".into());
    DeliveryStore::record(&gw.inbox, &claimed[1], dead, verdict, now)
        .await
        .unwrap();
}

#[test]
fn pages_render_with_every_value_escaped() {
    run(async {
        let gw = gateway();
        seed(&gw).await;
        let cookie = login(&gw).await;
        let pages = [
            ("overview", "/"),
            ("events", "/events"),
            (
                "events_filtered",
                "/events?source=open&outcome=conflict&since=1h",
            ),
            ("event", "/events/open/x1"),
            ("uncertain", "/deliveries/uncertain"),
            ("dead", "/deliveries/dead"),
            ("conflicts", "/conflicts"),
            ("config", "/config"),
        ];
        for (name, path) in pages {
            let r = gw.send(get(path, &cookie)).await;
            assert_eq!(r.status, StatusCode::OK, "{path}");
            let html = text(&r.body);
            assert!(!html.contains("<script>document"), "{path}: {html}");
            assert!(
                !html.contains("<b>other") && !html.contains("<i>refused"),
                "{path}"
            );
            assert!(
                !html.contains("pw@") && !html.contains("token=abc"),
                "{path}"
            );
            // One line per tag keeps the snapshots readable and their diffs small.
            let html = html.replace('>', ">\n");
            insta::with_settings!({
                snapshot_suffix => name,
                filters => vec![(r#"name="oncebox-csrf" content="[0-9a-f]{64}""#, r#"name="oncebox-csrf" content="[csrf]""#),
                                (r#"name="csrf" value="[0-9a-f]{64}""#, r#"name="csrf" value="[csrf]""#)],
            }, {
                insta::assert_snapshot!(html);
            });
        }
        let event = text(&gw.send(get("/events/open/x1", &cookie)).await.body);
        assert!(event.contains("&lt;script&gt;document.title="), "{event}");
    });
}

/// An event whose id is `..` is linked by a query, which a browser keeps as written (a path
/// segment `..` or `%2E%2E` it would resolve to `/events/`), and that link opens its page.
#[test]
fn an_event_id_of_two_dots_is_linked_by_a_query() {
    run(async {
        let gw = gateway();
        let cookie = login(&gw).await;
        let sent = gw.send(post("open", &[], r#"{"id":".."}"#)).await;
        assert_eq!(sent.status, StatusCode::ACCEPTED);
        let list = text(&gw.send(get("/events", &cookie)).await.body);
        assert!(
            list.contains(r#"href="/event?source=open&amp;id=..""#),
            "{list}"
        );
        let page = gw.send(get("/event?source=open&id=..", &cookie)).await;
        assert_eq!(page.status, StatusCode::OK);
        assert!(text(&page.body).contains(r#"<dd id="event-id">..</dd>"#));
        let unnamed = gw.send(get("/event?source=open", &cookie)).await;
        assert_eq!(unnamed.status, StatusCode::BAD_REQUEST);
    });
}

#[test]
fn unknown_queues_events_and_filters_are_refused_as_pages() {
    run(async {
        let gw = gateway();
        let cookie = login(&gw).await;
        for (path, status) in [
            ("/deliveries/pending", StatusCode::NOT_FOUND),
            ("/events/open/missing", StatusCode::NOT_FOUND),
            ("/events?outcome=bogus", StatusCode::BAD_REQUEST),
            ("/events?since=3y", StatusCode::BAD_REQUEST),
            ("/events?source=Bad%20Name", StatusCode::BAD_REQUEST),
            ("/conflicts?source=open&event_id=", StatusCode::BAD_REQUEST),
        ] {
            assert_eq!(gw.send(get(path, &cookie)).await.status, status, "{path}");
        }
    });
}

/// A whole scan page of rows that no longer parse (ids with a control character, which no
/// version accepts but a damaged or hand-edited table may hold) ends neither the events page
/// nor its scan: the event after them is listed.
#[test]
fn the_events_page_scans_past_rows_that_no_longer_parse() {
    run(async {
        let gw = gateway();
        gw.inbox
            .write(|c| {
                let mut insert = c.prepare(
                    "INSERT INTO oncebox_inbox (source, event_id, fingerprint, state, payload,
                       received_at)
                     VALUES ('open', ?1, x'00', 'completed', x'', 0)",
                )?;
                for i in 0..500 {
                    insert.execute([format!("unparsed-{i}\u{1}")])?;
                }
                Ok(())
            })
            .await
            .unwrap();
        assert_eq!(
            gw.send(post("open", &[], r#"{"id":"after-them"}"#))
                .await
                .status,
            StatusCode::ACCEPTED
        );
        let cookie = login(&gw).await;
        let page = gw.send(get("/events", &cookie)).await;
        assert_eq!(page.status, StatusCode::OK);
        let html = text(&page.body);
        assert!(html.contains("after-them"), "the event past them is listed");
        assert!(
            !html.contains("unparsed-"),
            "rows that do not parse are not shown"
        );
    });
}
