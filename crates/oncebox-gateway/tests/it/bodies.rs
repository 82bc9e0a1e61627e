//! Request bodies through a real listener: one too slow (408), one cut short of its
//! Content-Length (400), one over the source's limit without a Content-Length (413), and the
//! admin and dashboard bodies held to their own limit and to the same timeout. None of them
//! stores anything.

use std::time::{Duration, Instant};

use axum::http::StatusCode;
use oncebox_gateway::policy::Limits;
use oncebox_testkit::run;
use tokio::io::AsyncWriteExt;

use crate::support::{ADMIN_TOKEN, NOW};
use crate::wire::{Raw, head, read_reply, served};

#[test]
fn slow_body_is_cut_off_with_408_and_nothing_stored() {
    run(async {
        let limits = Limits {
            body_timeout: Duration::from_millis(300),
            ..Limits::default()
        };
        let s = served(limits.clone()).await;
        // Started before connecting: the server's header timer runs from the connection's start.
        let started = Instant::now();
        let mut raw = Raw::connect(s.addr).await;
        raw.send(head("open", 100, "").as_bytes()).await;
        raw.send(br#"{"id":"slo"#).await;
        // The handler has read every byte sent, so the server closes cleanly after its answer:
        // the 408 always arrives.
        let a = raw.reply().await.answer();
        assert!(started.elapsed() >= limits.body_timeout);
        assert_eq!(a.status, StatusCode::REQUEST_TIMEOUT, "{a:?}");
        assert_eq!(a.slug(), "body-timeout");
        assert_eq!(s.gw.rows(), 0);
        // Counted as a timeout, not as an invalid event: a slow network is not a bad sender.
        let text = crate::support::metrics().render();
        let timeouts = r#"oncebox_ingest_total{source="open",outcome="timeout"}"#;
        let counted = text
            .lines()
            .find_map(|l| l.strip_prefix(timeouts)?.trim().parse::<f64>().ok());
        assert!(
            counted >= Some(1.0),
            "{timeouts} is {counted:?} in:\n{text}"
        );
    });
}

/// A signed source's request without its signature header, or signed too long ago, is
/// refused on its head: the 401 comes although not one byte of the declared megabyte was sent
/// (reading the body first would have held the request until the body timeout, then 408).
#[test]
fn an_unsigned_or_stale_head_is_refused_before_its_body() {
    run(async {
        let s = served(Limits::default()).await;
        let stale = format!(
            "Stripe-Signature: t={},v1={}\r\n",
            NOW.0 / 1000 - 3600,
            "0".repeat(64)
        );
        for (extra, slug) in [
            (String::new(), "signature-invalid"),
            (stale, "timestamp-out-of-tolerance"),
        ] {
            let mut raw = Raw::connect(s.addr).await;
            raw.send(head("stripe", 1 << 20, &extra).as_bytes()).await;
            let a = raw.reply().await.answer();
            assert_eq!(
                (a.status, a.slug().as_str()),
                (StatusCode::UNAUTHORIZED, slug),
                "{a:?}"
            );
        }
        assert_eq!(s.gw.rows(), 0);
    });
}

/// A client that declares 100 bytes, sends a whole JSON object of fewer and then closes its
/// side: what arrived parses, but it is not the body the request announced, so nothing is
/// stored and the answer is 400 `body-unreadable`.
#[test]
fn a_body_cut_short_of_its_content_length_stores_nothing() {
    run(async {
        let s = served(Limits::default()).await;
        let mut raw = Raw::connect(s.addr).await;
        let part = br#"{"id":"cut-1"}"#;
        assert!(part.len() < 100);
        raw.send(head("open", 100, "").as_bytes()).await;
        raw.send(part).await;
        raw.stream.shutdown().await.expect("shutdown");
        // Only the client's sending side is closed: the refusal still reaches it.
        let a = raw.reply().await.answer();
        assert_eq!(
            (a.status, a.slug().as_str()),
            (StatusCode::BAD_REQUEST, "body-unreadable"),
            "{a:?}"
        );
        assert_eq!(s.gw.rows(), 0, "a partial body was stored");
        // The same object sent whole is stored: the refusal was for the cut, not the content.
        let mut whole = Raw::connect(s.addr).await;
        whole.send(head("open", part.len(), "").as_bytes()).await;
        whole.send(part).await;
        assert_eq!(whole.reply().await.answer().status, StatusCode::ACCEPTED);
        assert_eq!(s.gw.rows(), 1);
    });
}

#[test]
fn oversize_body_without_content_length_is_refused_413() {
    run(async {
        let s = served(Limits::default()).await;

        // Chunked, 1 MiB for a 16-byte source, and never terminated: an answer can only come
        // from a server that refused while the body was still arriving.
        let reply = endless_chunked(s.addr, "/v1/sources/tiny/events", "application/json").await;
        let a = reply.answer();
        assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE, "{a:?}");
        assert_eq!(a.slug(), "body-too-large");

        // A declared length over the limit is refused on the head alone: no body byte is sent.
        let mut raw = Raw::connect(s.addr).await;
        raw.send(head("tiny", 10 * 1024 * 1024, "").as_bytes())
            .await;
        let a = raw.reply().await.answer();
        assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE, "{a:?}");
        assert_eq!(a.slug(), "body-too-large");

        assert_eq!(s.gw.rows(), 0);
    });
}

/// The login form, the logout form and a resolve note are small: a body past 64 KiB is refused
/// while it still arrives, before anyone's credentials are looked at — any client can reach
/// `/login`, and it must not be able to fill the gateway's memory.
#[test]
fn any_other_body_past_its_small_limit_is_refused_as_it_streams() {
    run(async {
        let s = served(Limits::default()).await;
        let form = "application/x-www-form-urlencoded";
        let bearer = format!("application/json\r\nAuthorization: Bearer {ADMIN_TOKEN}");
        for (path, kind) in [
            ("/login", form),
            ("/logout", form),
            ("/v1/deliveries/1/resolve", bearer.as_str()),
        ] {
            let a = endless_chunked(s.addr, path, kind).await.answer();
            assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE, "{path}: {a:?}");
            assert_eq!(a.slug(), "body-too-large", "{path}");
        }
        // An event is held to its source's limit (1 MiB here), not to that one.
        let padding = "x".repeat(200 << 10);
        let event = format!(r#"{{"id":"big-1","padding":"{padding}"}}"#);
        let mut raw = Raw::connect(s.addr).await;
        raw.send(head("open", event.len(), "").as_bytes()).await;
        raw.send(event.as_bytes()).await;
        let a = raw.reply().await.answer();
        assert_eq!(a.status, StatusCode::ACCEPTED, "{a:?}");
        assert_eq!(s.gw.rows(), 1);
    });
}

/// `/login` is open to anyone and every request holds a permit of the concurrency limit until
/// it is answered: a login form, a logout form or a resolve note trickled in is cut off at the
/// body timeout with 408 like an event's, and its permit (the only one here) serves the next.
#[test]
fn any_other_slow_body_is_cut_off_with_408() {
    run(async {
        let limits = Limits {
            body_timeout: Duration::from_millis(300),
            concurrency: 1,
            ..Limits::default()
        };
        let s = served(limits.clone()).await;
        let form = "application/x-www-form-urlencoded";
        let bearer = format!("application/json\r\nAuthorization: Bearer {ADMIN_TOKEN}");
        for (path, kind, part) in [
            ("/login", form, "token=ab"),
            ("/logout", form, "csrf=ab"),
            (
                "/v1/deliveries/1/resolve",
                bearer.as_str(),
                r#"{"outcome":"#,
            ),
        ] {
            let started = Instant::now();
            let mut raw = Raw::connect(s.addr).await;
            let head = format!(
                "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {kind}\r\n\
                 Content-Length: 100\r\n\r\n{part}"
            );
            raw.send(head.as_bytes()).await;
            let a = raw.reply().await.answer();
            assert!(started.elapsed() >= limits.body_timeout, "{path}");
            assert_eq!(
                (a.status, a.slug().as_str()),
                (StatusCode::REQUEST_TIMEOUT, "body-timeout"),
                "{path}: {a:?}"
            );
            let event = format!(r#"{{"id":"after-{}"}}"#, path.len());
            let mut next = Raw::connect(s.addr).await;
            next.send(head_event(&event).as_bytes()).await;
            assert_eq!(next.reply().await.answer().status, StatusCode::ACCEPTED);
        }
        assert_eq!(s.gw.rows(), 3);
    });
}

fn head_event(event: &str) -> String {
    format!("{}{event}", head("open", event.len(), ""))
}

/// POSTs to `path` a chunked body of 1 MiB that is never terminated, and returns the answer:
/// one can only come from a server that refused while the body was still arriving. `kind` is
/// the Content-Type's value, and may carry more header lines.
async fn endless_chunked(addr: std::net::SocketAddr, path: &str, kind: &str) -> crate::wire::Reply {
    let mut raw = Raw::connect(addr).await;
    raw.send(
        format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {kind}\r\n\
             Transfer-Encoding: chunked\r\n\r\n"
        )
        .as_bytes(),
    )
    .await;
    let chunk = vec![b' '; 64 * 1024];
    let (mut rd, mut wr) = raw.stream.split();
    let writer = async {
        for _ in 0..16 {
            let size = format!("{:x}\r\n", chunk.len());
            // Once the server has answered it may close; the remaining chunks then fail.
            let sent = async {
                wr.write_all(size.as_bytes()).await?;
                wr.write_all(&chunk).await?;
                wr.write_all(b"\r\n").await
            };
            if sent.await.is_err() {
                break;
            }
        }
        std::future::pending::<()>().await;
    };
    tokio::select! {
        reply = read_reply(&mut rd, &mut raw.buf) => reply,
        () = writer => unreachable!("the writer never finishes"),
    }
}
