//! The dashboard's conflicts page: filtered to one key, its pages follow one another within that
//! key, and half a key is refused rather than ignored; large payloads are shown in part, deeply
//! nested ones as sent (also on an event's page).

use axum::http::StatusCode;
use oncebox_testkit::run;

use crate::support::{TestGateway, local_get, post};

/// Conflicts on one page.
const PAGE: usize = 20;

#[test]
fn one_keys_conflicts_page_on_within_that_key() {
    run(async {
        let gw = TestGateway::tokenless();
        // `k1` conflicts more often than one page shows, `k2` once.
        for (id, times) in [("k1", PAGE + 5), ("k2", 1)] {
            for n in 0..=times {
                let body = format!(r#"{{"id":"{id}","n":{n}}}"#);
                let a = gw.send(post("open", &[], body)).await;
                let expected = if n == 0 {
                    StatusCode::ACCEPTED
                } else {
                    StatusCode::UNPROCESSABLE_ENTITY
                };
                assert_eq!(a.status, expected, "{id} #{n}: {a:?}");
            }
        }
        let page = async |path: String| gw.send_local(local_get(&path)).await;
        let first = page("/conflicts?source=open&event_id=k1".into()).await;
        assert_eq!(first.status, StatusCode::OK);
        let first = String::from_utf8(first.body).unwrap();
        let next = first
            .split("class=\"next\" href=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .expect("a next page link")
            .replace("&amp;", "&");
        assert!(
            next.starts_with("/conflicts?source=open&event_id=k1&after="),
            "{next}"
        );
        let second = page(next).await;
        assert_eq!(second.status, StatusCode::OK);
        let second = String::from_utf8(second.body).unwrap();
        let shown = |html: &str, id: &str| html.matches(&format!(">open:{id}</a>")).count();
        assert_eq!(shown(&first, "k1") + shown(&second, "k1"), PAGE + 5);
        assert_eq!(shown(&first, "k2") + shown(&second, "k2"), 0, "{second}");

        for half in ["/conflicts?source=open", "/conflicts?event_id=k1"] {
            assert_eq!(
                page(half.into()).await.status,
                StatusCode::BAD_REQUEST,
                "{half}"
            );
        }
    });
}

/// A sender can plant conflicts as large as its source's body limit: the page shows the first
/// part of each payload, so a view costs a bounded page whatever was sent.
#[test]
fn large_conflicting_payloads_are_shown_in_part() {
    run(async {
        let gw = TestGateway::tokenless();
        let filler = "x".repeat(200_000);
        for n in 0..=PAGE {
            let body = format!(r#"{{"id":"big","n":{n},"filler":"{filler}"}}"#);
            let a = gw.send(post("open", &[], body)).await;
            // The first is stored; every later one reuses its key.
            let want = if n == 0 {
                StatusCode::ACCEPTED
            } else {
                StatusCode::UNPROCESSABLE_ENTITY
            };
            assert_eq!(a.status, want);
        }
        let page = gw.send_local(local_get("/conflicts")).await;
        assert_eq!(page.status, StatusCode::OK);
        let html = String::from_utf8(page.body).unwrap();
        assert_eq!(
            html.matches("The first 32 KiB of 200").count(),
            2 * PAGE,
            "both sides"
        );
        // Forty payloads of 200 KB each would be 8 MB shown whole.
        assert!(html.len() < 2 * PAGE * 40 * 1024, "{} bytes", html.len());
    });
}

/// `{"id":…,"a":[[…[0,0,…]…]]}`, `n` zeros `DEEP` arrays down.
fn deep(id: &str, n: usize, last: u32) -> String {
    const DEEP: usize = 100;
    let zeros = vec!["0"; n].join(",");
    format!(
        r#"{{"id":"{id}","a":{}{zeros},{last}{}}}"#,
        "[".repeat(DEEP),
        "]".repeat(DEEP)
    )
}

/// Indented, a payload of many small values deep inside brackets took a hundred times its size
/// (each line indented by its depth): a 100 KB event's page was 20 MB, and a conflict of two
/// 30 KB payloads 12 MB; and a conflict whose every value differs, each line marked, 15 times.
/// Such a payload is shown as sent.
#[test]
fn deeply_nested_payloads_are_shown_as_sent_not_indented() {
    run(async {
        let gw = TestGateway::tokenless();
        let event = deep("deep-event", 50_000, 0);
        assert_eq!(
            gw.send(post("open", &[], event.clone())).await.status,
            StatusCode::ACCEPTED
        );
        let page = gw.send_local(local_get("/events/open/deep-event")).await;
        assert_eq!(page.status, StatusCode::OK);
        let html = String::from_utf8(page.body).unwrap();
        assert!(html.contains("As sent: indented"), "{}", &html[..2000]);
        assert!(html.len() < 2 * event.len(), "{} bytes", html.len());

        for last in 0..2 {
            let a = gw
                .send(post("open", &[], deep("deep-key", 15_000, last)))
                .await;
            // The first is stored; every later one reuses its key.
            let want = if last == 0 {
                StatusCode::ACCEPTED
            } else {
                StatusCode::UNPROCESSABLE_ENTITY
            };
            assert_eq!(a.status, want);
        }
        // Shallow, but every value differs: each line is marked.
        for digit in 0..2 {
            let values = vec![digit.to_string(); 15_000].join(",");
            let body = format!(r#"{{"id":"flat-key","a":[{values}]}}"#);
            let a = gw.send(post("open", &[], body)).await;
            // The first is stored; every later one reuses its key.
            let want = if digit == 0 {
                StatusCode::ACCEPTED
            } else {
                StatusCode::UNPROCESSABLE_ENTITY
            };
            assert_eq!(a.status, want);
        }
        let page = gw.send_local(local_get("/conflicts")).await;
        assert_eq!(page.status, StatusCode::OK);
        let html = String::from_utf8(page.body).unwrap();
        let shown = html.matches("As sent: indented").count();
        assert_eq!(shown, 2, "both deep sides");
        // The flat sides are shown indented, without their 15 000 marks.
        assert!(html.matches("<mark").count() < 100, "marked");
        assert!(html.len() < 12 * 30_000, "{} bytes", html.len());
    });
}

/// `{"id":…,"k…":{"k…":…[x,x,…]}}`: `n` copies of `x` under 100 levels of 200-byte keys.
fn deep_under_long_keys(id: &str, n: usize, x: u32) -> String {
    let key = format!("\"{}\"", "k".repeat(200));
    let mut doc = format!("[{}]", vec![x.to_string(); n].join(","));
    for _ in 0..100 {
        doc = format!("{{{key}:{doc}}}");
    }
    format!(r#"{{"id":"{id}","a":{doc}}}"#)
}

/// A conflict of 32 KB payloads whose 6 000 differences lie under 100 levels of long keys:
/// each difference's path copied the 20 KB of keys above it, over a hundred megabytes for one
/// conflict of the page. Past the budget the sides are shown unmarked, and said to be. And an
/// event past what is shown indented is shown as sent, without being parsed first.
#[test]
fn differences_too_many_to_mark_and_payloads_too_large_to_indent_are_shown_as_sent() {
    run(async {
        let gw = TestGateway::tokenless();
        for x in 0..2 {
            let body = deep_under_long_keys("long-keys", 6_000, x);
            assert!(body.len() < 32 * 1024, "{}", body.len());
            let a = gw.send(post("open", &[], body)).await;
            // The first is stored; every later one reuses its key.
            let want = if x == 0 {
                StatusCode::ACCEPTED
            } else {
                StatusCode::UNPROCESSABLE_ENTITY
            };
            assert_eq!(a.status, want);
        }
        let page = gw.send_local(local_get("/conflicts")).await;
        assert_eq!(page.status, StatusCode::OK);
        let html = String::from_utf8(page.body).unwrap();
        assert!(html.contains("Too many differences to mark."));
        assert_eq!(html.matches("<mark").count(), 0, "marked");

        let values = vec!["1"; 150_000].join(",");
        let event = format!(r#"{{"id":"large","a":[{values}]}}"#);
        assert!(event.len() > 256 * 1024);
        assert_eq!(
            gw.send(post("open", &[], event.clone())).await.status,
            StatusCode::ACCEPTED
        );
        let page = gw.send_local(local_get("/events/open/large")).await;
        assert_eq!(page.status, StatusCode::OK);
        let html = String::from_utf8(page.body).unwrap();
        assert!(
            html.contains("too large to show indented"),
            "{}",
            &html[..2000]
        );
    });
}

/// Numbers are shown as sent, not in the canonical form fingerprints use: `19.99` was shown as
/// `1999e-2`, and an unsigned 64-bit id as `1234567890123456789e1`.
#[test]
fn payload_numbers_are_shown_as_people_write_them() {
    run(async {
        let gw = TestGateway::tokenless();
        let body = r#"{"id":"num","amount":19.99,"big":12345678901234567890,"tiny":0.005}"#;
        let a = gw.send(post("open", &[], body)).await;
        assert_eq!(a.status, StatusCode::ACCEPTED);
        let page = gw.send_local(local_get("/events/open/num")).await;
        assert_eq!(page.status, StatusCode::OK);
        let html = String::from_utf8(page.body).unwrap();
        for shown in ["19.99", "12345678901234567890", "0.005"] {
            assert!(html.contains(shown), "{shown} missing");
        }
        assert!(
            !html.contains("e-2") && !html.contains("e1<"),
            "canonical form shown"
        );
    });
}
