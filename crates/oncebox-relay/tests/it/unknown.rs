//! Attempts of unknown outcome (the request sent, its answer lost): the status URL is first
//! asked no sooner than the route's timeout after the attempt, past any cache in front of the
//! receiver, and where the key is honoured a last such attempt is asked about rather than
//! given up on.

use std::sync::Arc;
use std::time::Duration;

use oncebox_core::delivery::DeliveryState;
use oncebox_core::relay_store::STATUS_RECHECK;
use oncebox_relay::{Relay, RelayOptions};
use oncebox_sqlite::Inbox;
use oncebox_testkit::run;

use crate::{World, receiver, route};

/// A relay of `routes` with leases long enough for a route's minute-long timeout.
fn relay(w: &World, routes: Vec<oncebox_core::route::Route>) -> Relay<Inbox> {
    let options = RelayOptions {
        lease: Duration::from_secs(600),
        ..RelayOptions::default()
    };
    Relay::new(w.inbox.clone(), routes, Arc::new(w.clock.clone()), options)
}

/// The receiver applies the request and its answer is lost (a proxy drops it). The route gives
/// the receiver a minute: its status URL, asked 10 s later, would be asking a receiver that
/// may well still be at work (and answers "not applied"). It is first asked a minute on.
#[test]
fn the_status_url_is_first_asked_no_sooner_than_the_routes_timeout() {
    run(async {
        let w = World::new();
        let (rx, addr) = receiver::start().await;
        let (proxy, dropped) = receiver::dropping_proxy(addr).await;
        let mut slow = route("hooks", proxy, false);
        slow.timeout = Duration::from_secs(60);
        slow.status_url = Some(format!("http://{addr}/status/{{key}}"));
        let relay = relay(&w, vec![slow]);
        w.accept("evt_t", &["hooks"]).await;
        assert_eq!(relay.run_once().await.unwrap().uncertain, 1);
        assert_eq!(*dropped.lock().unwrap(), 1, "the answer was lost");
        assert_eq!(rx.hits_of("shop:evt_t"), 1, "and the request applied");
        w.clock.advance(STATUS_RECHECK.0);
        let out = relay.run_once().await.unwrap();
        assert_eq!((out.claimed, out.reconciled), (0, 0), "{out:?}");
        assert_eq!(w.delivery("evt_t").await.state, DeliveryState::Uncertain);
        w.clock.advance(Duration::from_secs(50));
        assert_eq!(relay.run_once().await.unwrap().reconciled, 1);
        assert_eq!(w.delivery("evt_t").await.state, DeliveryState::Delivered);
        assert_eq!(rx.hits_of("shop:evt_t"), 1, "never sent again");
    });
}

/// A route that honours the key, allowed one attempt: the attempt's answer is lost. Dead, the
/// delivery read as never applied (an operator redelivers, an alert fires) though the receiver
/// applied it; uncertain, its status URL says it was.
#[test]
fn a_last_attempt_whose_answer_was_lost_is_asked_about_not_given_up() {
    run(async {
        let w = World::new();
        let (rx, addr) = receiver::start().await;
        let (proxy, dropped) = receiver::dropping_proxy(addr).await;
        let mut once = route("hooks", proxy, true);
        once.retry.max_attempts = 1;
        once.status_url = Some(format!("http://{addr}/status/{{key}}"));
        let relay = relay(&w, vec![once]);
        w.accept("evt_l", &["hooks"]).await;
        let out = relay.run_once().await.unwrap();
        assert_eq!((out.uncertain, out.dead), (1, 0), "{out:?}");
        assert_eq!(*dropped.lock().unwrap(), 1, "the answer was lost");
        w.clock.advance(STATUS_RECHECK.0);
        assert_eq!(relay.run_once().await.unwrap().reconciled, 1);
        let d = w.delivery("evt_l").await;
        assert_eq!((d.state, d.attempts), (DeliveryState::Delivered, 1));
        assert_eq!(rx.hits_of("shop:evt_l"), 1);
    });
}

/// A cache in front of the receiver (a CDN that stores JSON GETs) keeps an early "not applied";
/// asked again through it, the relay would read that and send the delivery again. The question
/// says `Cache-Control: no-cache`; this status URL answers "applied" only to one that does.
#[test]
fn the_status_url_is_asked_past_any_cache() {
    run(async {
        let w = World::new();
        let (rx, addr) = receiver::start().await;
        let (proxy, _dropped) = receiver::dropping_proxy(addr).await;
        let status = axum::Router::new().route(
            "/status/{key}",
            axum::routing::get(|headers: axum::http::HeaderMap| async move {
                let fresh = headers
                    .get("cache-control")
                    .is_some_and(|v| v.as_bytes() == b"no-cache");
                axum::Json(serde_json::json!({ "applied": fresh }))
            }),
        );
        let status = receiver::serve(status).await;
        let mut plain = route("hooks", proxy, false);
        plain.status_url = Some(format!("http://{status}/status/{{key}}"));
        let relay = relay(&w, vec![plain]);
        w.accept("evt_c", &["hooks"]).await;
        assert_eq!(relay.run_once().await.unwrap().uncertain, 1);
        w.clock.advance(STATUS_RECHECK.0);
        assert_eq!(relay.run_once().await.unwrap().reconciled, 1);
        assert_eq!(w.delivery("evt_c").await.state, DeliveryState::Delivered);
        assert_eq!(rx.hits_of("shop:evt_c"), 1);
    });
}
