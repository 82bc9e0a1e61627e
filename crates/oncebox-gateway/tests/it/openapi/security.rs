//! The admin API's declared security against the router: both ways in work.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use oncebox_testkit::run;

use super::document;

/// The admin operations declare both ways in, and both work: the token, or a dashboard
/// session's cookie with its CSRF token beside it (the document named only the token, so a
/// client built from it had the gateway's way in wrong).
#[test]
fn every_admin_operation_declares_and_takes_a_session_with_its_csrf_token() {
    run(async {
        let gw = crate::dashboard::gateway();
        let doc = document(&gw).await;
        let cookie = crate::dashboard::login(&gw).await;
        let page = gw.send(crate::dashboard::get("/", &cookie)).await;
        let csrf = crate::dashboard::csrf(&String::from_utf8_lossy(&page.body));
        let schemes = &doc["components"]["securitySchemes"];
        assert_eq!(schemes["csrf"]["in"], "header");
        let header = schemes["csrf"]["name"].as_str().unwrap().to_owned();
        let mut admin = 0;
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                let Some(security) = op["security"].as_array() else {
                    continue;
                };
                if !security.iter().any(|s| s.get("bearer").is_some()) {
                    continue;
                }
                admin += 1;
                assert!(
                    security.contains(&serde_json::json!({ "session": [], "csrf": [] })),
                    "{method} {path}: {security:?}"
                );
                if method != "get" {
                    continue;
                }
                let uri = path.replace("{source}", "open").replace("{event_id}", "e1");
                let req = Request::get(uri.as_str())
                    .header("cookie", &cookie)
                    .header(header.as_str(), &csrf)
                    .body(Body::empty())
                    .unwrap();
                let a = gw.send(req).await;
                assert_ne!(a.status, StatusCode::UNAUTHORIZED, "GET {path}: {a:?}");
            }
        }
        assert!(admin >= 8, "{admin} admin operations");
    });
}
