//! The quarantine when it goes wrong: an exchange missing at start (refused there) or deleted
//! while the consumer runs (the broker closes the publishing channel), an original with a per-message TTL and routing headers, a
//! configuration that would send every copy back into the consumed queue (refused at start),
//! a quarantine exchange the consumed queue is also bound to (the copy held, not sent round
//! again), a key header of the wrong type (invalid, not missing), and an original whose
//! headers leave its copy no room in one frame.

use std::time::{Duration, Instant};

use lapin::options::{BasicGetOptions, ExchangeDeleteOptions, QueueBindOptions};
use lapin::types::{AMQPValue, FieldArray, FieldTable};
use lapin::{BasicProperties, Connection};
use oncebox_amqp::{ConsumeError, Consumer, HEADERS_DROPPED, ORIGIN_HEADERS, OptionsError};
use oncebox_core::consume::{Apply, KeyRule};
use oncebox_testkit::{run, service_url};

use crate::support::{World, connect, start};

#[test]
fn quarantine_exchange_declared_after_a_refused_publish_receives_the_message() {
    let Some(url) = service_url("ONCEBOX_AMQP_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        let mut consumer = start(&url, Consumer::new(w.db.checked(), w.options()));
        // Past its start, which checks that the exchange exists.
        w.publish(Some("evt_ok"), r#"{"amount":1}"#).await;
        consumer.wait(|c| c.applied >= 1, w.state()).await;
        let exchange = w.quarantine_exchange.as_str().into();
        let gone = ExchangeDeleteOptions::default();
        w.channel.exchange_delete(exchange, gone).await.unwrap();
        w.publish(None, r#"{"amount":1}"#).await;
        // Two publishes to the missing exchange refused (each 404 closes the channel).
        let refused = consumer.wait(|c| c.requeued >= 2, w.state()).await;
        w.declare_quarantine().await;
        consumer.wait(|c| c.quarantined >= 1, w.state()).await;
        let done = consumer.stop().await;
        w.wait_ready(&w.queue, 0).await;

        let reasons: Vec<String> = w.quarantined().await.into_iter().map(|(r, _)| r).collect();
        eprintln!(
            "amqp quarantine exchange declared late: requeued {} while it was missing, then quarantined {} ({reasons:?})",
            refused.requeued, done.quarantined
        );
        assert_eq!(
            (refused.quarantined, refused.acked),
            (0, 1),
            "only the good one acked"
        );
        assert_eq!(reasons, ["event-id-missing"]);
        assert_eq!((done.quarantined, done.acked), (1, 2));
        w.cleanup().await;
    });
}

/// A quarantine exchange missing when the consumer starts is refused there, as NATS refuses a
/// subject no stream stores: nothing is consumed, rather than every poison message requeued
/// without end.
#[test]
fn a_missing_quarantine_exchange_is_refused_at_start() {
    let Some(url) = service_url("ONCEBOX_AMQP_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        w.publish(None, r#"{"amount":1}"#).await;
        let exchange = w.quarantine_exchange.as_str().into();
        let gone = ExchangeDeleteOptions::default();
        w.channel.exchange_delete(exchange, gone).await.unwrap();
        let consumer = Consumer::new(w.db.checked(), w.options());
        let (ended, conn) = refused_at_start(&url, &consumer).await;
        eprintln!("amqp quarantine exchange missing at start: {ended:?}");
        assert!(matches!(
            ended,
            Err(ConsumeError::QuarantineMissing(ref x)) if *x == w.quarantine_exchange
        ));
        assert_eq!(*consumer.counts().borrow(), Default::default());
        w.wait_ready(&w.queue, 1).await;
        // Declared, the next start consumes and quarantines.
        w.declare_quarantine().await;
        let mut consumer = start(&url, Consumer::new(w.db.checked(), w.options()));
        consumer.wait(|c| c.quarantined >= 1, w.state()).await;
        consumer.stop().await;
        let _ = conn.close(200, "done".into()).await;
        w.cleanup().await;
    });
}

/// What `consumer` ends with, run with no stop: it must end by itself within 10 s, refused.
async fn refused_at_start<A: Apply>(
    url: &str,
    consumer: &Consumer<A>,
) -> (Result<(), ConsumeError>, Connection) {
    let conn: Connection = connect(url).await;
    let ended = tokio::time::timeout(
        Duration::from_secs(10),
        consumer.run(&conn, std::future::pending()),
    )
    .await
    .expect("refused at start instead of consuming");
    (ended, conn)
}

#[test]
fn quarantined_copy_outlives_the_originals_ttl_and_drops_its_routing_headers() {
    let Some(url) = service_url("ONCEBOX_AMQP_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        let mut consumer = start(&url, Consumer::new(w.db.checked(), w.options()));
        // The consumer is subscribed before the message that expires in 100 ms is published.
        w.publish(Some("evt_ready"), r#"{"amount":1}"#).await;
        consumer.wait(|c| c.applied >= 1, w.state()).await;
        let mut headers = FieldTable::default();
        let elsewhere = AMQPValue::LongString("oncebox-test-nowhere".into());
        let cc = AMQPValue::FieldArray(FieldArray::from(vec![elsewhere]));
        headers.insert("CC".into(), cc);
        let props = BasicProperties::default()
            .with_expiration("100".into())
            .with_headers(headers);
        w.publish_with(None, r#"{"amount":1}"#, props).await;
        consumer.wait(|c| c.quarantined >= 1, w.state()).await;
        consumer.stop().await;

        // Measured, not a barrier: the copy is still there ten times the original's TTL later.
        let since = Instant::now();
        while since.elapsed() < Duration::from_secs(1) {
            let kept = w.ready(&w.quarantine_queue).await;
            assert_eq!(kept, 1, "copy gone after {:?}", since.elapsed());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let get = BasicGetOptions { no_ack: true };
        let queue = w.quarantine_queue.as_str().into();
        let copy = w.channel.basic_get(queue, get).await.unwrap().unwrap();
        let props = &copy.delivery.properties;
        let headers = props.headers().clone().unwrap_or_default();
        eprintln!(
            "amqp quarantined copy: kept {:?} past an expiration of 100 ms; expiration {:?}, CC {:?}",
            since.elapsed(),
            props.expiration(),
            headers.inner().get("CC")
        );
        assert_eq!(props.expiration(), &None);
        assert!(!headers.contains_key("CC"));
        assert!(headers.contains_key("x-oncebox-reason"));
        w.cleanup().await;
    });
}

#[test]
fn quarantine_into_the_consumed_queue_is_refused_at_start() {
    let Some(url) = service_url("ONCEBOX_AMQP_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        w.publish(None, r#"{"amount":1}"#).await;
        let mut options = w.options();
        // The default exchange, and the routing key is the queue's own name.
        options.quarantine.exchange = String::new();
        let consumer = Consumer::new(w.db.checked(), options);
        let (ended, conn) = refused_at_start(&url, &consumer).await;
        eprintln!("amqp quarantine into the consumed queue: {ended:?}");
        assert!(matches!(
            ended,
            Err(ConsumeError::Options(OptionsError::QuarantineIsTheQueue(ref q))) if *q == w.queue
        ));
        assert_eq!(*consumer.counts().borrow(), Default::default());
        w.wait_ready(&w.queue, 1).await;
        let _ = conn.close(200, "done".into()).await;
        w.cleanup().await;
    });
}

/// A quarantine exchange that also routes into the consumed queue (the queue bound to it, as
/// to a producers' fanout or a topic with `#`): the copy comes back. It is not quarantined
/// again, which would send it round for ever at full speed, but held and requeued, loudly.
#[test]
fn a_copy_the_quarantine_routes_back_is_not_quarantined_again() {
    let Some(url) = service_url("ONCEBOX_AMQP_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        w.channel
            .queue_bind(
                w.queue.as_str().into(),
                w.quarantine_exchange.as_str().into(),
                "".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        let mut consumer = start(&url, Consumer::new(w.db.checked(), w.options()));
        // No message id: refused as event-id-missing, quarantined.
        w.publish(None, r#"{"amount":1}"#).await;
        consumer.wait(|c| c.quarantined >= 1, w.state()).await;
        // The copy came back into the queue and was held three times instead.
        let held = consumer.wait(|c| c.requeued >= 3, w.state()).await;
        let done = consumer.stop().await;
        eprintln!(
            "amqp quarantine routing back: quarantined {}, then the copy requeued {} times",
            done.quarantined, done.requeued
        );
        assert_eq!(held.quarantined, 1, "the original only");
        assert_eq!(done.quarantined, 1);
        assert_eq!(w.ready(&w.quarantine_queue).await, 1, "one copy kept");
        w.wait_ready(&w.queue, 1).await;
        w.cleanup().await;
    });
}

/// A copy an operator sends back to the queue (through the exchange the original came by,
/// as the copy's headers say) while its cause remains is quarantined again: it carries the
/// headers of a copy quarantined here, but did not come round through the quarantine.
#[test]
fn a_copy_sent_back_by_an_operator_is_quarantined_again() {
    sent_back_by_an_operator(false);
}

/// The same with the quarantine on the default exchange (`""`, by the quarantine queue's name),
/// by which the copy is sent back too: the exchanges match, yet nothing came round.
#[test]
fn a_copy_sent_back_by_the_default_exchange_is_quarantined_again() {
    sent_back_by_an_operator(true);
}

fn sent_back_by_an_operator(default_exchange: bool) {
    let Some(url) = service_url("ONCEBOX_AMQP_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        let mut options = w.options();
        if default_exchange {
            options.quarantine.exchange = String::new();
            options.quarantine.routing_key = w.quarantine_queue.clone();
        }
        let mut headers = FieldTable::default();
        for (name, value) in [
            ("x-oncebox-queue", w.queue.as_str()),
            ("x-oncebox-reason", "event-id-missing"),
        ] {
            headers.insert(name.into(), AMQPValue::LongString(value.into()));
        }
        let props = BasicProperties::default().with_headers(headers);
        w.publish_with(None, r#"{"amount":1}"#, props).await;
        let mut consumer = start(&url, Consumer::new(w.db.checked(), options));
        consumer.wait(|c| c.quarantined >= 1, w.state()).await;
        let done = consumer.stop().await;
        assert_eq!((done.quarantined, done.requeued), (1, 0));
        assert_eq!(w.ready(&w.quarantine_queue).await, 1);
        assert_eq!(w.ready(&w.queue).await, 0);
        w.cleanup().await;
    });
}

/// Copies quarantined side by side where only some are routable (a headers exchange keeping
/// the copies of one kind of original: RabbitMQ matches no `x-` header, so not by reason):
/// each unroutable copy's return reaches its own publish, and its original is requeued, never
/// acknowledged with no copy kept. Fewer returned originals than the prefetch, so that they
/// never fill it. (The relay's `amqp_returns_reach_their_own_publish_among_many_in_flight`
/// reproduces lapin giving a return to another publish's confirm on a shared channel; here,
/// with the copies published as deliveries arrive, the unserialized publishes did not show it
/// in six runs.)
#[test]
fn an_unroutable_copy_among_many_in_flight_keeps_its_original() {
    const EACH: u32 = 48;
    let Some(url) = service_url("ONCEBOX_AMQP_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        let by_reason = format!("{}-by-reason", w.quarantine_exchange);
        let declare = lapin::options::ExchangeDeclareOptions {
            auto_delete: true,
            ..Default::default()
        };
        let kind = lapin::ExchangeKind::Headers;
        let none = FieldTable::default();
        w.channel
            .exchange_declare(by_reason.as_str().into(), kind, declare, none)
            .await
            .unwrap();
        let mut binding = FieldTable::default();
        binding.insert("x-match".into(), AMQPValue::LongString("any".into()));
        binding.insert("kind".into(), AMQPValue::LongString("kept".into()));
        let (queue, exchange) = (w.quarantine_queue.as_str(), by_reason.as_str());
        let bind = QueueBindOptions::default();
        w.channel
            .queue_bind(queue.into(), exchange.into(), "".into(), bind, binding)
            .await
            .unwrap();
        // Interleaved poison messages (no id), whose copies keep their `kind` header.
        for _ in 0..EACH {
            for kind in ["kept", "dropped"] {
                let mut headers = FieldTable::default();
                headers.insert("kind".into(), AMQPValue::LongString(kind.into()));
                let props = BasicProperties::default().with_headers(headers);
                w.publish_with(None, r#"{"amount":1}"#, props).await;
            }
        }
        let mut options = w.options();
        options.quarantine.exchange = by_reason.clone();
        let mut consumer = start(&url, Consumer::new(w.db.checked(), options));
        consumer
            .wait(|c| c.quarantined >= u64::from(EACH), w.state())
            .await;
        let done = consumer.stop().await;
        assert_eq!(done.quarantined, u64::from(EACH), "{done:?}");
        assert_eq!(
            w.ready(&w.quarantine_queue).await,
            EACH,
            "only routed copies"
        );
        w.wait_ready(&w.queue, EACH).await;
        w.cleanup().await;
    });
}

/// A key header of a type no id can have (here a double) is there, only wrong: the key is
/// invalid, not missing, and the detail names the type.
#[test]
fn a_key_header_of_another_type_is_quarantined_as_invalid() {
    let Some(url) = service_url("ONCEBOX_AMQP_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        let mut options = w.options();
        options.rules.key = KeyRule::Header("x-event-id".into());
        let mut headers = FieldTable::default();
        headers.insert("x-event-id".into(), AMQPValue::Double(42.0));
        let props = BasicProperties::default().with_headers(headers);
        w.publish_with(None, r#"{"amount":1}"#, props).await;
        let mut consumer = start(&url, Consumer::new(w.db.checked(), options));
        consumer.wait(|c| c.quarantined >= 1, w.state()).await;
        let done = consumer.stop().await;

        assert_eq!((done.quarantined, done.applied), (1, 0));
        let copies = w.quarantined_headers().await;
        assert_eq!(copies.len(), 1);
        assert_eq!(copies[0]["x-oncebox-reason"], "event-id-invalid");
        let detail = &copies[0]["x-oncebox-detail"];
        assert_eq!(
            detail,
            "header x-event-id is a double, not text or an integer"
        );
        // Where the original was published (the default exchange, the queue's name as the
        // routing key), so that an operator can send the copy back there.
        let origin = ORIGIN_HEADERS.map(|h| copies[0].get(h).map(String::as_str));
        assert_eq!(origin, [Some(""), Some(w.queue.as_str())]);
        w.cleanup().await;
    });
}

/// An original whose properties nearly fill RabbitMQ's `frame_max` (128 KiB): its copy, with
/// the reason's headers added, did not fit one frame, and the broker closed the connection at
/// every try, the message back in the queue each time. The copy leaves the original headers
/// out and says so.
#[test]
fn a_poison_message_with_headers_near_frame_max_is_quarantined_without_them() {
    let Some(url) = service_url("ONCEBOX_AMQP_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        let mut headers = FieldTable::default();
        let big = AMQPValue::LongString("b".repeat(130_950).into());
        headers.insert("x-big".into(), big);
        let props = BasicProperties::default().with_headers(headers);
        // No message id: event-id-missing.
        w.publish_with(None, r#"{"amount":1}"#, props).await;
        let consumer = start(&url, Consumer::new(w.db.checked(), w.options()));
        let copy = w.only_copy(consumer).await;
        assert_eq!(copy["x-oncebox-reason"], "event-id-missing");
        assert!(!copy.contains_key("x-big"));
        let dropped: usize = copy[HEADERS_DROPPED].parse().unwrap();
        assert!(dropped > 130_950, "{dropped}");
        w.cleanup().await;
    });
}
