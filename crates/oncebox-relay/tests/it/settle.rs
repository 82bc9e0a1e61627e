//! The relay's own settlements: a claim whose lease ran short is given back unsent, a status
//! URL is asked with backoff and never overrides an operator, an outcome the store could not
//! take at once is recorded before the lease ends, and a receiver that cannot be reached is
//! not mistaken for one that was sent the request.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::{get, post};
use oncebox_core::delivery::DeliveryState;
use oncebox_core::relay_store::{DeliveryStore, Resolve, STATUS_RECHECK};
use oncebox_core::{Clock, Timestamp};
use oncebox_testkit::run;
use tokio::sync::Notify;

use oncebox_relay::Relay;
use oncebox_sqlite::Inbox;

use crate::receiver::serve;
use crate::{START, World, receiver, route};

#[test]
fn a_claim_whose_lease_runs_short_behind_a_slow_route_is_given_back_not_sent_late() {
    lease_runs_short_behind_a_slow_route(Duration::ZERO);
}

/// The same with the wall clock set back an hour during each request: by it the lease would
/// never run short, but it did in the time that passed, and a claim since would take it over.
#[test]
fn a_wall_clock_set_back_does_not_hide_the_end_of_a_claims_lease() {
    lease_runs_short_behind_a_slow_route(Duration::from_secs(3600));
}

fn lease_runs_short_behind_a_slow_route(set_back: Duration) {
    run(async {
        let w = World::new();
        // Each request takes 25 s of the relay's clock; one at a time; leases of 60 s.
        let arrivals = Arc::new(Mutex::new(Vec::<(String, Timestamp)>::new()));
        let (seen, clock) = (arrivals.clone(), w.clock.clone());
        let app = Router::new().route(
            "/hook",
            post(move |headers: axum::http::HeaderMap| async move {
                let key = headers["idempotency-key"].to_str().unwrap().to_owned();
                seen.lock().unwrap().push((key, clock.now()));
                clock.advance(Duration::from_secs(25));
                clock.set(clock.now().minus(set_back));
                StatusCode::OK
            }),
        );
        let relay = one_at_a_time(&w, app).await;
        let out = relay.run_once().await.unwrap();
        // c's turn came at +50 s: its 5 s timeout and the time to record no longer fit.
        assert_eq!(
            (out.claimed, out.delivered, out.unclaimed, out.fenced),
            (3, 2, 1, 0),
            "{out:?}"
        );
        let c = w.delivery("evt_c").await;
        assert_eq!((c.state, c.attempts), (DeliveryState::Pending, 0));
        // Held back a second, not taken again at once.
        assert_eq!(relay.run_once().await.unwrap().claimed, 0);
        w.clock.advance(Duration::from_secs(1));
        let out = relay.run_once().await.unwrap();
        assert_eq!((out.claimed, out.delivered), (1, 1), "{out:?}");
        let seen = arrivals.lock().unwrap().clone();
        let keys: Vec<&str> = seen.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            ["shop:evt_a", "shop:evt_b", "shop:evt_c"],
            "each once"
        );
        // Every request left inside the lease it was sent under.
        assert!(seen[1].1 < START.plus(Duration::from_secs(60)));
        w.clock.advance(Duration::from_secs(3600) + set_back * 4);
        assert_eq!(relay.run_once().await.unwrap().claimed, 0);
    });
}

/// The same slow route, with another process holding the database's write lock from b's
/// request on: c's lease runs short while the store cannot take anything, and c is given back
/// once the lock goes, not left in flight to be taken over as possibly sent.
#[test]
fn a_claim_given_back_while_the_store_is_locked_is_given_back_once_it_is_not() {
    run(async {
        let w = World::with(|o| o.busy_timeout(Duration::from_millis(100)));
        let lock = Arc::new(Mutex::new(None));
        let (held, path, clock) = (lock.clone(), w.path(), w.clock.clone());
        let app = Router::new().route(
            "/hook",
            post(move |headers: axum::http::HeaderMap| async move {
                clock.advance(Duration::from_secs(25));
                if headers["idempotency-key"] == "shop:evt_b" {
                    let conn = oncebox_sqlite::rusqlite::Connection::open(&path).unwrap();
                    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
                    *held.lock().unwrap() = Some(conn);
                }
                StatusCode::OK
            }),
        );
        let relay = one_at_a_time(&w, app).await;
        let other_process = async {
            // b's record and c's giving back both fail a few times, then the lock goes.
            while w.inbox.stats().failed_batches() < 6 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            drop(lock.lock().unwrap().take().expect("the lock was taken"));
        };
        let (out, ()) = tokio::join!(relay.run_once(), other_process);
        let out = out.expect("the round ends");
        assert_eq!(
            (out.claimed, out.delivered, out.unclaimed),
            (3, 2, 1),
            "{out:?}"
        );
        let c = w.delivery("evt_c").await;
        assert_eq!((c.state, c.attempts), (DeliveryState::Pending, 0));
    });
}

/// `evt_a`, `evt_b` and `evt_c` accepted for a route to `app` that takes one request at a time
/// and does not honour the key; the relay for it.
async fn one_at_a_time(w: &World, app: Router) -> Relay<Inbox> {
    let addr = serve(app).await;
    for id in ["evt_a", "evt_b", "evt_c"] {
        w.accept(id, &["hooks"]).await;
    }
    let mut slow = route("hooks", addr, false);
    slow.concurrency = 1;
    w.relay(vec![slow])
}

/// A relay whose first round leaves `evt` uncertain on a plain route (its reply dropped) and
/// then asks the status URL at `status`; with the receiver, to count what reached it.
async fn plain_route_asking(
    w: &World,
    evt: &str,
    status: SocketAddr,
) -> (Relay<Inbox>, Arc<receiver::Receiver>, Arc<Mutex<u32>>) {
    let (rx, addr) = receiver::start().await;
    let (proxy, dropped) = receiver::dropping_proxy(addr).await;
    w.accept(evt, &["hooks"]).await;
    let mut plain = route("hooks", proxy, false);
    plain.status_url = Some(format!("http://{status}/status/{{key}}"));
    (w.relay(vec![plain]), rx, dropped)
}

#[test]
fn an_operators_settlement_made_while_the_status_url_is_asked_stands() {
    run(async {
        let w = World::new();
        let (asked, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let (a, r) = (asked.clone(), release.clone());
        // The status URL takes its time, then says the key was never applied.
        let app = Router::new().route(
            "/status/{key}",
            get(move || async move {
                a.notify_one();
                r.notified().await;
                let never = serde_json::json!({ "applied": false });
                (StatusCode::NOT_FOUND, axum::Json(never))
            }),
        );
        let (relay, rx, dropped) = plain_route_asking(&w, "evt_s", serve(app).await).await;
        assert_eq!(relay.run_once().await.unwrap().uncertain, 1);
        assert_eq!(*dropped.lock().unwrap(), 1);
        w.clock.advance(STATUS_RECHECK.0);
        let operator = async {
            asked.notified().await;
            let d = w.delivery("evt_s").await;
            assert_eq!(d.state, DeliveryState::Uncertain);
            let now = w.clock.now();
            let settled = DeliveryStore::resolve(&w.inbox, d.id, Resolve::Dead, "cancelled", now);
            assert!(settled.await.unwrap(), "the operator settles it");
            release.notify_one();
        };
        let (out, ()) = tokio::join!(relay.run_once(), operator);
        assert_eq!(out.unwrap().reconciled, 0);
        let d = w.delivery("evt_s").await;
        assert_eq!(
            (d.state, d.note.as_deref()),
            (DeliveryState::Dead, Some("cancelled"))
        );
        w.clock.advance(Duration::from_secs(3600));
        assert_eq!(
            relay.run_once().await.unwrap().claimed,
            0,
            "never sent again"
        );
        assert_eq!(rx.hits_of("shop:evt_s"), 1);
    });
}

/// An error, or a bare 404 (a wrong path answers one for every key, the applied ones too), says
/// nothing: the delivery stays uncertain and is not sent again. Nor does a body naming
/// `applied` twice, which a lenient parser would read as its last value.
#[test]
fn a_status_url_that_does_not_answer_is_asked_again_after_a_growing_wait_not_every_round() {
    for answer in [
        (StatusCode::INTERNAL_SERVER_ERROR, ""),
        (StatusCode::NOT_FOUND, ""),
        (StatusCode::OK, r#"{"applied": false, "applied": true}"#),
        (StatusCode::OK, r#"{"applied": "true"}"#),
    ] {
        status_url_not_answering(answer);
    }
}

fn status_url_not_answering(answer: (StatusCode, &'static str)) {
    run(async move {
        let w = World::new();
        let asked = Arc::new(AtomicU32::new(0));
        let count = asked.clone();
        let app = Router::new().route(
            "/status/{key}",
            get(move || async move {
                count.fetch_add(1, Ordering::SeqCst);
                answer
            }),
        );
        let (relay, rx, _) = plain_route_asking(&w, "evt_q", serve(app).await).await;
        let times = || asked.load(Ordering::SeqCst);
        let out = relay.run_once().await.unwrap();
        assert_eq!((out.uncertain, times()), (1, 0), "{out:?}");
        // First asked 10 s after it became uncertain, then 20 s later, then 40 s, then 80 s.
        let steps = [
            (9, 0),
            (1, 1),
            (0, 1),
            (19, 1),
            (1, 2),
            (39, 2),
            (1, 3),
            (79, 3),
            (1, 4),
        ];
        for (wait, expect) in steps {
            w.clock.advance(Duration::from_secs(wait));
            relay.run_once().await.unwrap();
            assert_eq!(times(), expect, "after {wait} s more");
        }
        assert_eq!(w.delivery("evt_q").await.state, DeliveryState::Uncertain);
        assert_eq!(rx.hits_of("shop:evt_q"), 1, "{answer:?}: never sent again");
    });
}

#[test]
fn an_outcome_the_store_cannot_take_at_once_is_recorded_while_the_lease_lasts() {
    run(async {
        let w = World::with(|o| o.busy_timeout(Duration::from_millis(200)));
        // The receiver applies the request, and meanwhile another process takes the
        // database's write lock: the relay cannot record the 2xx it got.
        let lock = Arc::new(Mutex::new(None));
        let (held, path) = (lock.clone(), w.path());
        let app = Router::new().route(
            "/hook",
            post(move || async move {
                let conn = oncebox_sqlite::rusqlite::Connection::open(&path).unwrap();
                conn.execute_batch("BEGIN IMMEDIATE").unwrap();
                *held.lock().unwrap() = Some(conn);
                StatusCode::OK
            }),
        );
        let addr = serve(app).await;
        w.accept("evt_l", &["hooks"]).await;
        let relay = w.relay(vec![route("hooks", addr, false)]);
        let other_process = async {
            // Held through a dozen failed records, several seconds: an outage longer than a
            // few tries must not end the relay's, while its lease lasts.
            while w.inbox.stats().failed_batches() < 12 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            // The lock goes away.
            drop(lock.lock().unwrap().take().expect("the lock was taken"));
        };
        let (out, ()) = tokio::join!(relay.run_once(), other_process);
        let out = out.expect("the round records its outcome");
        assert_eq!((out.delivered, out.fenced), (1, 0), "{out:?}");
        let d = w.delivery("evt_l").await;
        assert_eq!((d.state, d.attempts), (DeliveryState::Delivered, 1));
        w.clock.advance(Duration::from_secs(3600));
        assert_eq!(
            relay.run_once().await.unwrap().claimed,
            0,
            "never sent again"
        );
    });
}

#[test]
fn a_receiver_whose_connect_never_completes_is_retried_not_left_uncertain() {
    run(async {
        let w = World::new();
        // A listener whose accept queue is full: the kernel drops further SYNs, so a connect
        // hangs with nothing sent.
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = socket.listen(0).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut filling = Vec::new();
        loop {
            let connect = tokio::net::TcpStream::connect(addr);
            match tokio::time::timeout(Duration::from_millis(300), connect).await {
                Ok(stream) => filling.push(stream.unwrap()),
                // The queue is full: this connect hung, as the relay's will.
                Err(_) => break,
            }
            assert!(filling.len() < 64, "the accept queue never filled");
        }
        w.accept("evt_f", &["hooks"]).await;
        let mut unreachable = route("hooks", addr, false);
        unreachable.timeout = Duration::from_secs(2);
        let relay = w.relay(vec![unreachable]);
        let out = relay.run_once().await.unwrap();
        assert_eq!((out.retrying, out.uncertain), (1, 0), "{out:?}");
        let d = w.delivery("evt_f").await;
        assert_eq!((d.state, d.attempts), (DeliveryState::Retrying, 1));
        let error = d.last_error.unwrap_or_default();
        assert!(error.contains("onnect"), "{error}");
        drop((filling, listener));
    });
}

/// A receiver that never answers a route that does not honour keys, and whose status URL says
/// "not applied" every time: each round is an attempt (sent, uncertain, not applied, sent
/// again), so the route's attempt cap ends it as dead, as it ends retries.
#[test]
fn not_applied_past_the_attempt_cap_is_dead_not_sent_again() {
    run(async {
        let w = World::new();
        let (addr, read) = receiver::silent().await;
        let (_rx, status) = receiver::start().await;
        let mut plain = route("plain", addr, false);
        plain.timeout = Duration::from_millis(200);
        plain.retry.max_attempts = 2;
        // The receiver there has no record of the key: `{"applied": false}`.
        plain.status_url = Some(format!("http://{status}/status/{{key}}"));
        let relay = w.relay(vec![plain]);
        w.accept("evt-1", &["plain"]).await;
        let mut states = Vec::new();
        for _ in 0..4 {
            relay.run_once().await.unwrap();
            states.push(w.delivery("evt-1").await.state);
            w.clock.advance(STATUS_RECHECK.0);
        }
        let d = w.delivery("evt-1").await;
        eprintln!(
            "not applied past the cap: {states:?}, {} requests read",
            read.load(Ordering::SeqCst)
        );
        assert_eq!(
            read.load(Ordering::SeqCst),
            2,
            "two attempts reached the receiver"
        );
        assert_eq!(
            (d.state, d.attempts),
            (DeliveryState::Dead, 2),
            "{states:?}"
        );
        assert!(
            d.note.as_deref().is_some_and(|n| n.contains("not applied")),
            "{d:?}"
        );
    });
}
