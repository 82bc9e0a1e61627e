//! Claims that no longer fit their lease. A store whose claims take longer than a lease's
//! margin beyond its route's timeout: every claim comes back already too short to send. Given
//! back due at once, such a claim was taken again at once, and again, two writes a turn and
//! nothing sent: a relay spinning on its store. And a lease no longer than the timeout (a
//! library caller's choice), which has no margin to keep: its claims were sent however late.

use std::sync::Arc;
use std::time::Duration;

use oncebox_core::delivery::DeliveryState;
use oncebox_relay::{Relay, RelayOptions};
use oncebox_testkit::relay::Holding;
use oncebox_testkit::run;
use tokio::sync::watch;

use crate::receiver::serve;
use crate::{World, receiver, route};

/// How long each claim takes of the relay's clock.
const SLOW: Duration = Duration::from_millis(300);

#[test]
fn a_claim_slower_than_the_leases_margin_is_held_back_not_taken_again_at_once() {
    run(async {
        let w = World::new();
        let (rx, addr) = receiver::start().await;
        w.accept("evt_a", &["hooks"]).await;
        let hooks = route("hooks", addr, true);
        // The least configuration allows beyond the timeout: half of it, 250 ms, must be left
        // when the claim is sent, and each claim takes 300 ms.
        let options = RelayOptions {
            lease: hooks.timeout + Duration::from_millis(500),
            ..RelayOptions::default()
        };
        // Each claim takes SLOW of the relay's clock; the claims asked for are counted, and
        // how many of them came back with the delivery.
        let counts = Arc::new(watch::Sender::new((0_u32, 0_u32)));
        let (clock, counted) = (w.clock.clone(), counts.clone());
        let store = Holding::new(w.inbox.clone(), ()).on_claim(move |claimed| {
            clock.advance(SLOW);
            let with = u32::from(claimed.as_ref().is_ok_and(|c| !c.is_empty()));
            counted.send_modify(|(asked, taken)| (*asked, *taken) = (*asked + 1, *taken + with));
        });
        let mut counts = counts.subscribe();
        let relay = Relay::new(store, vec![hooks], Arc::new(w.clock.clone()), options);
        relay
            .run(async {
                let _ = counts.wait_for(|(asked, _)| *asked >= 12).await;
            })
            .await;
        let (asked, taken) = *counts.borrow();
        // Taken, given back a second ahead, not due again for three more claims of 300 ms:
        // at most once in four claims. Due at once, it came back in every claim that did not
        // run while it was still being given back.
        assert!(taken >= 2, "{taken} of {asked}");
        assert!(taken <= asked.div_ceil(4) + 1, "{taken} of {asked}");
        assert_eq!(rx.hits_of("shop:evt_a"), 0, "never sent short of its lease");
        let d = w.delivery("evt_a").await;
        assert_eq!((d.state, d.attempts), (DeliveryState::Pending, 0));
    });
}

/// A lease of 3 s on a route with a 5 s timeout, one request at a time, each taking 4 s of the
/// clock: `evt_b`'s turn comes after its lease ended, when another relay may already have taken
/// it over. It is given back unsent, not sent late.
#[test]
fn a_claim_whose_lease_ended_before_its_turn_is_not_sent_whatever_the_lease() {
    run(async {
        let w = World::new();
        let seen = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let (log, clock) = (seen.clone(), w.clock.clone());
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |headers: axum::http::HeaderMap| async move {
                let key = headers["idempotency-key"].to_str().unwrap().to_owned();
                log.lock().unwrap().push(key);
                clock.advance(Duration::from_secs(4));
                axum::http::StatusCode::OK
            }),
        );
        let addr = serve(app).await;
        for id in ["evt_a", "evt_b"] {
            w.accept(id, &["hooks"]).await;
        }
        let mut one_at_a_time = route("hooks", addr, false);
        one_at_a_time.concurrency = 1;
        let options = RelayOptions {
            lease: Duration::from_secs(3),
            ..RelayOptions::default()
        };
        let relay = Relay::new(
            w.inbox.clone(),
            vec![one_at_a_time],
            Arc::new(w.clock.clone()),
            options,
        );
        let out = relay.run_once().await.unwrap();
        // `evt_a`'s answer came after its own lease: fenced, as any record past it.
        assert_eq!(
            (out.claimed, out.unclaimed, out.fenced),
            (2, 1, 1),
            "{out:?}"
        );
        assert_eq!(*seen.lock().unwrap(), ["shop:evt_a"]);
        let b = w.delivery("evt_b").await;
        assert_eq!((b.state, b.attempts), (DeliveryState::Pending, 0));
    });
}
