//! What a receiver's answer can do to the relay: a body without end is read only so far, an
//! error about a route whose URL carries credentials keeps them out of the stored error, a
//! proxy's gateway timeout or a redirect after a POST is no answer, and an in-progress answer is
//! asked again.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use oncebox_core::delivery::DeliveryState;
use oncebox_core::relay_store::STATUS_RECHECK;
use oncebox_testkit::run;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{World, closed_port, receiver, route};

/// Answers every request with `status` and a chunked body that never ends, until the client
/// stops reading and the connection breaks; counts the body bytes the client took.
async fn endless(status: u16) -> (SocketAddr, Arc<AtomicU64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let sent = Arc::new(AtomicU64::new(0));
    let counter = sent.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let sent = counter.clone();
            tokio::spawn(async move {
                // The request's head and body arrive in the first reads; what they say does
                // not matter.
                let mut buf = vec![0u8; 64 << 10];
                let mut seen = Vec::new();
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
                let head = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
                );
                if socket.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = [b'7'; 60 << 10];
                let mut framed = format!("{:x}\r\n", chunk.len()).into_bytes();
                framed.extend_from_slice(&chunk);
                framed.extend_from_slice(b"\r\n");
                // Counted as the kernel takes the bytes, not per whole chunk: a chunk the relay
                // stopped reading in the middle of was not counted at all, and a body read past
                // its limit could read as short of it.
                let mut at = 0;
                while let Ok(n @ 1..) = socket.write(&framed[at..]).await {
                    sent.fetch_add(n as u64, Ordering::SeqCst);
                    at = (at + n) % framed.len();
                }
            });
        }
    });
    (addr, sent)
}

/// Past this the relay would be buffering the body: its limit (64 KiB) plus what the two
/// sockets' buffers take in before the writer blocks.
const MOST_TAKEN: u64 = 32 << 20;

#[test]
fn an_answer_whose_body_never_ends_is_read_only_so_far() {
    run(async {
        let w = World::new();
        let (addr, sent) = endless(200).await;
        w.accept("evt-1", &["hooks"]).await;
        let relay = w.relay(vec![route("hooks", addr, true)]);
        let out = relay.run_once().await.unwrap();
        assert_eq!(out.delivered, 1, "{out:?}");
        let taken = sent.load(Ordering::SeqCst);
        assert!(taken > 64 << 10, "the body really streamed: {taken} bytes");

        // The status URL's answer is bounded the same way, and says nothing.
        let (rx, ok) = receiver::start().await;
        let (proxy, dropped) = receiver::dropping_proxy(ok).await;
        let mut plain = route("plain", proxy, false);
        plain.status_url = Some(format!("http://{addr}/status/{{key}}"));
        let relay = w.relay(vec![plain]);
        w.accept("evt-2", &["plain"]).await;
        assert_eq!(relay.run_once().await.unwrap().uncertain, 1);
        assert_eq!(*dropped.lock().unwrap(), 1, "the reply was really dropped");
        assert_eq!(rx.requests().len(), 1);
        let before = sent.load(Ordering::SeqCst);
        w.clock.advance(STATUS_RECHECK.0);
        assert_eq!(relay.run_once().await.unwrap().reconciled, 0);
        assert_eq!(w.delivery("evt-2").await.state, DeliveryState::Uncertain);
        let asked = sent.load(Ordering::SeqCst) - before;
        eprintln!("endless answers: the attempt took {taken} bytes, the status question {asked}");
        assert!(
            asked > 64 << 10,
            "the status body really streamed: {asked} bytes"
        );
        for n in [taken, asked] {
            assert!(n < MOST_TAKEN, "{n} bytes taken from an endless body");
        }
    });
}

#[test]
fn a_route_urls_credentials_stay_out_of_the_stored_error() {
    run(async {
        let w = World::new();
        let mut r = route("hooks", closed_port(), true);
        r.url = format!(
            "http://relay-user:s3cr3t-pw@{}/hook?token=t0k3n",
            closed_port()
        );
        w.accept("evt-1", &["hooks"]).await;
        let out = w.relay(vec![r]).run_once().await.unwrap();
        assert_eq!(out.retrying, 1, "{out:?}");
        let error = w.delivery("evt-1").await.last_error.expect("an error");
        assert!(error.contains("connect"), "{error}");
        for secret in ["s3cr3t-pw", "t0k3n", "relay-user"] {
            assert!(!error.contains(secret), "{secret} in {error:?}");
        }
    });
}

/// A proxy's gateway timeout says the request went on to a receiver that did not answer in
/// time, and a 302 or 303 is what a web framework answers after it applied a POST: on a route
/// that does not honour the key either is parked uncertain, not sent again.
#[test]
fn a_gateway_timeout_or_a_redirect_after_a_post_is_no_answer_on_a_route_that_ignores_the_key() {
    run(async {
        for status in [504, 302, 303] {
            for (idempotent, after) in [
                (false, DeliveryState::Uncertain),
                (true, DeliveryState::Retrying),
            ] {
                let w = World::new();
                let (rx, addr) = receiver::start().await;
                rx.answer_with(&[(status, &[("location", "/done")])]);
                w.accept("evt_proxied", &["hooks"]).await;
                let relay = w.relay(vec![route("hooks", addr, idempotent)]);
                relay.run_once().await.unwrap();
                let d = w.delivery("evt_proxied").await;
                assert_eq!(
                    (d.state, d.attempts),
                    (after, 1),
                    "{status}, idempotent: {idempotent}"
                );
                assert_eq!(rx.requests().len(), 1);
            }
        }
    });
}

/// A receiver that honours the key answers 409 while an earlier request with it is still at
/// work: the relay asks again when told, and the delivery ends delivered, not dead.
#[test]
fn an_in_progress_answer_is_asked_again_where_the_key_is_honoured() {
    run(async {
        let w = World::new();
        let (rx, addr) = receiver::start().await;
        rx.answer(&[(409, Some(30)), (200, None)]);
        w.accept("evt_busy", &["hooks"]).await;
        let relay = w.relay(vec![route("hooks", addr, true)]);
        relay.run_once().await.unwrap();
        let d = w.delivery("evt_busy").await;
        assert_eq!((d.state, d.attempts), (DeliveryState::Retrying, 1), "{d:?}");
        w.clock.advance(std::time::Duration::from_secs(30));
        relay.run_once().await.unwrap();
        let d = w.delivery("evt_busy").await;
        assert_eq!(
            (d.state, d.attempts),
            (DeliveryState::Delivered, 2),
            "{d:?}"
        );
        assert_eq!(rx.effects_of("shop:evt_busy"), 1);
    });
}
