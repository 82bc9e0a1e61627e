//! Through a real listener: an answer that leaves part of the request's body unread carries
//! `Connection: close` (the server will not keep that connection, and a pooled client must not
//! send its next request on it), and an answer after the body was read keeps the connection.

use axum::http::StatusCode;
use oncebox_gateway::policy::Limits;
use oncebox_testkit::run;
use tokio::io::AsyncReadExt;

use crate::support::Answer;
use crate::wire::{BOUND, Raw, Served, head, served};

/// Sends `head` then `body` on a fresh connection; returns the answer and the connection.
async fn ask(s: &Served, head: &str, body: &[u8]) -> (Answer, Raw) {
    let mut raw = Raw::connect(s.addr).await;
    raw.send(head.as_bytes()).await;
    raw.send(body).await;
    let a = raw.reply().await.answer();
    (a, raw)
}

fn asks_for_the_close(a: &Answer) -> bool {
    a.headers
        .get("connection")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"))
}

/// The answer says close, and the server does close: EOF follows it.
async fn assert_closes(a: &Answer, raw: &mut Raw) {
    assert!(asks_for_the_close(a), "{a:?}");
    assert!(raw.buf.is_empty(), "nothing after the answer");
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(BOUND, raw.stream.read(&mut byte))
        .await
        .expect("the server ends its side after the answer");
    assert_eq!(read.expect("read after the answer"), 0, "EOF after {a:?}");
}

/// The answer says nothing of a close, and the same connection answers a second request.
async fn assert_kept(a: &Answer, raw: &mut Raw) {
    assert!(!asks_for_the_close(a), "{a:?}");
    let body = br#"{"id":"second"}"#;
    raw.send(head("open", body.len(), "").as_bytes()).await;
    raw.send(body).await;
    let next = raw.reply().await.answer();
    assert_eq!(next.status, StatusCode::ACCEPTED, "{next:?}");
}

#[test]
fn a_413_on_the_declared_length_asks_for_the_close() {
    run(async {
        let s = served(Limits::default()).await;
        let (a, mut raw) = ask(&s, &head("open", 2_000_000, ""), b"").await;
        assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE, "{a:?}");
        assert_closes(&a, &mut raw).await;
    });
}

#[test]
fn a_refusal_decided_on_the_head_asks_for_the_close() {
    run(async {
        let s = served(Limits::default()).await;
        let body = br#"{"id":"evt_1"}"#;
        // An unknown source, and a signed source's request without its signature header.
        for (source, status) in [
            ("nosuch", StatusCode::NOT_FOUND),
            ("shop", StatusCode::UNAUTHORIZED),
        ] {
            let (a, mut raw) = ask(&s, &head(source, body.len(), ""), body).await;
            assert_eq!(a.status, status, "{source}: {a:?}");
            assert_closes(&a, &mut raw).await;
        }
        assert_eq!(s.gw.rows(), 0);
    });
}

#[test]
fn an_answer_after_the_body_was_read_keeps_the_connection() {
    run(async {
        let s = served(Limits::default()).await;
        let accepted = br#"{"id":"first"}"#;
        let (a, mut raw) = ask(&s, &head("open", accepted.len(), ""), accepted).await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "{a:?}");
        assert_kept(&a, &mut raw).await;

        let invalid = br#"{"id": not json"#;
        let (a, mut raw) = ask(&s, &head("open", invalid.len(), ""), invalid).await;
        assert_eq!(
            (a.status, a.slug().as_str()),
            (StatusCode::BAD_REQUEST, "invalid-json"),
            "{a:?}"
        );
        assert_kept(&a, &mut raw).await;
        assert_eq!(s.gw.rows(), 2);
    });
}
