//! Delivery and classification: the request DESIGN §6 describes, backoff honouring
//! `Retry-After`, client errors dead, refused connections retried, per-route limits (circuits
//! are in `circuit.rs`).

use std::sync::atomic::Ordering;
use std::time::Duration;

use oncebox_core::delivery::DeliveryState;
use oncebox_core::route::Route;
use oncebox_core::signature::{Headers, Scheme, Secret, verify};
use oncebox_testkit::run;

use crate::{SECRET, START, World, receiver, route};

/// A request's headers as a signature check reads them: the bytes as they arrived.
pub(crate) struct Lookup<'a>(pub(crate) &'a axum::http::HeaderMap);

impl Headers for Lookup<'_> {
    fn get(&self, name: &str) -> Option<&[u8]> {
        self.0.get(name).map(|v| v.as_bytes())
    }
}

#[test]
fn delivers_with_a_stable_key_the_attempt_number_and_a_verifiable_signature() {
    run(async {
        let w = World::new();
        let (rx, addr) = receiver::start().await;
        w.accept("evt_1", &["hooks"]).await;
        let relay = w.relay(vec![route("hooks", addr, true)]);
        let out = relay.run_once().await.unwrap();
        assert_eq!((out.claimed, out.delivered), (1, 1));
        let seen = rx.requests();
        assert_eq!(seen.len(), 1);
        let h = &seen[0].headers;
        assert_eq!(h["idempotency-key"], "shop:evt_1");
        assert_eq!(h["oncebox-attempt"], "1");
        assert_eq!(h["user-agent"], oncebox_relay::USER_AGENT);
        assert!(oncebox_relay::USER_AGENT.starts_with("oncebox/0."));
        let fence = h["oncebox-fencing-token"].to_str().unwrap().parse::<i64>();
        assert!(fence.is_ok_and(|f| f > 0), "{h:?}");
        assert_eq!(h["webhook-id"], "shop:evt_1");
        assert_eq!(seen[0].body, br#"{"id":"evt_1"}"#);
        let secret = Secret::parse(&Scheme::StandardWebhooks, SECRET).unwrap();
        verify(
            &Scheme::StandardWebhooks,
            &[secret],
            &Lookup(h),
            &seen[0].body,
            w.clock_now(),
            Duration::from_secs(300),
        )
        .expect("the receiver verifies the signature with a Standard Webhooks check");
        assert_eq!(w.delivery("evt_1").await.state, DeliveryState::Delivered);
        assert_eq!(
            relay.run_once().await.unwrap().claimed,
            0,
            "delivered once, not again"
        );
    });
}

#[test]
fn server_errors_back_off_honouring_retry_after_then_deliver_with_the_same_key() {
    run(async {
        let w = World::new();
        let (rx, addr) = receiver::start().await;
        rx.answer(&[(503, Some(120)), (200, None)]);
        w.accept("evt_2", &["hooks"]).await;
        let relay = w.relay(vec![route("hooks", addr, false)]);
        assert_eq!(relay.run_once().await.unwrap().retrying, 1);
        let d = w.delivery("evt_2").await;
        assert_eq!(d.state, DeliveryState::Retrying);
        let wait = d.next_attempt_at.unwrap().millis() - w.clock_now().millis();
        assert!(
            wait >= 120_000,
            "Retry-After 120 s honoured, waited {wait} ms"
        );
        w.clock.advance(Duration::from_secs(119));
        assert_eq!(
            relay.run_once().await.unwrap().claimed,
            0,
            "not due before Retry-After"
        );
        w.clock
            .advance(Duration::from_millis(wait as u64 - 119_000));
        assert_eq!(relay.run_once().await.unwrap().delivered, 1);
        let seen = rx.requests();
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[1].headers["oncebox-attempt"], "2");
        assert_eq!(
            seen[0].headers["idempotency-key"],
            seen[1].headers["idempotency-key"]
        );
    });
}

#[test]
fn throttling_honours_retry_after_given_as_an_http_date() {
    run(async {
        let w = World::new();
        let (rx, addr) = receiver::start().await;
        // 90 s after the answer's own date, in the form RFC 9110 prefers. The receiver's clock
        // is a day ahead of the relay's (START, 2026-01-01T00:00:00Z): the wait is still 90 s.
        rx.answer_with(&[
            (
                429,
                &[
                    ("date", "Fri, 02 Jan 2026 00:00:00 GMT"),
                    ("retry-after", "Fri, 02 Jan 2026 00:01:30 GMT"),
                ],
            ),
            (200, &[]),
        ]);
        w.accept("evt_d", &["hooks"]).await;
        let relay = w.relay(vec![route("hooks", addr, true)]);
        assert_eq!(relay.run_once().await.unwrap().retrying, 1);
        let d = w.delivery("evt_d").await;
        let due = d.next_attempt_at.unwrap().millis();
        let wait = due - START.millis();
        assert!(
            (90_000..120_000).contains(&wait),
            "due {wait} ms after the start: not the 90 s the receiver asked for"
        );
        w.clock.advance(Duration::from_secs(89));
        assert_eq!(
            relay.run_once().await.unwrap().claimed,
            0,
            "not due before the date"
        );
        w.clock
            .advance(Duration::from_millis((due - w.clock_now().millis()) as u64));
        assert_eq!(relay.run_once().await.unwrap().delivered, 1);
        assert_eq!(rx.requests().len(), 2);
    });
}

#[test]
fn a_receiver_that_never_answers_is_cut_off_at_the_route_timeout() {
    run(async {
        let w = World::new();
        let (addr, read) = receiver::silent().await;
        let quick = |name: &str, idempotent| Route {
            timeout: Duration::from_millis(300),
            ..route(name, addr, idempotent)
        };
        w.accept("evt_idem", &["idem"]).await;
        w.accept("evt_plain", &["plain"]).await;
        let relay = w.relay(vec![quick("idem", true), quick("plain", false)]);
        let out = relay.run_once().await.unwrap();
        // Both requests arrived: the receiver may have applied them, so the silence is no
        // proof that nothing happened.
        assert_eq!(read.load(Ordering::SeqCst), 2, "{out:?}");
        assert_eq!((out.retrying, out.uncertain), (1, 1), "{out:?}");
        let idem = w.delivery("evt_idem").await;
        assert_eq!(
            idem.state,
            DeliveryState::Retrying,
            "the same key again is safe at a receiver that deduplicates"
        );
        let plain = w.delivery("evt_plain").await;
        assert_eq!(
            plain.state,
            DeliveryState::Uncertain,
            "a second send could apply it twice: it waits for reconciliation"
        );
        for d in [&idem, &plain] {
            let error = d.last_error.as_deref().unwrap_or_default();
            assert!(error.contains("timed out"), "{error}");
        }
    });
}

#[test]
fn client_errors_are_dead_and_throttling_is_retried() {
    run(async {
        let w = World::new();
        let (rx, addr) = receiver::start().await;
        let relay = w.relay(vec![route("hooks", addr, true)]);
        for (status, id, want) in [
            (400, "e400", DeliveryState::Dead),
            (410, "e410", DeliveryState::Dead),
            (422, "e422", DeliveryState::Dead),
            (429, "e429", DeliveryState::Retrying),
            (408, "e408", DeliveryState::Retrying),
            (500, "e500", DeliveryState::Retrying),
        ] {
            rx.answer(&[(status, None)]);
            w.accept(id, &["hooks"]).await;
            relay.run_once().await.unwrap();
            let d = w.delivery(id).await;
            assert_eq!((d.state, d.last_status), (want, Some(status)), "{status}");
        }
    });
}

#[test]
fn refused_connections_are_retried_as_nothing_was_sent() {
    run(async {
        let w = World::new();
        // A port nobody listens on: bind, learn it, close it.
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        w.accept("evt_r", &["hooks"]).await;
        let relay = w.relay(vec![route("hooks", closed, false)]);
        let out = relay.run_once().await.unwrap();
        assert_eq!(out.retrying, 1, "{out:?}");
        let d = w.delivery("evt_r").await;
        assert_eq!(
            d.state,
            DeliveryState::Retrying,
            "not uncertain: the request never left"
        );
        assert!(d.last_error.is_some());
    });
}

#[test]
fn attempts_are_capped_then_dead() {
    run(async {
        let w = World::new();
        let (rx, addr) = receiver::start().await;
        rx.answer(&[(500, None)]);
        w.accept("evt_c", &["hooks"]).await;
        let relay = w.relay(vec![route("hooks", addr, true)]);
        for _ in 0..5 {
            relay.run_once().await.unwrap();
            w.clock.advance(Duration::from_secs(3600));
        }
        let d = w.delivery("evt_c").await;
        assert_eq!((d.state, d.attempts), (DeliveryState::Dead, 5));
        assert_eq!(rx.requests().len(), 5);
    });
}

/// A creation time an operator's edit put at the start of time: the delivery is as old as can
/// be, past any `max_age`, and is dead after one failure (the age's subtraction overflowed).
#[test]
fn a_creation_time_at_the_start_of_time_is_past_any_max_age() {
    run(async {
        let w = World::new();
        let (rx, addr) = receiver::start().await;
        rx.answer(&[(500, None)]);
        w.accept("evt_old", &["hooks"]).await;
        rusqlite::Connection::open(w.path())
            .unwrap()
            .execute("UPDATE oncebox_outbox SET created_at = ?1", [i64::MIN])
            .unwrap();
        let relay = w.relay(vec![route("hooks", addr, true)]);
        // Owed, it is also the oldest delivery the gauges report.
        relay.publish_gauges().await.unwrap();
        relay.run_once().await.unwrap();
        let d = w.delivery("evt_old").await;
        assert_eq!((d.state, d.attempts), (DeliveryState::Dead, 1));
        assert_eq!(rx.requests().len(), 1);
    });
}

impl World {
    pub fn clock_now(&self) -> oncebox_core::Timestamp {
        use oncebox_core::Clock;
        self.clock.now()
    }
}

#[test]
fn requests_to_a_route_never_exceed_its_concurrency() {
    run(async {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};

        use axum::extract::State;
        use tokio::sync::{Semaphore, mpsc};

        /// Holds every request until the test lets one go, counting how many are held at once.
        struct Gate {
            held: AtomicUsize,
            most: AtomicUsize,
            arrived: mpsc::UnboundedSender<()>,
            release: Semaphore,
        }
        async fn held(State(g): State<Arc<Gate>>) -> &'static str {
            let now = g.held.fetch_add(1, Ordering::SeqCst) + 1;
            g.most.fetch_max(now, Ordering::SeqCst);
            let _ = g.arrived.send(());
            g.release.acquire().await.unwrap().forget();
            g.held.fetch_sub(1, Ordering::SeqCst);
            "ok"
        }
        let (arrived, mut arrivals) = mpsc::unbounded_channel();
        let gate = Arc::new(Gate {
            held: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
            arrived,
            release: Semaphore::new(0),
        });
        let app = axum::Router::new()
            .route("/hook", axum::routing::post(held))
            .with_state(gate.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

        let w = World::new();
        for i in 0..6 {
            w.accept(&format!("c{i}"), &["hooks"]).await;
        }
        let mut narrow = route("hooks", addr, true);
        narrow.concurrency = 2;
        let relay = Arc::new(w.relay(vec![narrow]));
        let round = tokio::spawn({
            let relay = relay.clone();
            async move { relay.run_once().await }
        });
        // Two arrive and are held (the limit is reached before anything is released); then
        // each release lets one more in. Had the limit not held, all six would be held at once.
        arrivals.recv().await.unwrap();
        arrivals.recv().await.unwrap();
        for _ in 0..4 {
            gate.release.add_permits(1);
            arrivals.recv().await.unwrap();
        }
        gate.release.add_permits(2);
        let out = round.await.unwrap().unwrap();
        assert_eq!(out.delivered, 6);
        assert_eq!(
            gate.most.load(Ordering::SeqCst),
            2,
            "at most two requests in flight"
        );
    });
}
