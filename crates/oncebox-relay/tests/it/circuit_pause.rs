//! A route that asked for quiet: a 429 or 503 with `Retry-After` pauses the whole route, not
//! only its delivery; a trial follows; a failed trial shuts the route again; and such an
//! answer to a request sent before the circuit last opened still lengthens the pause.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderName, StatusCode};
use axum::routing::post;
use oncebox_core::Clock;
use oncebox_testkit::run;

use crate::circuit::{HeldFirst, until_attempts};
use crate::{World, receiver, route};

/// A 503 asking for ten minutes pauses the whole route, not only its delivery: deliveries
/// due meanwhile are not sent, although the failures are far from the circuit's threshold;
/// after the ten minutes one trial goes first, and its success lets the rest go. A 500's
/// `Retry-After` delays its own delivery only.
#[test]
fn a_503_asking_for_quiet_pauses_the_whole_route() {
    run(async {
        let w = World::new();
        let (rx, addr) = receiver::start().await;
        rx.answer(&[
            (500, Some(3600)),
            (503, Some(600)),
            (503, Some(600)),
            (202, None),
        ]);
        // The tests' routes cap their backoff at 60 s, which would cap the pause too. One
        // request at a time: a claim waits for the trial's answer rather than finding the
        // trial out and being given back at once (which one happens raced at 16).
        let mut r = route("r", addr, true);
        r.retry.backoff.cap = Duration::from_secs(3600);
        r.concurrency = 1;
        let relay = oncebox_relay::Relay::new(
            w.inbox.clone(),
            vec![r],
            std::sync::Arc::new(w.clock.clone()),
            oncebox_relay::RelayOptions::default(),
        );
        w.accept("first", &["r"]).await;
        relay.run_once().await.unwrap();
        w.accept("second", &["r"]).await;
        let out = relay.run_once().await.unwrap();
        assert_eq!(
            (out.claimed, rx.requests().len()),
            (1, 2),
            "a 500's Retry-After held only its own delivery back: {out:?}"
        );
        w.accept("third", &["r"]).await;
        // Past the cooldown, and a second before the ten minutes: still paused.
        still_paused(&w, &relay).await;
        w.clock.advance(Duration::from_secs(2));
        // One trial (third, or second again), asked for quiet again: the other is given back.
        let out = relay.run_once().await.unwrap();
        assert_eq!(
            (out.claimed, out.retrying, out.unclaimed),
            (2, 1, 1),
            "{out:?}"
        );
        assert_eq!(rx.requests().len(), 3);
        w.clock.advance(Duration::from_secs(601));
        // The next trial succeeds and lets the other go after it.
        let out = relay.run_once().await.unwrap();
        assert_eq!(out.delivered, 2, "{out:?}");
        assert_eq!(rx.requests().len(), 5);
    });
}

/// The trial after a pause that fails without asking for quiet (a 500) shuts the route for the
/// cooldown, although the failures are far from the threshold: left open, every later turn
/// was a trial at once, one request after another into a receiver still failing.
#[test]
fn a_failed_trial_after_a_pause_shuts_the_route_for_the_cooldown() {
    run(async {
        let w = World::new();
        let (rx, addr) = receiver::start().await;
        rx.answer(&[(429, Some(20)), (500, None), (202, None)]);
        let relay = oncebox_relay::Relay::new(
            w.inbox.clone(),
            vec![route("r", addr, true)],
            std::sync::Arc::new(w.clock.clone()),
            oncebox_relay::RelayOptions::default(),
        );
        w.accept("first", &["r"]).await;
        relay.run_once().await.unwrap();
        w.accept("second", &["r"]).await;
        w.clock.advance(Duration::from_secs(21));
        // The trial fails (500); the other claim is given back.
        let out = relay.run_once().await.unwrap();
        assert_eq!((out.retrying, out.unclaimed), (1, 1), "{out:?}");
        w.clock.advance(Duration::from_secs(29));
        let out = relay.run_once().await.unwrap();
        assert_eq!(out.claimed, 0, "within the cooldown: {out:?}");
        assert_eq!(rx.requests().len(), 2);
        w.clock.advance(Duration::from_secs(2));
        let out = relay.run_once().await.unwrap();
        assert!(out.delivered >= 1, "{out:?}");
    });
}

/// The first request to arrive waits until let go and is then answered 429, asking for ten
/// minutes; the second is answered 500 at once; every later one 200.
async fn late_quiet(
    State(s): State<Arc<HeldFirst>>,
) -> (StatusCode, [(HeaderName, &'static str); 1]) {
    let retry_after = axum::http::header::RETRY_AFTER;
    match s.arrive().await {
        0 => (StatusCode::TOO_MANY_REQUESTS, [(retry_after, "600")]),
        1 => (StatusCode::INTERNAL_SERVER_ERROR, [(retry_after, "0")]),
        _ => (StatusCode::OK, [(retry_after, "0")]),
    }
}

/// A request sent before the circuit opened (on another's 500) and then answered 429 asking
/// for ten minutes says nothing of the receiver's health since, but its request for quiet
/// holds: the route is still shut when the 30 s cooldown ends, and tried again only after
/// the ten minutes.
#[test]
fn a_request_for_quiet_answered_after_the_circuit_opened_still_pauses_the_route() {
    run(async {
        let w = World::new();
        let (state, mut first) = HeldFirst::new();
        let app = Router::new()
            .route("/hook", post(late_quiet))
            .with_state(state.clone());
        let addr = crate::receiver::serve(app).await;
        let options = oncebox_relay::RelayOptions {
            circuit_threshold: 1,
            circuit_cooldown: Duration::from_secs(30),
            ..oncebox_relay::RelayOptions::default()
        };
        let mut two_at_once = route("r", addr, true);
        two_at_once.concurrency = 2;
        two_at_once.retry.backoff.cap = Duration::from_secs(3600);
        let relay = Arc::new(oncebox_relay::Relay::new(
            w.inbox.clone(),
            vec![two_at_once],
            Arc::new(w.clock.clone()),
            options,
        ));
        let ids = ["q0", "q1"];
        for id in ids {
            w.accept(id, &["r"]).await;
        }
        let round = tokio::spawn({
            let relay = relay.clone();
            async move { relay.run_once().await.unwrap() }
        });
        first.recv().await.expect("the held request arrives");
        // The 500 is recorded (the circuit told first): it is open, in a new epoch.
        until_attempts(&w, &ids, 1, "the 500 recorded before the 429").await;
        state.gate.add_permits(1);
        let out = round.await.unwrap();
        assert_eq!(out.retrying, 2, "{out:?}");
        // Both deliveries are due well before the ten minutes (the 500's backoff, the 429's
        // own wait is its 600 s); only the pause holds them.
        still_paused(&w, &relay).await;
        w.clock.advance(Duration::from_secs(2));
        let out = relay.run_once().await.unwrap();
        assert!(out.delivered >= 1, "{out:?}");
        assert!(state.arrived.load(Ordering::SeqCst) >= 3);
    });
}

/// Past the 30 s cooldown, and a second before the ten minutes (on the clock's monotonic
/// time, from the world's start): the route claims nothing.
async fn still_paused<S: oncebox_core::relay_store::DeliveryStore>(
    w: &World,
    relay: &oncebox_relay::Relay<S>,
) {
    for to in [31, 599] {
        w.clock
            .advance(Duration::from_secs(to) - w.clock.monotonic());
        let out = relay.run_once().await.unwrap();
        assert_eq!(out.claimed, 0, "still paused at {to} s: {out:?}");
    }
}
