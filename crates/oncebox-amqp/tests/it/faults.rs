//! Faults around the consumer: the database unavailable (another connection holds SQLite's
//! write lock), on a classic queue and on a quorum queue with a delivery limit, and processing
//! that outlasts the broker's `consumer_timeout` (on a node of its own) so the message is
//! delivered to a second consumer while the first is still applying it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use oncebox_amqp::Consumer;
use oncebox_core::consume::Counts;
use oncebox_testkit::child::until_async;
use oncebox_testkit::consume::{
    Checked, OUTAGE_MESSAGES, WriteLock, hold_next, ids, impatient, slow_effect,
};
use oncebox_testkit::rabbit::PrivateRabbit;
use oncebox_testkit::{run, service_url};
use tokio::sync::mpsc;

use crate::support::{World, start};

/// How long a wait for the consumer's tries may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(20);

#[test]
fn database_unavailable_acks_nothing_and_applies_everything_after_recovery() {
    let Some(url) = service_url("ONCEBOX_AMQP_URL") else {
        return;
    };
    run(async move {
        let w = World::with_options(&url, impatient).await;
        let ids = ids("evt_out", OUTAGE_MESSAGES);
        for id in &ids {
            w.publish(Some(id), r#"{"amount":1}"#).await;
        }
        let lock = WriteLock::take(w.db.path());

        let (seen_tx, mut seen) = mpsc::unbounded_channel();
        let apply = Checked {
            seen: Some(seen_tx),
            ..w.db.checked()
        };
        let c = Consumer::new(apply.clone(), w.options());
        let counts = c.counts();
        let consumer = start(&url, c);
        // Every message tried at least twice while the database refuses writes, each held by
        // the consumer meanwhile: nothing is acknowledged, and nothing is handed back yet.
        let mut tries: HashMap<String, u32> = HashMap::new();
        until_async("every message tried twice", PATIENCE, || {
            while let Ok(key) = seen.try_recv() {
                *tries.entry(key.event_id.as_str().to_owned()).or_default() += 1;
            }
            ids.iter().all(|id| tries.get(id).is_some_and(|&n| n >= 2))
        })
        .await;
        let held = *counts.borrow();
        let during = consumer.stop().await;
        assert_eq!(
            (held.acked, held.requeued),
            (0, 0),
            "held during the outage"
        );
        assert_eq!(during.acked, 0, "nothing acknowledged during the outage");
        // Stopping handed every held message back.
        assert_eq!(during.requeued, OUTAGE_MESSAGES as u64);
        w.wait_ready(&w.queue, OUTAGE_MESSAGES as u32).await;

        lock.release();
        let mut consumer = start(&url, Consumer::new(apply.clone(), w.options()));
        let all = OUTAGE_MESSAGES as u64;
        consumer.wait(|c| c.acked >= all, w.state()).await;
        let after = consumer.stop().await;
        w.wait_ready(&w.queue, 0).await;

        let keys: Vec<&str> = ids.iter().map(String::as_str).collect();
        let falses = apply.false_duplicates.load(Ordering::SeqCst);
        let (d, l, f) = w.db.figures(&keys, falses);
        eprintln!(
            "amqp database unavailable: D={d} L={l} F={f} (requeued {} and acked {} during the outage; applied {} after recovery)",
            during.requeued, during.acked, after.applied
        );
        assert_eq!((d, l, f), (0, 0, 0));
        assert_eq!(after.applied, OUTAGE_MESSAGES as u64);
        w.cleanup().await;
    });
}

/// On a RabbitMQ node of its own, whose `consumer_timeout` is set to 2 s (RabbitMQ 3.10 has
/// only the server-wide setting, 30 minutes by default) and checked every 200 ms: the broker
/// itself closes the slow consumer's channel, while its connection stays up and its handler
/// is still inside its transaction.
#[test]
fn processing_longer_than_the_brokers_patience_has_one_effect() {
    let Some(rabbit) = PrivateRabbit::start() else {
        return;
    };
    run(async move {
        rabbit.ready().await;
        rabbit.ctl(&[
            "eval",
            "application:set_env(rabbit, consumer_timeout, 2000), \
             application:set_env(rabbit, channel_tick_interval, 200).",
        ]);
        let url = rabbit.url();
        let w = World::new(&url).await;
        let (started, release) = hold_next();
        w.publish(Some("evt_slow"), r#"{"amount":7}"#).await;

        // Consumer A takes the message and blocks inside its transaction.
        let slow = w.db.checked_with(slow_effect);
        let a = Arc::new(Consumer::new(slow.clone(), w.options()));
        let a_conn = Arc::new(crate::support::connect(&url).await);
        let a_task = {
            let (a, a_conn) = (a.clone(), a_conn.clone());
            tokio::spawn(async move { a.run(&a_conn, std::future::pending()).await })
        };
        started.wait().await;

        // Consumer B on another connection; the broker gives up on A after 2 s, closes A's
        // channel and delivers the message to B.
        let (seen_tx, mut seen) = mpsc::unbounded_channel();
        let b_apply = Checked {
            seen: Some(seen_tx),
            ..w.db.checked()
        };
        let mut b = start(&url, Consumer::new(b_apply.clone(), w.options()));
        // B holds the redelivered message while A is still inside its transaction.
        let redelivered = seen.recv().await.unwrap();
        assert_eq!(redelivered.event_id.as_str(), "evt_slow");
        release.send(()).unwrap();

        b.wait(|c| c.acked >= 1, w.state()).await;
        let a_result = a_task.await.unwrap();
        // The broker closed A's channel, not the connection: the fault happened as in the field.
        assert!(a_conn.status().connected(), "A's connection stays up");
        let closed = format!("{a_result:?}");
        assert!(
            closed.contains("PRECONDITION_FAILED") || closed.contains("timed out"),
            "A's channel closed by the broker's consumer timeout: {closed}"
        );
        let a_done = *a.counts().borrow();
        let b_done = b.stop().await;
        w.wait_ready(&w.queue, 0).await;

        let falses = slow.false_duplicates.load(Ordering::SeqCst)
            + b_apply.false_duplicates.load(Ordering::SeqCst);
        let (d, l, f) = w.db.figures(&["evt_slow"], falses);
        eprintln!(
            "amqp processing past the broker's patience: D={d} L={l} F={f} (A applied {} with its ack refused {}, B acked the redelivery as duplicate {}; A ended with {a_result:?})",
            a_done.applied, a_done.ack_failures, b_done.duplicates
        );
        assert_eq!((d, l, f), (0, 0, 0));
        assert_eq!((a_done.applied, a_done.acked), (1, 0));
        assert_eq!((b_done.duplicates, b_done.applied), (1, 0));
        w.cleanup().await;
    });
}

#[test]
fn outage_longer_than_a_quorum_queues_delivery_limit_loses_nothing() {
    let Some(url) = service_url("ONCEBOX_AMQP_URL") else {
        return;
    };
    run(async move {
        // The queue drops (here: dead-letters) a message returned to it a third time.
        let w = World::quorum(&url, impatient, 2).await;
        w.publish(Some("evt_quorum"), r#"{"amount":3}"#).await;
        let lock = WriteLock::take(w.db.path());
        let began = Instant::now();

        let apply = w.db.checked();
        let c = Consumer::new(apply.clone(), w.options());
        let counts = c.counts();
        let mut consumer = start(&url, c);
        // Five tries of the store, more than the queue allows deliveries, the message held
        // throughout.
        until_async("five tries during the outage", PATIENCE, || {
            apply.calls.load(Ordering::SeqCst) >= 5
        })
        .await;
        let held = *counts.borrow();
        let outage = began.elapsed();
        lock.release();
        consumer.wait(|c| c.acked >= 1, w.state()).await;
        let done = consumer.stop().await;
        w.wait_ready(&w.queue, 0).await;

        let falses = apply.false_duplicates.load(Ordering::SeqCst);
        let (d, l, f) = w.db.figures(&["evt_quorum"], falses);
        let dead = w.ready(&w.dead_queue).await;
        eprintln!(
            "amqp outage on a quorum queue with delivery limit 2: D={d} L={l} F={f} (outage {outage:?}, {} store tries, {} dead-lettered, requeued {})",
            apply.calls.load(Ordering::SeqCst),
            dead,
            done.requeued
        );
        assert_eq!(held, Counts::default(), "held, neither acked nor requeued");
        assert_eq!((d, l, f), (0, 0, 0));
        assert_eq!((done.applied, done.requeued, dead), (1, 0, 0));
        w.cleanup().await;
    });
}
