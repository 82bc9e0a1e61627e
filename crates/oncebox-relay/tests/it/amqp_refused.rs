//! A RabbitMQ publish the broker refuses by closing its channel (the exchange deleted since
//! the channel checked it: 404; no write permission: 403; over `max_message_size`: 406): the
//! broker stored nothing, so the delivery is retried, never parked uncertain; the relay's
//! connection, sound, is kept.

use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use oncebox_core::delivery::DeliveryState;
use oncebox_testkit::run;

use crate::amqp::Rabbit;
use crate::{World, broker_route};

#[test]
fn amqp_publish_refused_by_a_channel_close_is_not_sent_and_retried() {
    run(async {
        let Some(rabbit) = Rabbit::new(FieldTable::default()).await else {
            return;
        };
        rabbit.bind().await;
        let w = World::new();
        w.accept("evt_1", &["rabbit"]).await;
        // Not idempotent: an unknown outcome would park the delivery.
        let relay = w.relay(vec![broker_route("rabbit", &rabbit.url(None), false)]);
        assert_eq!(relay.run_once().await.unwrap().delivered, 1);
        // The channel that published evt_1 checked the exchange and is kept for the next
        // publish; the exchange goes from under it.
        rabbit
            .channel
            .exchange_delete(
                rabbit.exchange.as_str().into(),
                ExchangeDeleteOptions::default(),
            )
            .await
            .unwrap();
        w.accept("evt_2", &["rabbit"]).await;
        let out = relay.run_once().await.unwrap();
        let d = w.delivery("evt_2").await;
        assert_eq!(d.state, DeliveryState::Retrying, "{out:?} {d:?}");
        let last = d.last_error.unwrap_or_default();
        // The fault happened: the broker refused the publish on the kept channel.
        assert!(
            last.contains("refused by the broker") && last.contains("NOT_FOUND"),
            "{last}"
        );
        assert_eq!(rabbit.take().await.len(), 1, "evt_1 alone was stored");
        rabbit
            .channel
            .queue_delete(rabbit.queue().into(), QueueDeleteOptions::default())
            .await
            .unwrap();
    });
}
