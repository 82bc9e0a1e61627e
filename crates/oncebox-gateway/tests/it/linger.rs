//! Through a real listener: a refusal sent before the body was read still reaches a client that
//! goes on sending the body (the lingering close), and oversize requests from an ordinary HTTP
//! client get their 413, never a broken connection.

use axum::http::StatusCode;
use oncebox_gateway::policy::Limits;
use oncebox_testkit::run;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::wire::{BOUND, Raw, head, served};

/// Declared over the limit, the head alone is refused and the server ends its side. A client
/// that only then sends the body it declared (as many do: they write it all before reading)
/// must be able to: a socket closed with the body still arriving would answer it with a reset.
#[test]
fn a_client_sending_its_body_after_the_refusal_is_not_reset() {
    run(async {
        let s = served(Limits::default()).await;
        let body = vec![b' '; 2 << 20];
        let mut raw = Raw::connect(s.addr).await;
        raw.send(head("tiny", body.len(), "").as_bytes()).await;
        let a = raw.reply().await.answer();
        assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE, "{a:?}");
        assert_eq!(a.slug(), "body-too-large");
        // The server's end of the conversation: EOF, so the connection is done for hyper and
        // what follows meets only the close.
        let mut byte = [0u8; 1];
        let eof = tokio::time::timeout(BOUND, raw.stream.read(&mut byte))
            .await
            .expect("the server ends its side after a refusal");
        assert_eq!(eof.expect("read after the refusal"), 0, "EOF after the 413");

        for (n, chunk) in body.chunks(64 << 10).enumerate() {
            let sent = tokio::time::timeout(BOUND, raw.stream.write_all(chunk))
                .await
                .expect("the server reads what the client still sends");
            if let Err(e) = sent {
                panic!("chunk {n} of the declared body after the 413 failed: {e}");
            }
        }
        raw.stream.flush().await.expect("flush");
        assert_eq!(s.gw.rows(), 0);
    });
}

/// An ordinary client writes the whole declared body before it reads: each of these requests
/// must end in the 413 it was answered, on a fresh connection every time.
#[test]
fn oversize_bodies_from_an_http_client_all_get_413() {
    run(async {
        let s = served(Limits::default()).await;
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .timeout(BOUND)
            .build()
            .expect("http client");
        let body = format!(r#"{{"id":"big","p":"{}"}}"#, "x".repeat(2 << 20));
        let mut answers = Vec::new();
        for _ in 0..20 {
            let sent = client
                .post(format!("http://{}/v1/sources/open/events", s.addr))
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await;
            answers.push(match sent {
                Ok(res) => res.status().as_u16().to_string(),
                Err(e) => format!("{e:?}"),
            });
        }
        let refused = answers.iter().filter(|a| *a == "413").count();
        assert_eq!(refused, answers.len(), "answers: {answers:?}");
        assert_eq!(s.gw.rows(), 0);
    });
}
