//! A RabbitMQ memory alarm under a route: the broker blocks the publishing connection and
//! reads nothing it sends until the alarm clears. The publish that meets the alarm waits out
//! its confirm (an unknown outcome); the next ones are not sent, on the same connection, kept
//! for the alarm's end; once it clears, every delivery goes. Before, each attempt opened a
//! new connection, which the broker blocked at its first publish and held open with its
//! message: every attempt an unknown outcome (uncertain on a route that does not honour the
//! key), and connections piling up for as long as the alarm lasted. On a private broker of the
//! test's own, whose alarm no other test meets.

use std::time::{Duration, Instant};

use lapin::options::{BasicGetOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use oncebox_core::delivery::DeliveryState;
use oncebox_testkit::rabbit::PrivateRabbit;
use oncebox_testkit::run;

use crate::{World, broker_route, with_query};

#[test]
fn publishes_during_a_memory_alarm_are_not_sent_and_go_once_it_clears() {
    let Some(rabbit) = PrivateRabbit::start() else {
        return;
    };
    run(async move {
        rabbit.ready().await;
        let reader = Connection::connect(&rabbit.url(), ConnectionProperties::default())
            .await
            .unwrap();
        let channel = reader.create_channel().await.unwrap();
        let queue = "alarmed";
        channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        let url = with_query(&rabbit.url(), &[("exchange", ""), ("routing_key", queue)]);
        let mut route = broker_route("q", &url, true);
        route.timeout = Duration::from_secs(2);
        let w = World::new();
        let relay = w.relay(vec![route]);
        w.accept("evt_1", &["q"]).await;
        assert_eq!(relay.run_once().await.unwrap().delivered, 1);
        let before = rabbit.connections();

        rabbit.alarm(true);
        // The publish that meets the alarm: blocked, no confirm in time.
        w.accept("evt_2", &["q"]).await;
        let met = relay.run_once().await.unwrap();
        assert_eq!(met.delivered, 0, "{met:?}");
        let d2 = w.delivery("evt_2").await;
        assert_eq!(d2.state, DeliveryState::Retrying, "{d2:?}");
        let error = d2.last_error.clone().unwrap_or_default();
        assert!(error.contains("no confirm"), "{d2:?}");
        // The next is not sent, on the connection kept for the alarm's end.
        w.accept("evt_3", &["q"]).await;
        assert_eq!(relay.run_once().await.unwrap().delivered, 0);
        let d3 = w.delivery("evt_3").await;
        let error = d3.last_error.clone().unwrap_or_default();
        assert!(error.contains("blocks publishing"), "{d3:?}");
        assert_eq!(rabbit.connections(), before, "no connection added");

        rabbit.alarm(false);
        // Once the broker says the connection is unblocked, both go.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            w.clock.advance(Duration::from_secs(3600));
            relay.run_once().await.unwrap();
            let states = (
                w.delivery("evt_2").await.state,
                w.delivery("evt_3").await.state,
            );
            if states == (DeliveryState::Delivered, DeliveryState::Delivered) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "not delivered after the alarm: {states:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Every key reached the queue (evt_2's first publish, confirmed late, maybe twice:
        // the route honours the key).
        let mut ids = Vec::new();
        while let Some(m) = channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            ids.push(
                m.delivery
                    .properties
                    .message_id()
                    .clone()
                    .unwrap()
                    .to_string(),
            );
        }
        ids.sort();
        ids.dedup();
        assert_eq!(ids, ["shop:evt_1", "shop:evt_2", "shop:evt_3"]);
    });
}
