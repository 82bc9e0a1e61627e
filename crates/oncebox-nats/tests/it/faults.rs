//! Faults around the consumer: the database unavailable (another connection holds SQLite's
//! write lock), and processing that outlasts the ack wait with no progress acks (they are off,
//! as when they do not reach the server), so the server delivers the message again while the
//! first delivery is still being applied.

use std::sync::atomic::Ordering;
use std::time::Duration;

use oncebox_nats::Consumer;
use oncebox_testkit::consume::{
    Checked, OUTAGE_MESSAGES, WriteLock, hold_next, ids, impatient, slow_effect,
};
use oncebox_testkit::{run, service_url};
use tokio::sync::mpsc;

use crate::support::{World, start};

#[test]
fn database_unavailable_acks_nothing_and_applies_everything_after_recovery() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        let w = World::with_options(&url, impatient).await;
        let ids = ids("evt_out", OUTAGE_MESSAGES);
        for id in &ids {
            w.publish(Some(id), r#"{"amount":1}"#).await;
        }
        let lock = WriteLock::take(w.db.path());

        let apply = w.db.checked();
        // Messages pulled but not started when the first consumer stops come back after this.
        let mut options = w.options();
        options.ack_wait = Duration::from_secs(1);
        let mut consumer = start(&url, Consumer::new(apply.clone(), options));
        // Every message tried at least twice while the database refuses writes.
        let during = w
            .wait(&mut consumer, |c| c.requeued >= 2 * OUTAGE_MESSAGES as u64)
            .await;
        consumer.stop().await;
        let info = w.consumer_info().await;
        assert_eq!(during.acked, 0, "nothing acknowledged during the outage");
        // The server agrees: its ack floor never moved. (Its pending counts may count a message
        // being redelivered twice, so they are no proof.) The proof that nothing was acked is
        // below: an acknowledged message is never delivered again, yet after recovery every
        // one of them is delivered and applied.
        assert_eq!(info.ack_floor.stream_sequence, 0);

        lock.release();
        let mut consumer = start(&url, Consumer::new(apply.clone(), w.options()));
        w.wait(&mut consumer, |c| c.applied >= OUTAGE_MESSAGES as u64)
            .await;
        w.wait_all_acked().await;
        let after = consumer.stop().await;

        let keys: Vec<&str> = ids.iter().map(String::as_str).collect();
        let falses = apply.false_duplicates.load(Ordering::SeqCst);
        let (d, l, f) = w.db.figures(&keys, falses);
        eprintln!(
            "nats database unavailable: D={d} L={l} F={f} (requeued {} and acked {} during the outage, server ack floor 0; applied {} after recovery)",
            during.requeued, during.acked, after.applied
        );
        assert_eq!((d, l, f), (0, 0, 0));
        w.cleanup().await;
    });
}

#[test]
fn processing_longer_than_the_ack_wait_has_one_effect() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        let (started, release) = hold_next();
        w.publish(Some("evt_slow"), r#"{"amount":7}"#).await;

        let (seen_tx, mut seen) = mpsc::unbounded_channel();
        let apply = Checked {
            seen: Some(seen_tx),
            ..w.db.checked_with(slow_effect)
        };
        let mut options = w.options();
        options.ack_wait = Duration::from_millis(500);
        options.progress = false;
        let mut consumer = start(&url, Consumer::new(apply.clone(), options));
        started.wait().await;
        // The first delivery is inside its transaction; the ack wait passes and the server
        // delivers the message again, to the same consumer, while the first is still running.
        assert_eq!(seen.recv().await.unwrap().event_id.as_str(), "evt_slow");
        assert_eq!(seen.recv().await.unwrap().event_id.as_str(), "evt_slow");
        release.send(()).unwrap();

        w.wait(&mut consumer, |c| {
            c.applied == 1 && c.duplicates >= 1 && c.acked == c.applied + c.duplicates
        })
        .await;
        let info = w.wait_all_acked().await;
        let done = consumer.stop().await;

        let falses = apply.false_duplicates.load(Ordering::SeqCst);
        let (d, l, f) = w.db.figures(&["evt_slow"], falses);
        eprintln!(
            "nats processing past the ack wait: D={d} L={l} F={f} (deliveries {}, applied {}, acked as duplicate {}, server deliveries {})",
            apply.calls.load(Ordering::SeqCst),
            done.applied,
            done.duplicates,
            info.delivered.consumer_sequence
        );
        assert_eq!((d, l, f), (0, 0, 0));
        w.cleanup().await;
    });
}
