//! Deliveries owed to a route the relay is not configured with (renamed or removed since they
//! were queued) are never claimed: the relay names them, per route, for its warning and the
//! `oncebox_deliveries_unrouted` gauge, and a route of that name configured again sends them.

use std::net::SocketAddr;

use oncebox_core::delivery::DeliveryState;
use oncebox_testkit::run;

use crate::{World, route};

/// Nothing listens here: no attempt is made in this test before the route is configured.
const NOWHERE: &str = "127.0.0.1:9";

#[test]
fn deliveries_of_a_route_no_longer_configured_are_named_and_left_alone() {
    run(async {
        let w = World::new();
        w.accept("e1", &["orders"]).await;
        w.accept("e2", &["orders", "audit"]).await;
        let addr: SocketAddr = NOWHERE.parse().unwrap();
        // `orders` was renamed `orders-v2`.
        let relay = w.relay(vec![
            route("orders-v2", addr, true),
            route("audit", addr, true),
        ]);
        assert_eq!(relay.unrouted().await.unwrap(), [("orders".to_owned(), 2)]);
        relay.publish_gauges().await.unwrap();
        let round = relay.run_once().await.unwrap();
        assert_eq!(round.claimed, 1, "only audit's delivery is claimed");
        assert_eq!(w.delivery("e1").await.state, DeliveryState::Pending);

        // With the old name configured again, its queue is taken up.
        let back = w.relay(vec![route("orders", addr, true)]);
        assert!(
            back.unrouted()
                .await
                .unwrap()
                .iter()
                .all(|(r, _)| r != "orders")
        );
    });
}
