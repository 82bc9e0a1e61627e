//! A dashboard page the request cannot be read for (a query value of another type, a path
//! segment that is not UTF-8): the session is checked first, so a visitor not signed in goes to
//! /login; signed in, the page's own 400, in HTML. The extractors' rejections used to answer
//! before the check, with a JSON problem document, to anyone.

use axum::http::StatusCode;
use oncebox_testkit::run;

use crate::dashboard::{gateway, get, login};

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
