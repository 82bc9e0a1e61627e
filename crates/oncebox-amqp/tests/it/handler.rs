//! Handlers that fail or panic: a panic counts as a failure (the delivery is settled, not left
//! holding its prefetch slot), and only handler failures count towards `max_attempts`, not the
//! requeues a quorum queue also counts in `x-delivery-count`, nor a count its producer wrote; a
//! failure's error of any size is quarantined, its text cut.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use oncebox_amqp::Consumer;
use oncebox_core::consume::{MAX_DETAIL, from_fn};
use oncebox_core::{Event, ProcessError, Processed, Response};
use oncebox_sqlite::Options;
use oncebox_testkit::{run, service_url};

use crate::support::{World, start};

fn applied() -> Result<Processed, ProcessError> {
    Ok(Processed::Applied(Response::completed("ok")))
}

/// A quarantine the broker could not route (no queue bound to the exchange) is requeued, and
/// the key's failures counted so far still count: the next failure quarantines again at once.
/// Forgotten with the unroutable copy, the handler ran `max_attempts` more times per try.
#[test]
fn a_failure_count_outlives_a_quarantine_the_broker_could_not_route() {
    let Some(url) = service_url("ONCEBOX_AMQP_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        let sink = w.unroute_quarantine().await;
        let runs = Arc::new(AtomicU64::new(0));
        // The third run waits until the quarantine routes again, so that it is the one tried.
        let rebound = Arc::new(tokio::sync::Semaphore::new(0));
        let apply = from_fn({
            let (runs, rebound) = (runs.clone(), rebound.clone());
            move |_: Event, _| {
                let (runs, rebound) = (runs.clone(), rebound.clone());
                async move {
                    if runs.fetch_add(1, Ordering::SeqCst) == 2 {
                        let _ = rebound.acquire().await;
                    }
                    Err(ProcessError::Handler("fails for good".into()))
                }
            }
        });
        let mut options = w.options();
        options.retry.max_attempts = 2;
        let mut consumer = start(&url, Consumer::new(apply, options));
        w.publish(Some("evt_fails"), r#"{"amount":1}"#).await;
        // The first failure requeued; the second's quarantine unroutable, requeued too.
        let unroutable = consumer.wait(|c| c.requeued >= 2, w.state()).await;
        assert_eq!(unroutable.quarantined, 0, "{unroutable:?}");
        w.route_quarantine_again(&sink).await;
        rebound.add_permits(1);
        let done = consumer.wait(|c| c.quarantined >= 1, w.state()).await;
        consumer.stop().await;
        assert_eq!(
            runs.load(Ordering::SeqCst),
            3,
            "the handler ran again from a first attempt after the unroutable copy ({done:?})"
        );
        assert_eq!(w.quarantined().await.len(), 1);
        w.cleanup().await;
    });
}

#[test]
fn panicking_handler_is_quarantined_after_max_attempts_and_the_next_message_runs() {
    let Some(url) = service_url("ONCEBOX_AMQP_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        let panics = Arc::new(AtomicU64::new(0));
        let seen = panics.clone();
        let apply = from_fn(move |event: Event, _| {
            let seen = seen.clone();
            async move {
                if event.key.event_id.as_str() == "evt_panic" {
                    seen.fetch_add(1, Ordering::SeqCst);
                    panic!("a handler bug");
                }
                applied()
            }
        });
        // One slot: a panic that left its delivery unsettled would stall everything behind it.
        let mut options = w.options();
        options.prefetch = 1;
        w.publish(Some("evt_panic"), r#"{"amount":1}"#).await;
        w.publish(Some("evt_after"), r#"{"amount":2}"#).await;
        let mut consumer = start(&url, Consumer::new(apply, options));
        consumer
            .wait(|c| c.quarantined >= 1 && c.applied >= 1, w.state())
            .await;
        let done = consumer.stop().await;
        w.wait_ready(&w.queue, 0).await;

        let quarantined = w.quarantined().await;
        let max = u64::from(w.options().retry.max_attempts);
        eprintln!(
            "amqp panicking handler: {} panics, requeued {}, quarantined {:?}, the next message applied {}",
            panics.load(Ordering::SeqCst),
            done.requeued,
            quarantined.iter().map(|(r, _)| r).collect::<Vec<_>>(),
            done.applied
        );
        assert_eq!(panics.load(Ordering::SeqCst), max);
        assert_eq!(
            (done.requeued, done.quarantined, done.applied),
            (max - 1, 1, 1)
        );
        assert_eq!(quarantined.len(), 1);
        assert_eq!(quarantined[0].0, "handler-failed");
        w.cleanup().await;
    });
}

#[test]
fn requeues_for_other_reasons_do_not_count_as_handler_failures_on_a_quorum_queue() {
    let Some(url) = service_url("ONCEBOX_AMQP_URL") else {
        return;
    };
    run(async move {
        // No delivery limit worth reaching: the broker's count is what matters here.
        let w = World::quorum(&url, Options::new, 100).await;
        let max = w.options().retry.max_attempts;
        let calls = Arc::new(AtomicU64::new(0));
        let counted = calls.clone();
        // Another worker holds the key for `max` deliveries (each a requeue the quorum queue
        // counts), then the handler fails once, then it succeeds.
        let apply = from_fn(move |_: Event, _| {
            let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                match n {
                    n if n <= u64::from(max) => Err(ProcessError::InProgress {
                        retry_after: Duration::ZERO,
                    }),
                    n if n == u64::from(max) + 1 => Err(ProcessError::Handler("transient".into())),
                    _ => applied(),
                }
            }
        });
        w.publish(Some("evt_leased"), r#"{"amount":1}"#).await;
        let mut consumer = start(&url, Consumer::new(apply, w.options()));
        consumer
            .wait(|c| c.applied + c.quarantined >= 1, w.state())
            .await;
        let done = consumer.stop().await;
        w.wait_ready(&w.queue, 0).await;

        eprintln!(
            "amqp quorum queue, {max} requeues for a held lease then one handler failure: requeued {}, quarantined {}, applied {} after {} calls",
            done.requeued,
            done.quarantined,
            done.applied,
            calls.load(Ordering::SeqCst)
        );
        assert_eq!(done.requeued, u64::from(max) + 1, "every requeue happened");
        assert_eq!((done.quarantined, done.applied), (0, 1));
        assert!(w.quarantined().await.is_empty());
        w.cleanup().await;
    });
}

/// A producer's own `x-delivery-count` (a classic queue passes it on) is not the broker's: the
/// first delivery's failure is its first, not its thousand-and-first, and it is retried.
#[test]
fn a_delivery_count_the_producer_wrote_is_not_taken_for_earlier_failures() {
    let Some(url) = service_url("ONCEBOX_AMQP_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        let calls = Arc::new(AtomicU64::new(0));
        let counted = calls.clone();
        let apply = from_fn(move |_: Event, _| {
            let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                match n {
                    1 => Err(ProcessError::Handler("transient".into())),
                    _ => applied(),
                }
            }
        });
        let mut headers = FieldTable::default();
        headers.insert("x-delivery-count".into(), AMQPValue::LongLongInt(1000));
        let props = BasicProperties::default().with_headers(headers);
        w.publish_with(Some("evt_counted"), r#"{"amount":1}"#, props)
            .await;
        let mut consumer = start(&url, Consumer::new(apply, w.options()));
        consumer
            .wait(|c| c.applied + c.quarantined >= 1, w.state())
            .await;
        let done = consumer.stop().await;
        w.wait_ready(&w.queue, 0).await;
        assert_eq!(
            (done.requeued, done.quarantined, done.applied),
            (1, 0, 1),
            "retried once, then applied"
        );
        assert!(w.quarantined().await.is_empty());
        w.cleanup().await;
    });
}

/// A handler's error of 200 KB: copied whole into the quarantined copy's headers, it made the
/// content header larger than RabbitMQ's `frame_max`, and the broker closed the connection at
/// every try, the message back in the queue each time. Cut, the copy is stored at once.
#[test]
fn a_handler_error_of_200_kb_is_quarantined_once_with_a_short_detail() {
    let Some(url) = service_url("ONCEBOX_AMQP_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        let apply =
            from_fn(|_: Event, _| async { Err(ProcessError::Handler("e".repeat(200_000).into())) });
        let mut options = w.options();
        options.retry.max_attempts = 1;
        w.publish(Some("evt_loud"), r#"{"amount":1}"#).await;
        let copy = w
            .only_copy(start(&url, Consumer::new(apply, options)))
            .await;
        assert_eq!(copy["x-oncebox-reason"], "handler-failed");
        let detail = &copy["x-oncebox-detail"];
        assert!(detail.len() <= MAX_DETAIL, "{} bytes", detail.len());
        assert!(detail.ends_with("[cut: 200032 bytes in all]"), "{detail}");
        w.cleanup().await;
    });
}
