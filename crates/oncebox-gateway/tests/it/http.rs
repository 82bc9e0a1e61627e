//! Through a real listener: racing duplicates, slow clients, limits, shutdown.

use std::time::{Duration, Instant};

use axum::http::StatusCode;
use oncebox_gateway::policy::{GatewayConfig, Limits};
use oncebox_testkit::race::timed;
use oncebox_testkit::run;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::support::{Answer, TestGateway};
use crate::wire::{BOUND, Raw, Reply, deliver, get, in_flight, served};

#[test]
fn fifty_concurrent_deliveries_of_one_key_give_one_accept_and_49_replays() {
    run(async {
        let s = served(Limits::default()).await;
        // One client each, connected first: 50 connections racing with nothing but the request
        // left to send, not one pooled connection taking turns.
        let mut clients = Vec::new();
        for _ in 0..50 {
            let client = reqwest::Client::new();
            assert_eq!(
                get(&client, s.addr, "/healthz").await.status,
                StatusCode::OK
            );
            clients.push(client);
        }
        // The store's writer held: no request can commit, so none can be answered, before the
        // test has seen them meet in the store.
        let hold = oncebox_testkit::writer::hold_writer(&s.gw.inbox).await;
        let body = r#"{"id":"evt-50","amount":1}"#;
        let requests: Vec<_> = clients
            .iter()
            .map(|client| {
                let (client, addr) = (client.clone(), s.addr);
                tokio::spawn(async move { timed(deliver(&client, addr, "open", body)).await })
            })
            .collect();
        // Proof of the race: requests for the one key wait in the writer's queue together.
        let until = Instant::now() + BOUND;
        while s.gw.inbox.queued() < 2 {
            assert!(
                Instant::now() < until,
                "the requests never met in the store"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let released = Instant::now();
        drop(hold);
        let mut timings = Vec::new();
        for r in requests {
            timings.push(r.await.expect("request task"));
        }
        // No replay came before the winner's commit: nothing was answered while the writer was
        // held, and the first commit it made after was the winner's.
        assert!(
            timings.iter().all(|t| t.answered >= released),
            "answered while no commit could have happened"
        );
        let answers: Vec<Answer> = timings.into_iter().map(|t| t.value).collect();
        for a in &answers {
            assert_eq!(a.status, StatusCode::ACCEPTED, "{a:?}");
        }
        let (first, replays): (Vec<&Answer>, Vec<&Answer>) =
            answers.iter().partition(|a| !a.replayed());
        assert_eq!(first.len(), 1, "answers without Idempotent-Replayed");
        assert_eq!(replays.len(), 49);
        assert_eq!(first[0].json()["event_id"], "evt-50");
        for r in replays {
            assert_eq!(
                r.body, first[0].body,
                "a replay differs from the first answer"
            );
        }
        assert_eq!(s.gw.rows(), 1);
    });
}

#[test]
fn slowloris_headers_are_cut_off() {
    run(async {
        let limits = Limits {
            header_timeout: Duration::from_millis(300),
            ..Limits::default()
        };
        let s = served(limits.clone()).await;
        // Started before connecting: the server's header timer runs from the connection's start.
        let started = Instant::now();
        let mut raw = Raw::connect(s.addr).await;
        raw.send(b"POST /v1/sources/open/events HTTP/1.1\r\nHost: x\r\n")
            .await;
        let reply = raw.reply().await;
        // The connection stayed open until the header timer fired: what ended it is the
        // timeout, not an early refusal of the partial head. (Timers never fire early and the
        // server's timer starts after `started`, taken before connecting, so this lower bound
        // cannot flake.)
        assert!(
            started.elapsed() >= limits.header_timeout,
            "ended after {:?}: {reply:?}",
            started.elapsed()
        );
        if let Reply::Answer(a) = reply {
            assert_eq!(a.status, StatusCode::REQUEST_TIMEOUT, "{a:?}");
        }
        assert_eq!(s.gw.rows(), 0);
    });
}

#[test]
fn silent_connections_are_cut_off() {
    run(async {
        let limits = Limits {
            header_timeout: Duration::from_millis(300),
            ..Limits::default()
        };
        let s = served(limits.clone()).await;
        // Nothing at all, or a single byte: the header timer must end them, or each would hold
        // a file descriptor forever. (`reply` fails the test if the connection outlives its
        // bound.)
        for opening in [&b""[..], b"P"] {
            let started = Instant::now();
            let mut raw = Raw::connect(s.addr).await;
            if !opening.is_empty() {
                raw.send(opening).await;
            }
            let reply = raw.reply().await;
            assert!(
                started.elapsed() >= limits.header_timeout,
                "{opening:?}: {reply:?}"
            );
        }
        // An HTTP/2 preface is not HTTP/1.1: refused at once.
        let mut raw = Raw::connect(s.addr).await;
        raw.send(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
        match raw.reply().await {
            Reply::Answer(a) => assert_eq!(a.status, StatusCode::BAD_REQUEST),
            Reply::Closed(_) => {}
        }
        assert_eq!(s.gw.rows(), 0);
    });
}

#[test]
fn concurrency_limit_answers_503_at_once() {
    run(async {
        let limits = Limits {
            concurrency: 1,
            body_timeout: Duration::from_secs(30),
            retry_after: Duration::from_secs(3),
            ..Limits::default()
        };
        let s = served(limits).await;
        let body = r#"{"id":"evt-a","amount":1}"#;
        let mut holder = in_flight(s.addr, body, 10).await;

        // The only permit is held by a request waiting for its body: another one is shed at
        // once instead of queueing behind it, and stores nothing.
        let client = reqwest::Client::new();
        let other = r#"{"id":"evt-b","amount":1}"#;
        let shed = deliver(&client, s.addr, "open", other).await;
        assert_eq!(shed.status, StatusCode::SERVICE_UNAVAILABLE, "{shed:?}");
        assert_eq!(shed.headers["retry-after"], "3");
        assert_eq!(shed.slug(), "unavailable");

        holder.send(&body.as_bytes()[10..]).await;
        let a = holder.reply().await.answer();
        assert_eq!(a.status, StatusCode::ACCEPTED, "{a:?}");
        assert!(!a.replayed());

        // The permit is released before the answer is written, so the shed sender's retry is
        // accepted now, as a first delivery.
        let retried = deliver(&client, s.addr, "open", other).await;
        assert_eq!(retried.status, StatusCode::ACCEPTED, "{retried:?}");
        assert!(!retried.replayed());
        assert_eq!(s.gw.rows(), 2);
    });
}

/// Past the limit the probes and a scrape still answer (a busy gateway is alive, and ready
/// while its store is), and each shed ingest request is counted `unavailable` under its source, or under
/// `_unknown` for a name no source has.
#[test]
fn past_the_limit_probes_answer_and_shed_requests_are_counted_per_source() {
    run(async {
        let limits = Limits {
            concurrency: 1,
            body_timeout: Duration::from_secs(30),
            ..Limits::default()
        };
        let mut config = GatewayConfig {
            limits: limits.clone(),
            ..crate::support::config()
        };
        config.sources.insert(
            oncebox_core::Source::new("shed").unwrap(),
            oncebox_gateway::policy::SourcePolicy::open(),
        );
        let gw = TestGateway::with(config, oncebox_sqlite::Options::new);
        let (addr, _stop, _server) = gw.listen(limits).await;
        let body = r#"{"id":"evt-holder","amount":1}"#;
        let mut holder = in_flight(addr, body, 10).await;

        let client = reqwest::Client::new();
        // A scrape too: an overload is when its figures matter.
        for path in ["/healthz", "/readyz", "/metrics"] {
            let probe = client
                .get(format!("http://{addr}{path}"))
                .bearer_auth(crate::support::ADMIN_TOKEN)
                .send()
                .await
                .expect("probe");
            assert_eq!(probe.status(), StatusCode::OK, "{path}");
        }
        // `sh%65d` is `shed` percent-encoded, as the router would decode it.
        for source in ["shed", "sh%65d", "no-such-source-shed"] {
            let shed = deliver(&client, addr, source, r#"{"id":"s1"}"#).await;
            assert_eq!(shed.status, StatusCode::SERVICE_UNAVAILABLE, "{shed:?}");
        }
        let text = crate::support::metrics().render();
        let line = r#"oncebox_ingest_total{source="shed",outcome="unavailable"} 2"#;
        assert!(
            text.lines().any(|l| l == line),
            "{line} missing in:\n{text}"
        );
        assert!(!text.contains("no-such-source-shed"), "{text}");
        // Shed requests were never handled: they add no latency sample (the series may exist,
        // empty, with the source's kept handles).
        let samples = text.lines().find_map(|l| {
            l.strip_prefix(r#"oncebox_ingest_duration_seconds_count{source="shed"} "#)
        });
        assert!(matches!(samples, None | Some("0")), "{samples:?}");

        holder.send(&body.as_bytes()[10..]).await;
        assert_eq!(holder.reply().await.answer().status, StatusCode::ACCEPTED);
        assert_eq!(gw.rows(), 1);
    });
}

#[test]
fn graceful_shutdown_finishes_in_flight_requests() {
    run(async {
        let s = served(Limits::default()).await;
        // An idle keep-alive connection: the server closes it when its graceful shutdown
        // begins, after dropping the listener. That is the test's sign that shutdown started.
        let mut idle = Raw::connect(s.addr).await;
        idle.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert_eq!(idle.reply().await.answer().status, StatusCode::OK);

        let body = r#"{"id":"evt-graceful","amount":1}"#;
        let mut a = in_flight(s.addr, body, 10).await;
        s.stop.send(()).expect("server running");
        let idle_end = idle.reply().await;
        assert!(matches!(idle_end, Reply::Closed(_)), "{idle_end:?}");
        let late = TcpStream::connect(s.addr).await;
        assert!(
            late.is_err(),
            "a new connection was accepted after shutdown"
        );

        a.send(&body.as_bytes()[10..]).await;
        let answer = a.reply().await.answer();
        assert_eq!(answer.status, StatusCode::ACCEPTED, "{answer:?}");
        assert_eq!(s.gw.rows(), 1);
        tokio::time::timeout(BOUND, s.server)
            .await
            .expect("server still running after its last request")
            .expect("server task");
    });
}

#[test]
fn requests_cut_by_the_shutdown_grace_never_get_2xx() {
    run(async {
        let limits = Limits {
            shutdown_grace: Duration::from_millis(200),
            body_timeout: Duration::from_secs(30),
            ..Limits::default()
        };
        let s = served(limits).await;
        let body = r#"{"id":"evt-cut","amount":1}"#;
        let mut a = in_flight(s.addr, body, 10).await;
        s.stop.send(()).expect("server running");
        tokio::time::timeout(BOUND, s.server)
            .await
            .expect("server still running after the shutdown grace")
            .expect("server task");

        // A cut request stays cut: even when its sender finishes the body after the server
        // returned, it gets no answer and stores nothing. The write may fail on a closed
        // connection, which is the expected outcome.
        let _ = a.stream.write_all(&body.as_bytes()[10..]).await;
        match a.reply().await {
            Reply::Closed(_) => {}
            Reply::Answer(answer) => {
                panic!("the request outlived the shutdown grace and was answered: {answer:?}")
            }
        }
        assert_eq!(s.gw.rows(), 0);
    });
}

#[test]
fn unknown_source_is_404_over_http() {
    run(async {
        let s = served(Limits::default()).await;
        let client = reqwest::Client::new();
        let a = deliver(&client, s.addr, "nope", r#"{"id":"evt-1"}"#).await;
        assert_eq!(a.status, StatusCode::NOT_FOUND, "{a:?}");
        assert_eq!(a.slug(), "unknown-source");
        assert_eq!(s.gw.rows(), 0);
    });
}

#[test]
fn healthz_and_readyz_answer() {
    run(async {
        let s = served(Limits::default()).await;
        let client = reqwest::Client::new();
        assert_eq!(
            get(&client, s.addr, "/healthz").await.status,
            StatusCode::OK
        );
        assert_eq!(get(&client, s.addr, "/readyz").await.status, StatusCode::OK);
    });
}

#[test]
fn design_section_4_rows_over_a_real_listener() {
    run(async {
        let s = served(Limits::default()).await;
        let client = reqwest::Client::new();
        let new = deliver(&client, s.addr, "open", r#"{"id":"r1","n":1}"#).await;
        assert_eq!(new.status, StatusCode::ACCEPTED);
        let dup = deliver(&client, s.addr, "open", r#"{"n":1,"id":"r1"}"#).await;
        assert_eq!(
            (dup.status, dup.replayed(), &dup.body),
            (StatusCode::ACCEPTED, true, &new.body)
        );
        let conflict = deliver(&client, s.addr, "open", r#"{"id":"r1","n":2}"#).await;
        assert_eq!(
            (conflict.status, conflict.slug().as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, "key-reused")
        );
        let ordered = |id: &str, v: i64| {
            format!(r#"{{"id":"{id}","created":{v},"data":{{"object":{{"id":"o"}}}}}}"#)
        };
        deliver(&client, s.addr, "ordered", &ordered("late-2", 2)).await;
        let stale = deliver(&client, s.addr, "ordered", &ordered("late-1", 1)).await;
        assert_eq!(
            (stale.status, stale.json()["stale"].as_bool()),
            (StatusCode::ACCEPTED, Some(true))
        );
        let invalid = deliver(&client, s.addr, "open", r#"{"n":1}"#).await;
        assert_eq!(
            (invalid.status, invalid.slug().as_str()),
            (StatusCode::BAD_REQUEST, "event-id-missing")
        );
        let unsigned = deliver(&client, s.addr, "shop", r#"{"id":"x"}"#).await;
        assert_eq!(
            (unsigned.status, unsigned.slug().as_str()),
            (StatusCode::UNAUTHORIZED, "signature-invalid")
        );
        let event = oncebox_core::Event::json(
            oncebox_core::Key::parse("open", "held").unwrap(),
            r#"{"id":"held"}"#,
        )
        .unwrap();
        s.gw.inbox
            .begin(event, Duration::from_secs(5))
            .await
            .unwrap();
        let busy = deliver(&client, s.addr, "open", r#"{"id":"held"}"#).await;
        assert_eq!(
            (busy.status, busy.slug().as_str()),
            (StatusCode::CONFLICT, "in-progress")
        );
        assert!(busy.headers.contains_key("retry-after"));
        assert_eq!(
            s.gw.rows(),
            4,
            "r1, late-2, late-1 (stale) and the held lease"
        );
    });
}
