//! The relay's running loop (`Relay::run`), against a receiver that holds each request until
//! the test lets it go: a slow route holds back no other route, and a shutdown gives back the
//! claims still waiting for their route, and those its claim brought back as it began, instead
//! of leaving them in flight or sending them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use oncebox_core::delivery::DeliveryState;
use oncebox_relay::{Relay, RelayOptions};
use oncebox_sqlite::Inbox;
use oncebox_testkit::run;
use oncebox_testkit::writer::{hold_writer, queued};
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::receiver::serve;
use crate::{World, receiver, route};

/// A receiver that reports each request's arrival and answers 200 only once let go.
struct Held {
    arrived: mpsc::UnboundedSender<()>,
    gate: Semaphore,
}

async fn held(State(h): State<Arc<Held>>) -> StatusCode {
    let _ = h.arrived.send(());
    if let Ok(permit) = h.gate.acquire().await {
        permit.forget();
    }
    StatusCode::OK
}

async fn start_held() -> (Arc<Held>, mpsc::UnboundedReceiver<()>, SocketAddr) {
    let (arrived, arrivals) = mpsc::unbounded_channel();
    let h = Arc::new(Held {
        arrived,
        gate: Semaphore::new(0),
    });
    let app = Router::new()
        .route("/hook", post(held))
        .with_state(h.clone());
    (h, arrivals, serve(app).await)
}

/// Runs `relay` until the returned sender fires.
fn running(relay: Arc<Relay<Inbox>>) -> (oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        relay
            .run(async {
                let _ = stopped.await;
            })
            .await;
    });
    (stop, task)
}

/// Waits, looking every 10 ms for at most 20 s, until `id`'s delivery is in `state`.
async fn wait_state(w: &World, id: &str, state: DeliveryState) {
    for _ in 0..2_000 {
        if w.delivery(id).await.state == state {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{id} never {state:?}: {:?}", w.delivery(id).await);
}

#[test]
fn a_slow_receiver_holds_back_no_other_route() {
    run(async {
        let w = World::new();
        let (slow, mut arrivals, slow_addr) = start_held().await;
        let (fast, fast_addr) = receiver::start().await;
        let mut held_route = route("slow", slow_addr, true);
        held_route.timeout = Duration::from_secs(60);
        let relay = Arc::new(w.relay(vec![held_route, route("fast", fast_addr, true)]));
        w.accept("s1", &["slow"]).await;
        let (stop, task) = running(relay);
        arrivals.recv().await.expect("the slow request arrives");
        w.accept("f1", &["fast"]).await;
        wait_state(&w, "f1", DeliveryState::Delivered).await;
        // Delivered while the slow request was still held: the routes went on side by side.
        assert_eq!(w.delivery("s1").await.state, DeliveryState::InFlight);
        assert_eq!(fast.requests().len(), 1);
        slow.gate.add_permits(1);
        wait_state(&w, "s1", DeliveryState::Delivered).await;
        let _ = stop.send(());
        task.await.unwrap();
    });
}

/// A slow route whose backlog came first took a whole claim, and holds more claims than it can
/// send; those waiting for its permit must not take the other routes' room. Counted in the
/// batch, they left no room for any other route until the slow backlog was sent. Nor may a
/// second slow route's backlog then take more than its own room: claims held would grow past
/// any bound, a batch at a time.
#[test]
fn a_slow_route_with_a_backlog_holds_back_no_other_route() {
    run(async {
        let w = World::new();
        let (slow, mut arrivals, slow_addr) = start_held().await;
        let (fast, fast_addr) = receiver::start().await;
        let one_at_a_time = |name: &str| {
            let mut r = route(name, slow_addr, true);
            (r.concurrency, r.timeout) = (1, Duration::from_secs(60));
            r
        };
        let (first, second) = (["a1", "a2", "a3", "a4"], ["b1", "b2", "b3", "b4"]);
        for id in first {
            w.accept(id, &["slow-a"]).await;
        }
        for id in second {
            w.accept(id, &["slow-b"]).await;
        }
        let options = RelayOptions {
            lease: Duration::from_secs(120),
            batch: first.len(),
            ..RelayOptions::default()
        };
        let routes = vec![
            one_at_a_time("slow-a"),
            one_at_a_time("slow-b"),
            route("fast", fast_addr, true),
        ];
        let clock = Arc::new(w.clock.clone());
        let relay = Arc::new(Relay::new(w.inbox.clone(), routes, clock, options));
        let (stop, task) = running(relay);
        arrivals
            .recv()
            .await
            .expect("the first slow request arrives");
        // The first claim took the whole batch, all of it the oldest route's: one sending,
        // three waiting for its permit.
        for id in first {
            assert_eq!(w.delivery(id).await.state, DeliveryState::InFlight, "{id}");
        }
        w.accept("f1", &["fast"]).await;
        wait_state(&w, "f1", DeliveryState::Delivered).await;
        assert_eq!(fast.requests().len(), 1);
        // The second slow route was claimed for by its own room alone (before `f1` was, or
        // with it): one in flight, the rest still due.
        let mut in_flight = 0;
        for id in second {
            in_flight += usize::from(w.delivery(id).await.state == DeliveryState::InFlight);
        }
        assert_eq!(in_flight, 1, "the second slow route's claims");
        slow.gate.add_permits(first.len() + second.len());
        for id in first.iter().chain(&second) {
            wait_state(&w, id, DeliveryState::Delivered).await;
        }
        let _ = stop.send(());
        task.await.unwrap();
    });
}

/// Slow routes at their concurrency, sending together as many as the batch: counted against
/// it, their sends left no room for any other route, which waited for one of their slow
/// answers to be claimed for at all.
#[test]
fn slow_routes_at_their_concurrency_hold_back_no_other_route() {
    run(async {
        let w = World::new();
        let (slow, mut arrivals, slow_addr) = start_held().await;
        let (fast, fast_addr) = receiver::start().await;
        let two_at_a_time = |name: &str| {
            let mut r = route(name, slow_addr, true);
            (r.concurrency, r.timeout) = (2, Duration::from_secs(60));
            r
        };
        let sent = [
            ("a1", "slow-a"),
            ("a2", "slow-a"),
            ("b1", "slow-b"),
            ("b2", "slow-b"),
        ];
        for (id, to) in sent {
            w.accept(id, &[to]).await;
        }
        let options = RelayOptions {
            lease: Duration::from_secs(120),
            batch: sent.len(),
            ..RelayOptions::default()
        };
        let routes = vec![
            two_at_a_time("slow-a"),
            two_at_a_time("slow-b"),
            route("fast", fast_addr, true),
        ];
        let clock = Arc::new(w.clock.clone());
        let relay = Arc::new(Relay::new(w.inbox.clone(), routes, clock, options));
        let (stop, task) = running(relay);
        for _ in sent {
            arrivals.recv().await.expect("every slow request arrives");
        }
        // The slow routes now send a whole batch's worth, each at its concurrency.
        w.accept("f1", &["fast"]).await;
        wait_state(&w, "f1", DeliveryState::Delivered).await;
        assert_eq!(fast.requests().len(), 1);
        for (id, _) in sent {
            let state = w.delivery(id).await.state;
            assert_eq!(state, DeliveryState::InFlight, "{id} is still held");
        }
        slow.gate.add_permits(sent.len());
        for (id, _) in sent {
            wait_state(&w, id, DeliveryState::Delivered).await;
        }
        let _ = stop.send(());
        task.await.unwrap();
    });
}

/// Claims waiting behind a slow receiver's permits until their lease no longer leaves time to
/// send and record them are given back unsent while the lease lasts. Left waiting, they
/// stayed in flight past it, and another relay took them over as possibly sent (uncertain on a
/// route that does not honour the key) though nothing had been.
#[test]
fn claims_waiting_past_their_lease_are_given_back_unsent() {
    run(async {
        let w = World::new();
        let (slow, mut arrivals, slow_addr) = start_held().await;
        let mut one_at_a_time = route("slow", slow_addr, false);
        // Sent by 6.5 - (4 + 1.25) = 1.25 s after the claim, or given back.
        (one_at_a_time.concurrency, one_at_a_time.timeout) = (1, Duration::from_secs(4));
        // Room for three more in one claim: they wait for the slow route's one permit.
        let mut idle = route("idle", crate::closed_port(), true);
        idle.concurrency = 3;
        let sent = ["q1", "q2", "q3", "q4"];
        for id in sent {
            w.accept(id, &["slow"]).await;
        }
        let options = RelayOptions {
            lease: Duration::from_millis(6_500),
            ..RelayOptions::default()
        };
        let clock = Arc::new(w.clock.clone());
        let relay = Relay::new(w.inbox.clone(), vec![one_at_a_time, idle], clock, options);
        let (stop, task) = running(Arc::new(relay));
        arrivals.recv().await.expect("the first request arrives");
        for id in &sent[1..] {
            wait_state(&w, id, DeliveryState::Pending).await;
            assert_eq!(w.delivery(id).await.attempts, 0, "{id} was not sent");
        }
        assert!(arrivals.try_recv().is_err(), "one request went, no other");
        // The receiver answers; once the pause is over the three are claimed and sent.
        slow.gate.add_permits(sent.len());
        wait_state(&w, "q1", DeliveryState::Delivered).await;
        w.clock.advance(Duration::from_secs(2));
        for id in sent {
            wait_state(&w, id, DeliveryState::Delivered).await;
            assert_eq!(w.delivery(id).await.attempts, 1, "{id} was sent once");
        }
        let _ = stop.send(());
        task.await.unwrap();
    });
}

#[test]
fn a_shutdown_gives_back_the_claims_waiting_for_their_route() {
    run(async {
        let w = World::new();
        let (slow, mut arrivals, slow_addr) = start_held().await;
        let mut one_at_a_time = route("slow", slow_addr, true);
        one_at_a_time.concurrency = 1;
        // A second route with room and nothing due: one claim takes the room of both, so two
        // claims of the slow route wait for its one permit.
        let mut idle = route("idle", crate::closed_port(), true);
        idle.concurrency = 2;
        let relay = Arc::new(w.relay(vec![one_at_a_time, idle]));
        let sent = ["q1", "q2", "q3"];
        for id in sent {
            w.accept(id, &["slow"]).await;
        }
        let (stop, task) = running(relay);
        arrivals.recv().await.expect("the first request arrives");
        for id in sent {
            assert_eq!(
                w.delivery(id).await.state,
                DeliveryState::InFlight,
                "{id} claimed: two wait for the route"
            );
        }
        let _ = stop.send(());
        // The two behind the first are given back while it is still being sent.
        // Wait for two of them to be pending again.
        for _ in 0..2_000 {
            let mut pending = 0;
            for id in sent {
                pending += usize::from(w.delivery(id).await.state == DeliveryState::Pending);
            }
            if pending == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut states = Vec::new();
        for id in sent {
            states.push(w.delivery(id).await.state);
        }
        assert_eq!(
            states
                .iter()
                .filter(|s| **s == DeliveryState::Pending)
                .count(),
            2,
            "the claims waiting for the route were given back: {states:?}"
        );
        assert_eq!(
            states
                .iter()
                .filter(|s| **s == DeliveryState::InFlight)
                .count(),
            1,
            "{states:?}"
        );
        // The attempt in progress finishes and is recorded; nothing else is sent.
        slow.gate.add_permits(1);
        task.await.unwrap();
        let mut delivered = 0;
        for id in sent {
            delivered += usize::from(w.delivery(id).await.state == DeliveryState::Delivered);
        }
        assert_eq!(delivered, 1);
        assert!(
            arrivals.try_recv().is_err(),
            "no request after the shutdown"
        );
    });
}

/// A claim under way when the shutdown comes (here: queued behind a busy writer) brings back
/// deliveries the stopping relay must not start: they are given back unsent.
#[test]
fn what_a_claim_brings_back_as_the_shutdown_begins_is_given_back_unsent() {
    run(async {
        let w = World::new();
        let (rx, addr) = receiver::start().await;
        w.accept("evt_late", &["hooks"]).await;
        let relay = Arc::new(w.relay(vec![route("hooks", addr, true)]));
        // The writer is busy until the test lets it go: the relay's claim waits in its queue.
        let gate = hold_writer(&w.inbox).await;
        let (stop, task) = running(relay);
        queued(&w.inbox, 1).await;
        // The stop wakes the relay's task at once; the claim answers only after the writer
        // has committed the holder's batch and then the claim's own (two syncs), so the relay
        // has seen the stop when the claim brings the delivery back.
        let _ = stop.send(());
        drop(gate);
        task.await.unwrap();
        let d = w.delivery("evt_late").await;
        assert_eq!((d.state, d.attempts), (DeliveryState::Pending, 0));
        assert!(rx.requests().is_empty(), "nothing sent after the shutdown");
    });
}
