//! What of a request the admin API shows with its event: the payload, the answer, and every
//! header that is no credential, its value as it came where it is text (UTF-8, non-ASCII
//! included); a value that is not text is not kept.

use axum::body::Body;
use axum::http::{HeaderValue, Request, StatusCode};
use oncebox_testkit::run;

use crate::support::{TestGateway, admin_get, post};

#[test]
fn one_event_shows_payload_headers_and_answer() {
    run(async {
        let gw = TestGateway::new();
        gw.send(post(
            "open",
            &[("x-trace", "t9")],
            r#"{"id":"e1","note":"<script>"}"#,
        ))
        .await;
        let e = gw
            .send(admin_get("/v1/sources/open/events/e1"))
            .await
            .json();
        assert_eq!(e["state"], "completed");
        assert_eq!(e["payload"], r#"{"id":"e1","note":"<script>"}"#);
        assert!(
            e["headers"]
                .as_array()
                .unwrap()
                .iter()
                .any(|h| h[0] == "x-trace" && h[1] == "t9")
        );
        assert_eq!(e["response"]["kind"], "completed");
        assert_eq!(e["fingerprint"].as_str().unwrap().len(), 64);
        let missing = gw.send(admin_get("/v1/sources/open/events/nope")).await;
        assert_eq!(
            (missing.status, missing.slug().as_str()),
            (StatusCode::NOT_FOUND, "event-not-found")
        );
    });
}

#[test]
fn header_values_are_kept_as_text_non_ascii_included() {
    run(async {
        let gw = TestGateway::new();
        let mut r = Request::post("/v1/sources/open/events")
            .header("content-type", "application/json")
            .body(Body::from(r#"{"id":"e2"}"#))
            .unwrap();
        let h = r.headers_mut();
        h.insert(
            "x-name",
            HeaderValue::from_bytes("Zoë «ünï»".as_bytes()).unwrap(),
        );
        h.insert("x-binary", HeaderValue::from_bytes(b"\xff\xfe<b>").unwrap());
        h.insert("x-plain", HeaderValue::from_static("ok"));
        assert_eq!(gw.send(r).await.status, StatusCode::ACCEPTED);
        let e = gw
            .send(admin_get("/v1/sources/open/events/e2"))
            .await
            .json();
        let kept: Vec<(String, String)> = e["headers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| (h[0].as_str().unwrap().into(), h[1].as_str().unwrap().into()))
            .collect();
        let value = |name: &str| {
            kept.iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(value("x-name"), Some("Zoë «ünï»"), "{kept:?}");
        assert_eq!(value("x-plain"), Some("ok"));
        assert_eq!(value("x-binary"), None, "not text: not kept");
    });
}
