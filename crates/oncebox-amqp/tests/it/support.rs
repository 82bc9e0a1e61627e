//! The test world: a unique queue and quarantine on the broker (deleted at the end, and set to
//! expire if a test dies first) next to the testkit's SQLite store, whose handler records one
//! effect row per key and gives the figures D, L and F.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions,
    ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use oncebox_amqp::{ConsumeError, Consumer, ConsumerOptions};
use oncebox_core::Source;
use oncebox_core::consume::{Apply, KeyRule, MessageRules, RetryPolicy};
use oncebox_sqlite::Options;
use oncebox_testkit::consume::{Running, SOURCE, Store};

/// One test's broker objects and database.
pub struct World {
    pub conn: Connection,
    pub channel: Channel,
    pub queue: String,
    pub quarantine_exchange: String,
    pub quarantine_queue: String,
    /// Where the consumed queue dead-letters what its delivery limit drops (quorum queues).
    pub dead_queue: String,
    pub db: Store,
}

/// Unused test queues vanish after ten minutes even if the test died before deleting them.
fn expiring() -> FieldTable {
    let mut args = FieldTable::default();
    args.insert("x-expires".into(), AMQPValue::LongInt(600_000));
    args
}

impl World {
    pub async fn new(url: &str) -> World {
        World::with_options(url, Options::new).await
    }

    pub async fn with_options(url: &str, options: impl FnOnce(PathBuf) -> Options) -> World {
        World::build(url, options, None).await
    }

    /// A world whose consumed queue is a quorum queue that drops a message after
    /// `delivery_limit` returns to the queue, dead-lettering it to `dead_queue`.
    pub async fn quorum(
        url: &str,
        options: impl FnOnce(PathBuf) -> Options,
        delivery_limit: i32,
    ) -> World {
        World::build(url, options, Some(delivery_limit)).await
    }

    async fn build(
        url: &str,
        options: impl FnOnce(PathBuf) -> Options,
        quorum: Option<i32>,
    ) -> World {
        let conn = connect(url).await;
        let channel = conn.create_channel().await.unwrap();
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        let id = uuid::Uuid::new_v4().simple().to_string();
        let queue = format!("oncebox-test-{id}");
        let quarantine_exchange = format!("oncebox-test-quarantine-{id}");
        let quarantine_queue = format!("oncebox-test-quarantined-{id}");
        let dead_queue = format!("oncebox-test-dead-{id}");
        if let Some(limit) = quorum {
            let mut args = expiring();
            args.insert(
                "x-queue-type".into(),
                AMQPValue::LongString("quorum".into()),
            );
            args.insert("x-delivery-limit".into(), AMQPValue::LongInt(limit));
            args.insert(
                "x-dead-letter-exchange".into(),
                AMQPValue::LongString("".into()),
            );
            let dead = AMQPValue::LongString(dead_queue.as_str().into());
            args.insert("x-dead-letter-routing-key".into(), dead);
            let durable = QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            };
            channel
                .queue_declare(queue.as_str().into(), durable, args)
                .await
                .unwrap();
        }
        let classic = if quorum.is_some() {
            vec![&quarantine_queue, &dead_queue]
        } else {
            vec![&queue, &quarantine_queue, &dead_queue]
        };
        for q in classic {
            channel
                .queue_declare(
                    q.as_str().into(),
                    QueueDeclareOptions::default(),
                    expiring(),
                )
                .await
                .unwrap();
        }
        let w = World {
            conn,
            channel,
            queue,
            quarantine_exchange,
            quarantine_queue,
            dead_queue,
            db: Store::open(options).await,
        };
        w.declare_quarantine().await;
        w
    }

    /// Declares the quarantine exchange and binds the quarantine queue to it.
    pub async fn declare_quarantine(&self) {
        let exchange = self.quarantine_exchange.as_str();
        let auto_delete = ExchangeDeclareOptions {
            auto_delete: true,
            ..ExchangeDeclareOptions::default()
        };
        let fanout = ExchangeKind::Fanout;
        self.channel
            .exchange_declare(exchange.into(), fanout, auto_delete, FieldTable::default())
            .await
            .unwrap();
        self.channel
            .queue_bind(
                self.quarantine_queue.as_str().into(),
                exchange.into(),
                "".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
    }

    /// Leaves the quarantine routing nowhere: its queue unbound, and the exchange (auto-delete,
    /// so it would go with its last binding) kept by a binding to a sink exchange that no queue
    /// is bound to. Returns the sink, for [`World::route_quarantine_again`].
    pub async fn unroute_quarantine(&self) -> String {
        let (q, x) = (
            self.quarantine_queue.as_str(),
            self.quarantine_exchange.as_str(),
        );
        let sink = format!("{x}-sink");
        let none = FieldTable::default;
        let made = self.channel.exchange_declare(
            sink.as_str().into(),
            ExchangeKind::Fanout,
            ExchangeDeclareOptions::default(),
            none(),
        );
        made.await.unwrap();
        let to_sink = self.channel.exchange_bind(
            sink.as_str().into(),
            x.into(),
            "".into(),
            Default::default(),
            none(),
        );
        to_sink.await.unwrap();
        let unbind = self
            .channel
            .queue_unbind(q.into(), x.into(), "".into(), none());
        unbind.await.unwrap();
        sink
    }

    /// Routes the quarantine to its queue again and removes `sink`.
    pub async fn route_quarantine_again(&self, sink: &str) {
        self.declare_quarantine().await;
        let gone = self
            .channel
            .exchange_delete(sink.into(), Default::default());
        gone.await.unwrap();
    }

    pub fn options(&self) -> ConsumerOptions {
        let rules = MessageRules::new(Source::new(SOURCE).unwrap(), KeyRule::MessageId);
        let mut o = ConsumerOptions::new(&self.queue, rules, &self.quarantine_exchange);
        o.retry = RetryPolicy {
            delay: Duration::from_millis(20),
            uncertain_delay: Duration::from_millis(20),
            max_attempts: 3,
        };
        o
    }

    /// Publishes with the message id `id` (none if `None`) and waits for the broker's confirm.
    pub async fn publish(&self, id: Option<&str>, body: &str) {
        self.publish_with(id, body, BasicProperties::default())
            .await;
    }

    /// As [`World::publish`], over `props`.
    pub async fn publish_with(&self, id: Option<&str>, body: &str, props: BasicProperties) {
        let mut props = props.with_content_type("application/json".into());
        if let Some(id) = id {
            props = props.with_message_id(id.into());
        }
        let confirm = self
            .channel
            .basic_publish(
                "".into(),
                self.queue.as_str().into(),
                BasicPublishOptions::default(),
                body.as_bytes(),
                props,
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(confirm.is_ack());
    }

    /// Messages ready in `queue` (not counting those delivered and unacknowledged).
    pub async fn ready(&self, queue: &str) -> u32 {
        let q = self
            .channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        q.message_count()
    }

    /// Waits until `queue` holds exactly `n` ready messages (the broker requeues a closed
    /// channel's messages asynchronously).
    pub async fn wait_ready(&self, queue: &str, n: u32) {
        let mut last = 0;
        for _ in 0..500 {
            last = self.ready(queue).await;
            if last == n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{queue}: {last} ready messages, expected {n}");
    }

    /// The quarantined messages' reason headers, taking them off the quarantine queue.
    pub async fn quarantined(&self) -> Vec<(String, Vec<u8>)> {
        let mut out = Vec::new();
        while let Some(m) = self
            .channel
            .basic_get(
                self.quarantine_queue.as_str().into(),
                BasicGetOptions { no_ack: true },
            )
            .await
            .unwrap()
        {
            let headers = m.delivery.properties.headers().clone().unwrap_or_default();
            let reason = match headers.inner().get("x-oncebox-reason") {
                Some(AMQPValue::LongString(s)) => {
                    String::from_utf8_lossy(s.as_bytes()).into_owned()
                }
                other => panic!("quarantined without a reason: {other:?}"),
            };
            out.push((reason, m.delivery.data.clone()));
        }
        out.sort();
        out
    }

    /// Waits for `consumer` to quarantine a message, stops it (cleanly: its connection still
    /// open), checks the message was settled once and quarantined, not requeued, and returns the
    /// one quarantined copy's headers.
    pub async fn only_copy(&self, mut consumer: Running<ConsumeError>) -> BTreeMap<String, String> {
        consumer.wait(|c| c.quarantined >= 1, self.state()).await;
        let done = consumer.stop().await;
        self.wait_ready(&self.queue, 0).await;
        assert_eq!((done.quarantined, done.requeued, done.acked), (1, 0, 1));
        let mut copies = self.quarantined_headers().await;
        assert_eq!(copies.len(), 1);
        copies.remove(0)
    }

    /// The quarantined messages' headers as text (other values left out), in queue order,
    /// taking them off the quarantine queue.
    pub async fn quarantined_headers(&self) -> Vec<BTreeMap<String, String>> {
        let mut out = Vec::new();
        let queue = self.quarantine_queue.as_str();
        let get = BasicGetOptions { no_ack: true };
        while let Some(m) = self.channel.basic_get(queue.into(), get).await.unwrap() {
            let headers = m.delivery.properties.headers().clone().unwrap_or_default();
            let text = headers.inner().iter().filter_map(|(k, v)| match v {
                AMQPValue::LongString(s) => {
                    Some((k.to_string(), String::from_utf8_lossy(s.as_bytes()).into()))
                }
                _ => None,
            });
            out.push(text.collect());
        }
        out
    }

    /// What the broker says about the test's queue, for a test that is stuck.
    pub async fn state(&self) -> String {
        format!("{} ready in {}", self.ready(&self.queue).await, self.queue)
    }

    pub async fn cleanup(self) {
        for q in [&self.queue, &self.quarantine_queue, &self.dead_queue] {
            let _ = self
                .channel
                .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
        let _ = self
            .channel
            .exchange_delete(
                self.quarantine_exchange.as_str().into(),
                ExchangeDeleteOptions::default(),
            )
            .await;
        let _ = self.conn.close(200, "done".into()).await;
    }
}

pub async fn connect(url: &str) -> Connection {
    Connection::connect(url, ConnectionProperties::default())
        .await
        .unwrap()
}

/// Runs `consumer` on its own connection until stopped.
pub fn start<A: Apply>(url: &str, consumer: Consumer<A>) -> Running<ConsumeError> {
    let url = url.to_owned();
    Running::spawn(consumer.counts(), move |stopped| async move {
        let conn = connect(&url).await;
        let out = consumer
            .run(&conn, async move {
                let _ = stopped.await;
            })
            .await;
        let _ = conn.close(200, "done".into()).await;
        out
    })
}
