//! A route's circuit: a receiver that keeps failing is left alone for a cooldown while other
//! routes go on, one trial request (not a round) tries it after the cooldown, claims waiting
//! behind the failures are given back unsent, the cooldown runs on time that passes, not on
//! the wall clock, and a request sent before the circuit opened does not close it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use oncebox_testkit::run;
use tokio::sync::{Semaphore, mpsc};

use crate::{World, receiver, route};

#[test]
fn a_failing_route_opens_its_circuit_and_other_routes_go_on() {
    run(async {
        let w = World::new();
        let (bad, bad_addr) = receiver::start().await;
        let (good, good_addr) = receiver::start().await;
        bad.answer(&[(500, None)]);
        let options = oncebox_relay::RelayOptions {
            circuit_threshold: 2,
            circuit_cooldown: Duration::from_secs(2 * 3600),
            ..oncebox_relay::RelayOptions::default()
        };
        let relay = oncebox_relay::Relay::new(
            w.inbox.clone(),
            vec![route("bad", bad_addr, true), route("good", good_addr, true)],
            std::sync::Arc::new(w.clock.clone()),
            options,
        );
        for i in 0..2 {
            w.accept(&format!("f{i}"), &["bad"]).await;
        }
        relay.run_once().await.unwrap();
        assert_eq!(bad.requests().len(), 2);
        w.clock.advance(Duration::from_secs(3600));
        w.accept("g1", &["good"]).await;
        let out = relay.run_once().await.unwrap();
        assert_eq!(out.delivered, 1, "the good route is served: {out:?}");
        assert_eq!(
            bad.requests().len(),
            2,
            "the open circuit kept the relay off the bad route"
        );
        assert_eq!(good.requests().len(), 1);
        // After the cooldown one trial request goes to the bad route: it fails, and the
        // other due delivery is not sent into the failure.
        w.clock.advance(Duration::from_secs(2 * 3600));
        relay.run_once().await.unwrap();
        assert_eq!(bad.requests().len(), 3, "one trial, not the whole round");
        relay.run_once().await.unwrap();
        assert_eq!(bad.requests().len(), 3, "shut again for a cooldown");
        // The receiver recovers: the next trial closes the circuit and the rest go.
        bad.answer(&[(202, None)]);
        w.clock.advance(Duration::from_secs(2 * 3600 + 1));
        relay.run_once().await.unwrap();
        relay.run_once().await.unwrap();
        assert_eq!(
            bad.requests().len(),
            5,
            "the trial, then the other delivery"
        );
    });
}

/// Claims waiting for a route's turn when its circuit opens are given back unsent: with one
/// request at a time, the first failure opens the circuit and the two claimed behind it are
/// not sent into the failing receiver; they are taken after the cooldown.
#[test]
fn claims_waiting_when_their_routes_circuit_opens_are_given_back_unsent() {
    run(async {
        let w = World::new();
        let (bad, bad_addr) = receiver::start().await;
        bad.answer(&[(500, None), (202, None), (202, None)]);
        let options = oncebox_relay::RelayOptions {
            circuit_threshold: 1,
            circuit_cooldown: Duration::from_secs(30),
            ..oncebox_relay::RelayOptions::default()
        };
        let mut one_at_a_time = route("bad", bad_addr, true);
        one_at_a_time.concurrency = 1;
        let relay = oncebox_relay::Relay::new(
            w.inbox.clone(),
            vec![one_at_a_time],
            std::sync::Arc::new(w.clock.clone()),
            options,
        );
        for i in 0..3 {
            w.accept(&format!("f{i}"), &["bad"]).await;
        }
        let out = relay.run_once().await.unwrap();
        assert_eq!(
            (out.claimed, out.retrying, out.unclaimed),
            (3, 1, 2),
            "{out:?}"
        );
        assert_eq!(
            bad.requests().len(),
            1,
            "one request reached the failing receiver"
        );
        let mut attempts = 0;
        for id in ["f0", "f1", "f2"] {
            attempts += w.delivery(id).await.attempts;
        }
        assert_eq!(attempts, 1, "the two given back count no attempt");
        assert_eq!(relay.run_once().await.unwrap().claimed, 0, "cooling down");
        w.clock.advance(Duration::from_secs(31));
        // The trial first; answered, it closes the circuit, and the two waiting for the
        // route's one request at a time go after it.
        let out = relay.run_once().await.unwrap();
        assert_eq!(out.delivered, 3, "{out:?}");
        assert_eq!(bad.requests().len(), 4);
    });
}

/// The cooldown runs on time that passes, not on the wall clock: stepped back a day while the
/// circuit is open, the route opens again when the cooldown has passed, not a day later.
#[test]
fn a_wall_clock_stepped_back_does_not_stretch_a_circuits_cooldown() {
    run(async {
        let w = World::new();
        let (bad, bad_addr) = receiver::start().await;
        // The failures ask for an hour: a backoff drawn with full jitter can be 0, and the
        // step's re-anchoring would then make the failed deliveries due with the new one.
        bad.answer(&[(500, Some(3600)), (500, Some(3600)), (202, None)]);
        let options = oncebox_relay::RelayOptions {
            circuit_threshold: 2,
            circuit_cooldown: Duration::from_secs(30),
            ..oncebox_relay::RelayOptions::default()
        };
        let relay = oncebox_relay::Relay::new(
            w.inbox.clone(),
            vec![route("bad", bad_addr, true)],
            std::sync::Arc::new(w.clock.clone()),
            options,
        );
        for i in 0..2 {
            w.accept(&format!("f{i}"), &["bad"]).await;
        }
        relay.run_once().await.unwrap();
        assert_eq!(bad.requests().len(), 2, "the circuit opened");
        w.clock
            .set(w.clock_now().minus(Duration::from_secs(24 * 3600)));
        // Due at once on the stepped clock: only the circuit can hold it back.
        w.accept("after-the-step", &["bad"]).await;
        w.clock.advance(Duration::from_secs(10));
        assert_eq!(
            relay.run_once().await.unwrap().claimed,
            0,
            "still cooling down"
        );
        w.clock.advance(Duration::from_secs(21));
        let out = relay.run_once().await.unwrap();
        assert_eq!((out.claimed, out.delivered), (1, 1), "{out:?}");
        assert_eq!(bad.requests().len(), 3);
    });
}

/// The first request to arrive waits until let go and is then answered 200; every other is
/// answered 500 at once.
/// A receiver's state that holds the first request it gets until a permit is added to
/// `gate`, so that its answer comes after the others'; the rest pass at once.
pub(crate) struct HeldFirst {
    pub arrived: AtomicUsize,
    first_in: mpsc::UnboundedSender<()>,
    pub gate: Semaphore,
}

impl HeldFirst {
    /// The state, and what says the first request arrived.
    pub fn new() -> (Arc<HeldFirst>, mpsc::UnboundedReceiver<()>) {
        let (first_in, first) = mpsc::unbounded_channel();
        let state = HeldFirst {
            arrived: AtomicUsize::new(0),
            first_in,
            gate: Semaphore::new(0),
        };
        (Arc::new(state), first)
    }

    /// This request's place in arrival order, from 0; the first's once it is let go.
    pub async fn arrive(&self) -> usize {
        let n = self.arrived.fetch_add(1, Ordering::SeqCst);
        if n == 0 {
            let _ = self.first_in.send(());
            if let Ok(permit) = self.gate.acquire().await {
                permit.forget();
            }
        }
        n
    }
}

/// Attempts recorded for the deliveries of `ids`.
pub(crate) async fn attempts(w: &World, ids: &[&str]) -> u64 {
    let mut made = 0;
    for id in ids {
        made += u64::from(w.delivery(id).await.attempts);
    }
    made
}

/// Waits (20 s at most) until the deliveries of `ids` have `n` attempts recorded; `why` says
/// what that shows if they never do.
pub(crate) async fn until_attempts(w: &World, ids: &[&str], n: u64, why: &str) {
    for _ in 0..2_000 {
        if attempts(w, ids).await == n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(attempts(w, ids).await, n, "{why}");
}

async fn late_success(State(s): State<Arc<HeldFirst>>) -> StatusCode {
    match s.arrive().await {
        0 => StatusCode::OK,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// A request in flight when the circuit opened, answered 200 after it did, says nothing of the
/// receiver since: the circuit stays open for its cooldown. Counted, it closed the circuit at
/// once, and the next round went whole to a receiver still failing.
#[test]
fn a_late_success_sent_before_the_circuit_opened_does_not_close_it() {
    run(async {
        let w = World::new();
        let (state, mut first) = HeldFirst::new();
        let app = Router::new()
            .route("/hook", post(late_success))
            .with_state(state.clone());
        let addr = crate::receiver::serve(app).await;
        let options = oncebox_relay::RelayOptions {
            circuit_threshold: 2,
            circuit_cooldown: Duration::from_secs(30),
            ..oncebox_relay::RelayOptions::default()
        };
        let mut three_at_once = route("bad", addr, true);
        three_at_once.concurrency = 3;
        let relay = Arc::new(oncebox_relay::Relay::new(
            w.inbox.clone(),
            vec![three_at_once],
            Arc::new(w.clock.clone()),
            options,
        ));
        let first_round = ["r0", "r1", "r2"];
        for id in first_round {
            w.accept(id, &["bad"]).await;
        }
        let round = tokio::spawn({
            let relay = relay.clone();
            async move { relay.run_once().await.unwrap() }
        });
        first.recv().await.expect("the held request arrives");
        // The two failures are recorded (the circuit told first): it is open.
        let why = "both failures recorded before the success";
        until_attempts(&w, &first_round, 2, why).await;
        state.gate.add_permits(1);
        let out = round.await.unwrap();
        assert_eq!((out.delivered, out.retrying), (1, 2), "{out:?}");
        // Inside the cooldown: nothing more goes to the receiver, the new events included.
        for id in ["n0", "n1", "n2"] {
            w.accept(id, &["bad"]).await;
        }
        w.clock.advance(Duration::from_secs(10));
        let out = relay.run_once().await.unwrap();
        assert_eq!(out.claimed, 0, "still cooling down: {out:?}");
        assert_eq!(state.arrived.load(Ordering::SeqCst), 3);
        // After it, one trial.
        w.clock.advance(Duration::from_secs(21));
        relay.run_once().await.unwrap();
        assert_eq!(
            state.arrived.load(Ordering::SeqCst),
            4,
            "one trial, not a round"
        );
    });
}
