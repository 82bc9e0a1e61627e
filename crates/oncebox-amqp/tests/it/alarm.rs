//! A broker memory alarm under a consumer holding a poison message and good ones: the alarm
//! blocks a connection that publishes, and the broker then reads nothing more from it. With
//! the quarantine's copies published on a connection of their own (`run_apart`), only the
//! quarantine waits: the good messages' acks, on the consuming connection, reach the broker
//! during the alarm, and the poison message is quarantined once it clears. On one connection
//! the first copy blocked it, and every ack behind it waited for the alarm's end. On a private
//! RabbitMQ node, whose alarm no other test meets.

use std::time::{Duration, Instant};

use oncebox_amqp::Consumer;
use oncebox_testkit::consume::Running;
use oncebox_testkit::rabbit::PrivateRabbit;
use oncebox_testkit::run;

use crate::support::{World, connect};

/// What the node says of `queue`: messages ready, and delivered but not acknowledged.
fn held(rabbit: &PrivateRabbit, queue: &str) -> (u32, u32) {
    let listed = rabbit.ctl(&[
        "list_queues",
        "--silent",
        "name",
        "messages_ready",
        "messages_unacknowledged",
    ]);
    listed
        .lines()
        .find_map(|l| {
            let mut f = l.split_whitespace();
            (f.next() == Some(queue)).then(|| {
                let mut n = || f.next().and_then(|v| v.parse().ok()).unwrap_or(u32::MAX);
                (n(), n())
            })
        })
        .unwrap_or((u32::MAX, u32::MAX))
}

#[test]
fn under_an_alarm_a_quarantine_blocks_only_its_own_connection() {
    let Some(rabbit) = PrivateRabbit::start() else {
        return;
    };
    run(async move {
        rabbit.ready().await;
        let url = rabbit.url();
        let w = World::new(&url).await;
        // No message id, which is the key: quarantined as invalid at its first attempt.
        w.publish(None, r#"{"amount":1}"#).await;
        for id in ["evt_a", "evt_b", "evt_c"] {
            w.publish(Some(id), r#"{"amount":1}"#).await;
        }
        rabbit.alarm(true);
        let apply = w.db.checked();
        let mut options = w.options();
        options.confirm_timeout = Duration::from_secs(1);
        let consumer = Consumer::new(apply.clone(), options);
        let counts = consumer.counts();
        let at = url.clone();
        let mut running = Running::spawn(consumer.counts(), move |stopped| async move {
            let (consuming, publishing) = (connect(&at).await, connect(&at).await);
            let stop = async move {
                let _ = stopped.await;
            };
            consumer.run_apart(&consuming, &publishing, stop).await
        });
        running.wait(|c| c.applied == 3, w.state()).await;
        // The broker took the three acks during the alarm: at most the poison message is
        // still in hand.
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let (ready, unacked) = held(&rabbit, &w.queue);
            if ready + unacked <= 1 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "acks not taken during the alarm: {ready} ready, {unacked} unacknowledged"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let during = counts.borrow().quarantined;
        assert_eq!(during, 0, "no copy was taken during the alarm");

        rabbit.alarm(false);
        running.wait(|c| c.quarantined == 1, w.state()).await;
        let done = running.stop().await;
        assert_eq!((done.applied, done.quarantined), (3, 1), "{done:?}");
        // One copy or more: a copy whose confirm the alarm held past `confirm_timeout` was
        // requeued and published again, and the blocked ones went through when it cleared
        // (quarantine copies are at least once). Each is the poison message's.
        let copies = w.quarantined().await;
        assert!(!copies.is_empty());
        assert!(
            copies
                .iter()
                .all(|(reason, _)| reason == "event-id-missing"),
            "{copies:?}"
        );
        w.cleanup().await;
    });
}
