//! A route's `rate`: a backlog goes out one request per interval, never in a burst, while an
//! unpaced route beside it goes at its own speed, nor in a burst after a slow answer held the
//! route's permits; a claim whose slot its lease cannot wait for is given back unsent.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use oncebox_core::Clock;
use oncebox_core::delivery::DeliveryState;
use oncebox_core::route::Rate;
use oncebox_relay::{Outcome, Relay, RelayOptions};
use oncebox_sqlite::Inbox;
use oncebox_testkit::run;

use crate::{World, receiver, route};

/// Arrival times of what `receiver` got, in order.
fn arrivals(receiver: &receiver::Receiver) -> Vec<Instant> {
    let mut at: Vec<Instant> = receiver.requests().iter().map(|s| s.at).collect();
    at.sort_unstable();
    at
}

/// Runs `relay` until `done` holds (looked at every 10 ms, for at most 30 s), then stops it.
async fn run_until(relay: Relay<Inbox>, done: impl Fn() -> bool) {
    let relay = Arc::new(relay);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn({
        let relay = relay.clone();
        async move {
            relay
                .run(async {
                    let _ = stopped.await;
                })
                .await;
        }
    });
    for _ in 0..3_000 {
        if done() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _ = stop.send(());
    task.await.unwrap();
}

#[test]
fn a_paced_backlog_goes_out_at_the_rate_and_an_unpaced_route_is_not_held_back() {
    run(async {
        let w = World::new();
        let (paced_rx, paced_addr) = receiver::start().await;
        let (free_rx, free_addr) = receiver::start().await;
        // One request every 50 ms, with room for eight at once that the pace never uses.
        let mut paced = route("paced", paced_addr, true);
        paced.rate = Some(Rate::parse("20/s").unwrap());
        paced.concurrency = 8;
        const PACED: usize = 31;
        const FREE: usize = 20;
        for i in 0..PACED {
            w.accept(&format!("p{i}"), &["paced"]).await;
        }
        for i in 0..FREE {
            w.accept(&format!("f{i}"), &["free"]).await;
        }
        let relay = w.relay(vec![paced, route("free", free_addr, true)]);
        run_until(relay, || {
            paced_rx.requests().len() == PACED && free_rx.requests().len() == FREE
        })
        .await;
        let paced_at = arrivals(&paced_rx);
        let free_at = arrivals(&free_rx);
        assert_eq!((paced_at.len(), free_at.len()), (PACED, FREE));
        // Sent 50 ms apart. Each arrives after its own latency, which a loaded machine spreads
        // by far less than the 200 ms allowed; unpaced, all 31 arrive within milliseconds.
        for (i, later) in paced_at.iter().enumerate().skip(10) {
            let ten_apart = *later - paced_at[i - 10];
            assert!(
                ten_apart >= Duration::from_millis(300),
                "requests {} and {i} arrived {ten_apart:?} apart, not about 500 ms",
                i - 10
            );
        }
        let span = paced_at[PACED - 1] - paced_at[0];
        assert!(
            span >= Duration::from_millis(1_300),
            "{span:?} for 30 intervals of 50 ms"
        );
        // The unpaced route's twenty were all in before the paced route's last, due 1.5 s
        // after its first: held behind the paced backlog, they would come after it.
        assert!(
            free_at[FREE - 1] < paced_at[PACED - 1],
            "the unpaced route finished {:?} after the paced one began",
            free_at[FREE - 1] - paced_at[0]
        );
    });
}

/// A paced route claimed for beside another route is claimed for its slots only: in one claim
/// over both, oldest first, its older backlog took the other route's room too, and waited for
/// its slots under the lease.
#[test]
fn a_paced_route_beside_another_is_claimed_for_its_slots_only() {
    run(async {
        let w = World::new();
        let (paced_rx, paced_addr) = receiver::start().await;
        let (_, free_addr) = receiver::start().await;
        // One slot a minute: none but the first comes within reach during the test.
        let mut paced = route("paced", paced_addr, true);
        paced.rate = Some(Rate::parse("1/min").unwrap());
        let backlog = ["p1", "p2", "p3", "p4"];
        for id in backlog {
            w.accept(id, &["paced"]).await;
        }
        // A lease long enough to wait for the next slots: claimed, they would be held for them.
        let options = RelayOptions {
            lease: Duration::from_secs(600),
            ..RelayOptions::default()
        };
        let routes = vec![paced, route("free", free_addr, true)];
        let clock = Arc::new(w.clock.clone());
        let relay = Arc::new(Relay::new(w.inbox.clone(), routes, clock, options));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = {
            let relay = relay.clone();
            tokio::spawn(async move {
                relay
                    .run(async {
                        let _ = stopped.await;
                    })
                    .await
            })
        };
        for _ in 0..2_000 {
            if !paced_rx.requests().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(paced_rx.requests().len(), 1, "the first slot's request");
        let mut pending = 0;
        for id in &backlog[1..] {
            pending += usize::from(w.delivery(id).await.state == DeliveryState::Pending);
        }
        assert_eq!(pending, 3, "claimed beyond the route's one slot");
        let _ = stop.send(());
        running.await.unwrap();
    });
}

/// A receiver whose first answer takes `slow`; it keeps each request's arrival.
async fn slow_first(slow: Duration) -> (Arc<Mutex<Vec<Instant>>>, std::net::SocketAddr) {
    async fn hook(State((seen, slow)): State<(Arc<Mutex<Vec<Instant>>>, Duration)>) -> StatusCode {
        let first = {
            let mut seen = seen.lock().unwrap();
            seen.push(Instant::now());
            seen.len() == 1
        };
        if first {
            tokio::time::sleep(slow).await;
        }
        StatusCode::OK
    }
    let seen = Arc::new(Mutex::new(Vec::new()));
    let app = Router::new()
        .route("/hook", post(hook))
        .with_state((seen.clone(), slow));
    (seen, receiver::serve(app).await)
}

#[test]
fn a_slow_answer_holding_the_permit_is_not_followed_by_a_burst() {
    run(async {
        let w = World::new();
        // The first answer takes 600 ms, twelve of the route's 50 ms intervals, while the
        // claims behind it wait for the route's one permit.
        let slow = Duration::from_millis(600);
        let (seen, addr) = slow_first(slow).await;
        let mut paced = route("paced", addr, true);
        paced.rate = Some(Rate::parse("20/s").unwrap());
        paced.concurrency = 1;
        // A route with room and nothing due: its share of a claim brings the paced route's
        // deliveries in beyond its one permit, to wait for it.
        let mut idle = route("idle", addr, true);
        idle.concurrency = 8;
        const EVENTS: usize = 9;
        for i in 0..EVENTS {
            w.accept(&format!("s{i}"), &["paced"]).await;
        }
        run_until(w.relay(vec![paced, idle]), || {
            seen.lock().unwrap().len() == EVENTS
        })
        .await;
        let at = seen.lock().unwrap().clone();
        assert_eq!(at.len(), EVENTS);
        assert!(
            at[1] - at[0] >= slow,
            "the second went before the first was answered"
        );
        // After the slow answer, eight more at 50 ms each: 350 ms from the second to the last
        // at the pace. Slots taken while the permit was held sent them back to back.
        let after = at[EVENTS - 1] - at[1];
        assert!(
            after >= Duration::from_millis(250),
            "the {} after the slow answer arrived within {after:?}: a burst",
            EVENTS - 1
        );
    });
}

#[test]
fn a_slot_the_lease_cannot_wait_for_gives_the_claim_back_unsent() {
    slot_out_of_the_leases_reach(Rate::parse("1/h").unwrap());
}

/// The same with a pace a library caller may set but configuration never gives, one request
/// per `Duration::MAX`: the next slot's time overflowed, a panic in the relay's task.
#[test]
fn a_pace_of_one_per_duration_max_gives_the_claim_back_without_overflowing() {
    slot_out_of_the_leases_reach(Rate {
        requests: 1,
        per: Duration::MAX,
    });
}

fn slot_out_of_the_leases_reach(rate: Rate) {
    run(async {
        let w = World::new();
        let (rx, addr) = receiver::start().await;
        let mut hourly = route("hourly", addr, true);
        hourly.rate = Some(rate);
        for id in ["h1", "h2", "h3"] {
            w.accept(id, &["hourly"]).await;
        }
        // One round claims all three (its batch is not paced); the first takes the hour's
        // slot, the other two would wait an hour under a lease of a minute.
        let relay = w.relay(vec![hourly]);
        let outcome = relay.run_once().await.unwrap();
        assert_eq!(
            outcome,
            Outcome {
                claimed: 3,
                delivered: 1,
                unclaimed: 2,
                ..Outcome::default()
            }
        );
        assert_eq!(rx.requests().len(), 1);
        let mut pending = 0;
        for id in ["h1", "h2", "h3"] {
            let d = w.delivery(id).await;
            if d.state == DeliveryState::Pending {
                pending += 1;
                // Held back a second as any claim its lease ran short for, not taken again
                // at once by a relay whose next claim would be as short.
                assert_eq!(
                    d.next_attempt_at,
                    Some(w.clock.now().plus(Duration::from_secs(1)))
                );
            }
        }
        assert_eq!(pending, 2, "given back, due again");
    });
}
