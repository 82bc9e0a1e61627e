//! RabbitMQ routes against the running broker (`ONCEBOX_AMQP_URL`): persistent messages with
//! the key as `message_id`, delivered only on a confirm of a routed message; returned and
//! unreachable publishes retried; a nack, or a connection lost before the confirm, is an unknown
//! outcome.

use std::time::Duration;

use lapin::message::Delivery;
use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use oncebox_core::delivery::DeliveryState;
use oncebox_testkit::{run, service_url};

use crate::broker::{
    broker_down_is_retried, cut_before_the_confirm, refused_publish_is_retried, route_url, upstream,
};
use crate::{World, broker_route, closed_port, unique, with_query};

/// A test's own exchange and queue on the broker, deleted by `drop_all`.
pub(crate) struct Rabbit {
    base: String,
    _connection: Connection,
    pub channel: Channel,
    pub exchange: String,
    queue: String,
}

impl Rabbit {
    /// Declares an exchange and a queue (not yet bound); `None` when the broker is not
    /// configured. `queue_args` go to the queue's declaration.
    pub async fn new(queue_args: FieldTable) -> Option<Rabbit> {
        let base = service_url("ONCEBOX_AMQP_URL")?;
        let connection = Connection::connect(&base, ConnectionProperties::default())
            .await
            .expect("the test connects to RabbitMQ");
        let channel = connection.create_channel().await.unwrap();
        let (exchange, queue) = (unique("ex"), unique("q"));
        channel
            .exchange_declare(
                exchange.as_str().into(),
                ExchangeKind::Direct,
                ExchangeDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        let mut args = queue_args;
        // A safety net for a failed test that never reaches `drop_all`.
        args.insert("x-expires".into(), AMQPValue::LongInt(300_000));
        channel
            .queue_declare(queue.as_str().into(), QueueDeclareOptions::default(), args)
            .await
            .unwrap();
        Some(Rabbit {
            base,
            _connection: connection,
            channel,
            exchange,
            queue,
        })
    }

    pub async fn bind(&self) {
        self.channel
            .queue_bind(
                self.queue.as_str().into(),
                self.exchange.as_str().into(),
                "paid".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
    }

    /// The route URL to this test's exchange with routing key `paid`, through `server` (a
    /// proxy) when given.
    pub fn url(&self, server: Option<std::net::SocketAddr>) -> String {
        let pairs = [
            ("exchange", self.exchange.as_str()),
            ("routing_key", "paid"),
        ];
        route_url(&self.base, server, &pairs)
    }

    /// The queue's name.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// Every message in the queue, taken out of it.
    pub async fn take(&self) -> Vec<Delivery> {
        let mut out = Vec::new();
        let get = BasicGetOptions { no_ack: true };
        while let Some(m) = self
            .channel
            .basic_get(self.queue.as_str().into(), get)
            .await
            .unwrap()
        {
            out.push(m.delivery);
        }
        out
    }

    async fn drop_all(self) {
        self.channel
            .queue_delete(self.queue.as_str().into(), QueueDeleteOptions::default())
            .await
            .unwrap();
        self.channel
            .exchange_delete(
                self.exchange.as_str().into(),
                ExchangeDeleteOptions::default(),
            )
            .await
            .unwrap();
    }
}

fn header(d: &Delivery, name: &str) -> Option<String> {
    match d.properties.headers().as_ref()?.inner().get(name)? {
        AMQPValue::LongString(s) => Some(s.to_string()),
        other => Some(format!("{other:?}")),
    }
}

#[test]
fn amqp_route_publishes_persistent_messages_with_the_key_as_message_id_then_records_delivered() {
    run(async {
        let Some(rabbit) = Rabbit::new(FieldTable::default()).await else {
            return;
        };
        rabbit.bind().await;
        let w = World::new();
        w.accept("evt_1", &["rabbit"]).await;
        w.accept("evt_2", &["rabbit"]).await;
        let relay = w.relay(vec![broker_route("rabbit", &rabbit.url(None), false)]);
        let out = relay.run_once().await.unwrap();
        assert_eq!((out.claimed, out.delivered), (2, 2), "{out:?}");
        for id in ["evt_1", "evt_2"] {
            let d = w.delivery(id).await;
            assert_eq!((d.state, d.last_status), (DeliveryState::Delivered, None));
        }
        let mut got = rabbit.take().await;
        got.sort_by_key(|d| d.properties.message_id().clone());
        assert_eq!(got.len(), 2, "each event published once");
        for (d, id) in got.iter().zip(["evt_1", "evt_2"]) {
            let key = format!("shop:{id}");
            assert_eq!(
                d.properties.message_id().as_ref().map(|s| s.as_str()),
                Some(key.as_str())
            );
            assert_eq!(*d.properties.delivery_mode(), Some(2), "persistent");
            assert_eq!(
                d.properties.content_type().as_ref().map(|s| s.as_str()),
                Some("application/json")
            );
            assert_eq!(header(d, "idempotency-key").as_deref(), Some(key.as_str()));
            assert_eq!(header(d, "oncebox-attempt").as_deref(), Some("1"));
            let fence = header(d, "oncebox-fencing-token").and_then(|v| v.parse::<i64>().ok());
            assert!(fence.is_some_and(|f| f > 0), "{fence:?}");
            assert_eq!(d.data, format!(r#"{{"id":"{id}"}}"#).into_bytes());
        }
        assert_eq!(relay.run_once().await.unwrap().claimed, 0, "not again");
        rabbit.drop_all().await;
    });
}

/// Publishes in flight together where only some are routable (a headers exchange binding only
/// every other key): each unroutable one is returned to its own publish. On one shared channel
/// lapin handed a return to whichever confirm completed next, and an unroutable message could
/// be recorded delivered while a routed one was retried.
#[test]
fn amqp_returns_reach_their_own_publish_among_many_in_flight() {
    const EVENTS: usize = 64;
    run(async {
        let Some(rabbit) = Rabbit::new(FieldTable::default()).await else {
            return;
        };
        let by_key = unique("hx");
        rabbit
            .channel
            .exchange_declare(
                by_key.as_str().into(),
                ExchangeKind::Headers,
                ExchangeDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        let mut binding = FieldTable::default();
        binding.insert("x-match".into(), AMQPValue::LongString("any".into()));
        let ids: Vec<String> = (0..EVENTS).map(|i| format!("evt_{i:02}")).collect();
        let routable = |id: &String| id.ends_with(['0', '2', '4', '6', '8']);
        for id in ids.iter().filter(|id| routable(id)) {
            // One binding per routable key: each names it as the only argument to match.
            let mut one = binding.clone();
            one.insert(
                "idempotency-key".into(),
                AMQPValue::LongString(format!("shop:{id}").into()),
            );
            rabbit
                .channel
                .queue_bind(
                    rabbit.queue.as_str().into(),
                    by_key.as_str().into(),
                    "".into(),
                    QueueBindOptions::default(),
                    one,
                )
                .await
                .unwrap();
        }
        let w = World::new();
        for id in &ids {
            w.accept(id, &["rabbit"]).await;
        }
        let url = with_query(
            &rabbit.base,
            &[("exchange", &by_key), ("routing_key", "any")],
        );
        let mut route = broker_route("rabbit", &url, false);
        route.concurrency = 32;
        let relay = w.relay(vec![route]);
        let out = relay.run_once().await.unwrap();
        assert_eq!(out.claimed, EVENTS, "{out:?}");
        let mut delivered = Vec::new();
        for id in &ids {
            if w.delivery(id).await.state == DeliveryState::Delivered {
                delivered.push(id.clone());
            }
        }
        let expected: Vec<String> = ids.iter().filter(|id| routable(id)).cloned().collect();
        assert_eq!(delivered, expected, "delivered exactly the routable ones");
        let mut stored: Vec<String> = rabbit
            .take()
            .await
            .iter()
            .filter_map(|d| header(d, "idempotency-key"))
            .map(|k| k.trim_start_matches("shop:").to_owned())
            .collect();
        stored.sort();
        assert_eq!(stored, expected, "each delivered one is in the queue");
        rabbit
            .channel
            .exchange_delete(by_key.as_str().into(), ExchangeDeleteOptions::default())
            .await
            .unwrap();
        rabbit.drop_all().await;
    });
}

#[test]
fn amqp_unroutable_publish_is_returned_and_retried_never_delivered() {
    run(async {
        // No queue bound: the exchange exists but routes nowhere.
        let Some(rabbit) = Rabbit::new(FieldTable::default()).await else {
            return;
        };
        let w = World::new();
        w.accept("evt_u", &["rabbit"]).await;
        let relay = w.relay(vec![broker_route("rabbit", &rabbit.url(None), false)]);
        let out = relay.run_once().await.unwrap();
        assert_eq!((out.delivered, out.retrying), (0, 1), "{out:?}");
        let d = w.delivery("evt_u").await;
        assert_eq!(d.state, DeliveryState::Retrying);
        let error = d.last_error.unwrap_or_default();
        assert!(error.contains("NO_ROUTE"), "{error}");
        // A consumer binds its queue later: the retry reaches it, with the same key.
        rabbit.bind().await;
        w.clock.advance(Duration::from_secs(3600));
        assert_eq!(relay.run_once().await.unwrap().delivered, 1);
        let got = rabbit.take().await;
        assert_eq!(got.len(), 1);
        assert_eq!(header(&got[0], "oncebox-attempt").as_deref(), Some("2"));
        rabbit.drop_all().await;
    });
}

/// A nack says a queue refused the message, not that none took it: routed to two queues, one
/// full and rejecting, the message is nacked and yet stored in the other. So it is no answer:
/// uncertain on a route that ignores the key, retried on one that honours it, never delivered.
#[test]
fn amqp_nacked_publish_may_be_stored_elsewhere_so_it_is_no_answer() {
    run(async {
        let Some(rabbit) = Rabbit::new(FieldTable::default()).await else {
            return;
        };
        rabbit.bind().await;
        // A second queue on the same routing key that takes nothing and rejects rather than
        // drops: every publish to the exchange is nacked.
        let full = unique("full");
        let mut args = FieldTable::default();
        args.insert("x-max-length".into(), AMQPValue::LongInt(0));
        args.insert(
            "x-overflow".into(),
            AMQPValue::LongString("reject-publish".into()),
        );
        args.insert("x-expires".into(), AMQPValue::LongInt(300_000));
        let ch = &rabbit.channel;
        ch.queue_declare(full.as_str().into(), QueueDeclareOptions::default(), args)
            .await
            .unwrap();
        let bind = QueueBindOptions::default();
        let (ex, no_args) = (rabbit.exchange.as_str(), FieldTable::default());
        ch.queue_bind(
            full.as_str().into(),
            ex.into(),
            "paid".into(),
            bind,
            no_args,
        )
        .await
        .unwrap();
        let w = World::new();
        for (id, idempotent, want) in [
            ("evt_plain", false, DeliveryState::Uncertain),
            ("evt_idem", true, DeliveryState::Retrying),
        ] {
            w.accept(id, &[id]).await;
            let relay = w.relay(vec![broker_route(id, &rabbit.url(None), idempotent)]);
            let out = relay.run_once().await.unwrap();
            assert_eq!(out.delivered, 0, "{id}: {out:?}");
            let d = w.delivery(id).await;
            assert_eq!(d.state, want, "{id}");
            assert!(d.last_error.unwrap_or_default().contains("nack"), "{id}");
            assert_eq!(
                rabbit.take().await.len(),
                1,
                "{id}: the other queue took it"
            );
        }
        ch.queue_delete(full.as_str().into(), QueueDeleteOptions::default())
            .await
            .unwrap();
        rabbit.drop_all().await;
    });
}

#[test]
fn amqp_missing_exchange_is_not_sent_and_retried() {
    run(async {
        let Some(base) = service_url("ONCEBOX_AMQP_URL") else {
            return;
        };
        let url = with_query(
            &base,
            &[("exchange", &unique("absent")), ("routing_key", "k")],
        );
        refused_publish_is_retried(&url, "NOT_FOUND").await;
    });
}

#[test]
fn amqp_broker_down_is_retried_never_delivered() {
    run(async {
        let url = format!(
            "amqp://guest:guest@{}/%2f?exchange=orders&routing_key=k",
            closed_port()
        );
        broker_down_is_retried(&url).await;
    });
}

#[test]
fn amqp_connection_lost_before_the_confirm_is_unknown_uncertain_or_retried_by_the_route() {
    run(async {
        let Some(rabbit) = Rabbit::new(FieldTable::default()).await else {
            return;
        };
        rabbit.bind().await;
        let upstream = upstream(&rabbit.base, 5672).await;
        let w = World::new();
        for (id, idempotent, want) in [
            ("evt_plain", false, DeliveryState::Uncertain),
            ("evt_idem", true, DeliveryState::Retrying),
        ] {
            let route = |proxy| {
                broker_route(
                    &format!("rabbit-{id}"),
                    &rabbit.url(Some(proxy)),
                    idempotent,
                )
            };
            let relay = cut_before_the_confirm(&w, upstream, id, route, want).await;
            assert_eq!(
                rabbit.take().await.len(),
                1,
                "{id}: the broker did store it"
            );
            if idempotent {
                // The same relay opens a new connection (the network healed) and publishes
                // again with the same key; consumers deduplicate on message_id.
                w.clock.advance(Duration::from_secs(3600));
                assert_eq!(relay.run_once().await.unwrap().delivered, 1);
                let again = rabbit.take().await;
                assert_eq!(again.len(), 1);
                assert_eq!(
                    again[0]
                        .properties
                        .message_id()
                        .as_ref()
                        .map(|s| s.as_str()),
                    Some("shop:evt_idem")
                );
            } else {
                w.clock.advance(Duration::from_secs(24 * 3600));
                assert_eq!(relay.run_once().await.unwrap().claimed, 0, "parked");
            }
        }
        rabbit.drop_all().await;
    });
}
