//! An operator's retry after an outage: the delivery gets a budget as fresh as a new one's, so
//! the route's caps on attempts and age count from the retry, not from the delivery's creation.

use std::time::Duration;

use oncebox_core::delivery::DeliveryState;
use oncebox_core::relay_store::DeliveryStore;
use oncebox_testkit::run;

use crate::{World, receiver, route};

#[test]
fn a_delivery_retried_by_hand_after_an_outage_gets_a_fresh_budget() {
    run(async {
        let w = World::new();
        let (rx, addr) = receiver::start().await;
        rx.answer(&[(503, None)]);
        w.accept("evt_outage", &["hooks"]).await;
        let mut hooks = route("hooks", addr, true);
        hooks.retry.max_attempts = 3;
        hooks.retry.max_age = Duration::from_secs(3600);
        let relay = w.relay(vec![hooks]);
        // The receiver is down for longer than the route's `max_age`: the delivery dies.
        for _ in 0..2 {
            relay.run_once().await.unwrap();
            w.clock.advance(Duration::from_secs(2 * 3600));
        }
        let dead = w.delivery("evt_outage").await;
        assert_eq!((dead.state, dead.attempts), (DeliveryState::Dead, 2));
        assert_eq!(rx.requests().len(), 1, "not sent again past max_age");

        // Once it is back, the operator retries. Counted from the creation, its age and
        // attempts would be spent, and one more failure would kill it again at once.
        assert!(w.inbox.retry(dead.id, w.clock_now()).await.unwrap());
        relay.run_once().await.unwrap();
        let again = w.delivery("evt_outage").await;
        assert_eq!((again.state, again.attempts), (DeliveryState::Retrying, 3));
        w.clock.advance(Duration::from_secs(60));
        relay.run_once().await.unwrap();
        w.clock.advance(Duration::from_secs(60));
        relay.run_once().await.unwrap();
        let spent = w.delivery("evt_outage").await;
        assert_eq!(
            (spent.state, spent.attempts),
            (DeliveryState::Dead, 5),
            "three attempts of its own, then dead again"
        );
        assert_eq!(rx.requests().len(), 4);
    });
}
