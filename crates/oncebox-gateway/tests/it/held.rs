//! Clients holding connections: one that sends requests and never reads the answers is cut
//! off, and past `limits.connections` a new connection waits until one ends.

use std::time::Duration;

use axum::http::StatusCode;
use oncebox_gateway::policy::Limits;
use oncebox_testkit::run;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpSocket;

use crate::wire::{BOUND, Raw, Reply, served};

const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";

/// Pipelined requests for the OpenAPI document into a receive window of a few KiB that is
/// never read: the server's answers back up, it stops reading requests, and so its header timer
/// never starts. Before the write stall was bounded the connection stayed open for as long as
/// the server ran, and the writer below blocked for ever.
#[test]
fn a_client_that_never_reads_its_answers_is_cut_off() {
    run(async {
        let limits = Limits {
            header_timeout: Duration::from_millis(300),
            ..Limits::default()
        };
        let s = served(limits).await;
        let socket = TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let mut stream = socket.connect(s.addr).await.unwrap();
        let requests = b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n".repeat(100);
        let writing = async {
            let mut sent = 0_usize;
            loop {
                match stream.write_all(&requests).await {
                    Ok(()) => sent += 100,
                    Err(e) => return (sent, e),
                }
            }
        };
        // Ends only when the server drops the connection: nothing here reads or closes it.
        let (sent, ended) = tokio::time::timeout(BOUND, writing)
            .await
            .expect("the server still held a connection whose client read none of its answers");
        eprintln!("unread answers: cut off after {sent} requests sent ({ended})");
        assert!(
            matches!(
                ended.kind(),
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
            ),
            "{ended}"
        );
        // The gateway still serves others.
        let mut other = Raw::connect(s.addr).await;
        other.send(HEALTHZ).await;
        assert_eq!(other.reply().await.answer().status, StatusCode::OK);
    });
}

/// With `connections = 2` held open, a third connection's request waits in the backlog and is
/// answered once one of the two ends.
#[test]
fn past_the_connection_limit_a_new_connection_waits_for_one_to_end() {
    run(async {
        let limits = Limits {
            connections: 2,
            ..Limits::default()
        };
        let s = served(limits).await;
        let mut held = Vec::new();
        for _ in 0..2 {
            // Answered: accepted, and kept open (keep-alive).
            let mut raw = Raw::connect(s.addr).await;
            raw.send(HEALTHZ).await;
            assert_eq!(raw.reply().await.answer().status, StatusCode::OK);
            held.push(raw);
        }
        let mut third = Raw::connect(s.addr).await;
        third.send(HEALTHZ).await;
        let early = tokio::time::timeout(Duration::from_millis(500), third.reply()).await;
        assert!(
            early.is_err(),
            "a third connection was served beside two held ones: {early:?}"
        );
        drop(held.pop());
        match third.reply().await {
            Reply::Answer(a) => assert_eq!(a.status, StatusCode::OK),
            Reply::Closed(why) => panic!("the waiting connection was dropped: {why}"),
        }
    });
}
