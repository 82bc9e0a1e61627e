//! A route's `max_age` bounds when a request with a delivery's key may reach the receiver: one
//! that honours the key keeps it that long and no longer. A delivery tried before and held
//! back past it (the relay stopped, its circuit open) is recorded dead without being sent:
//! sent late, it could apply the event a second time where the earlier outcome was unknown.
//! One never tried still gets its try (nothing of it reached the receiver), and a last try
//! scheduled at the cap after a `Retry-After` past it is still sent.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use oncebox_core::delivery::DeliveryState;
use oncebox_relay::{Relay, RelayOptions};
use oncebox_testkit::run;

use crate::{World, receiver, route};

const MAX_AGE: Duration = Duration::from_secs(3600);

#[test]
fn a_delivery_tried_before_is_not_sent_past_max_age() {
    run(async {
        let w = World::new();
        let (rx, addr) = receiver::start().await;
        rx.answer(&[(503, None), (200, None)]);
        w.accept("evt_late", &["hooks"]).await;
        let mut hooks = route("hooks", addr, true);
        hooks.retry.max_age = MAX_AGE;
        let relay = w.relay(vec![hooks]);
        relay.run_once().await.unwrap();
        assert_eq!(w.delivery("evt_late").await.state, DeliveryState::Retrying);
        // The relay is away for longer than the route keeps keys.
        w.clock.advance(2 * MAX_AGE);
        relay.run_once().await.unwrap();
        let d = w.delivery("evt_late").await;
        assert_eq!(d.state, DeliveryState::Dead, "{d:?}");
        assert!(
            d.last_error
                .as_deref()
                .is_some_and(|e| e.starts_with("not sent again")),
            "{d:?}"
        );
        assert_eq!(rx.requests().len(), 1, "the late request was not sent");
    });
}

#[test]
fn a_delivery_never_tried_still_gets_its_try_past_max_age() {
    run(async {
        let w = World::new();
        let (rx, addr) = receiver::start().await;
        rx.answer(&[(200, None)]);
        w.accept("evt_first", &["hooks"]).await;
        let mut hooks = route("hooks", addr, true);
        hooks.retry.max_age = MAX_AGE;
        let relay = w.relay(vec![hooks]);
        w.clock.advance(2 * MAX_AGE);
        relay.run_once().await.unwrap();
        assert_eq!(
            w.delivery("evt_first").await.state,
            DeliveryState::Delivered
        );
        assert_eq!(rx.requests().len(), 1);
    });
}

#[test]
fn a_last_try_scheduled_at_the_cap_is_sent() {
    run(async {
        let w = World::new();
        let (rx, addr) = receiver::start().await;
        // Asked to hold far past the cap: one last try at the cap.
        rx.answer(&[(503, Some(10 * MAX_AGE.as_secs())), (200, None)]);
        w.accept("evt_held", &["hooks"]).await;
        let mut hooks = route("hooks", addr, true);
        hooks.retry.max_age = MAX_AGE;
        let relay = w.relay(vec![hooks]);
        relay.run_once().await.unwrap();
        let due = w
            .delivery("evt_held")
            .await
            .next_attempt_at
            .expect("scheduled");
        // Taken a moment after it is due, as a relay takes it: time passes (the route's
        // circuit, paused by the 503, counts it on the monotonic clock).
        let wait = due.millis() - w.clock_now().millis() + 1_000;
        w.clock
            .advance(Duration::from_millis(u64::try_from(wait).unwrap()));
        relay.run_once().await.unwrap();
        assert_eq!(w.delivery("evt_held").await.state, DeliveryState::Delivered);
        assert_eq!(rx.requests().len(), 2);
    });
}

/// The cap is checked again when the claim's turn comes: one claimed well inside it, then
/// kept waiting for the route's one permit behind a slow request past it, is recorded dead
/// without being sent.
#[test]
fn a_delivery_that_waits_for_its_turn_past_max_age_is_not_sent() {
    run(async {
        let w = World::new();
        let cap = Duration::from_secs(10);
        let seen = Arc::new(Mutex::new(Vec::<String>::new()));
        let (log, clock) = (seen.clone(), w.clock.clone());
        // evt_late's first try fails; evt_a's request takes 100 s of the relay's clock.
        let app = Router::new().route(
            "/hook",
            post(move |headers: HeaderMap| async move {
                let key = headers["idempotency-key"].to_str().unwrap().to_owned();
                let mut log = log.lock().unwrap();
                log.push(key.clone());
                if key == "shop:evt_a" {
                    clock.advance(Duration::from_secs(100));
                }
                // Retried no sooner than 5 s: evt_a, due at once, is claimed ahead of it.
                if log.len() == 1 {
                    (StatusCode::SERVICE_UNAVAILABLE, [("retry-after", "5")])
                } else {
                    (StatusCode::OK, [("retry-after", "0")])
                }
            }),
        );
        let addr = receiver::serve(app).await;
        let mut hooks = route("hooks", addr, true);
        hooks.retry.max_age = cap;
        hooks.concurrency = 1;
        // A lease far longer than the wait, so that only the cap can hold evt_late back.
        let options = RelayOptions {
            lease: Duration::from_secs(3600),
            ..RelayOptions::default()
        };
        let relay = Relay::new(
            w.inbox.clone(),
            vec![hooks],
            Arc::new(w.clock.clone()),
            options,
        );
        w.accept("evt_late", &["hooks"]).await;
        relay.run_once().await.unwrap();
        assert_eq!(w.delivery("evt_late").await.state, DeliveryState::Retrying);
        // Due before evt_late's retry, so claimed ahead of it and sent first.
        w.accept("evt_a", &["hooks"]).await;
        w.clock.advance(Duration::from_secs(20));
        let out = relay.run_once().await.unwrap();
        assert_eq!(out.claimed, 2, "{out:?}");
        assert_eq!(w.delivery("evt_a").await.state, DeliveryState::Delivered);
        let late = w.delivery("evt_late").await;
        assert_eq!(late.state, DeliveryState::Dead, "{late:?}");
        assert_eq!(
            *seen.lock().unwrap(),
            ["shop:evt_late", "shop:evt_a"],
            "evt_late was not sent again"
        );
    });
}
