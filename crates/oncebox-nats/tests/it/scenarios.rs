//! Duplicates, poison and the watermark: the same message five times is one effect and five
//! acks; messages that can never be processed are quarantined with their reason after one
//! attempt; a replayed stream is stale below the watermark even after its records were purged.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use oncebox_nats::Consumer;
use oncebox_testkit::{run, service_url};

use crate::support::{World, effects_of, start};

#[test]
fn same_message_published_five_times_has_one_effect_and_five_acks() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        for _ in 0..5 {
            w.publish(Some("evt_five"), r#"{"amount":5}"#).await;
        }
        let apply = w.checked();
        let consumer = Arc::new(Consumer::new(apply.clone(), w.options()));
        let mut counts = consumer.counts();
        let (stop, task) = start(&url, consumer.clone());
        w.wait_counts(&mut counts, |c| c.acked >= 5).await;
        let info = w.wait_all_acked().await;
        let _ = stop.send(());
        task.await.unwrap().unwrap();
        let done = *consumer.counts().borrow();

        let (d, l, f) = w.figures(&["evt_five"], apply.false_duplicates.load(Ordering::SeqCst));
        eprintln!(
            "nats five publishes: D={d} L={l} F={f} (acks {}, applied {}, duplicates {}, ack floor at stream sequence {})",
            done.acked, done.applied, done.duplicates, info.ack_floor.stream_sequence
        );
        assert_eq!((d, l, f), (0, 0, 0));
        assert_eq!((done.applied, done.duplicates, done.requeued), (1, 4, 0));
        assert_eq!(info.ack_floor.stream_sequence, 5);
        w.cleanup().await;
    });
}

#[test]
fn poison_messages_are_quarantined_with_their_reason_after_one_attempt() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        let apply = w.checked();
        let consumer = Arc::new(Consumer::new(apply.clone(), w.options()));
        let mut counts = consumer.counts();
        let (stop, task) = start(&url, consumer.clone());
        // The first payload of a key, applied before its conflicting twin is sent.
        w.publish(Some("evt_first"), r#"{"amount":1}"#).await;
        w.wait_counts(&mut counts, |c| c.applied >= 1).await;

        w.publish(Some("evt_first"), r#"{"amount":2}"#).await; // key-reused
        w.publish(None, r#"{"amount":3}"#).await; // event-id-missing
        w.publish(Some("evt_json"), "{not json").await; // invalid-json
        w.publish(Some("   "), r#"{"amount":4}"#).await; // event-id-invalid
        w.publish(Some("evt_boom"), r#"{"boom":true}"#).await; // handler fails every time
        w.wait_counts(&mut counts, |c| c.quarantined >= 5).await;
        w.wait_all_acked().await;
        let _ = stop.send(());
        task.await.unwrap().unwrap();
        let done = *consumer.counts().borrow();

        let reasons = w.quarantined().await;
        assert_eq!(
            reasons,
            [
                "event-id-invalid",
                "event-id-missing",
                "handler-failed",
                "invalid-json",
                "key-reused"
            ]
        );
        // Only the conflict and the failing handler reach the store: the conflict once, the
        // failing handler exactly `max_attempts` times (the server's delivery count); nothing
        // loops.
        let max = u64::from(w.options().retry.max_attempts);
        assert_eq!(apply.calls.load(Ordering::SeqCst), 1 + 1 + max);
        assert_eq!(done.requeued, max - 1);
        assert_eq!((done.acked, done.applied), (6, 1));
        let boom = oncebox_core::Key::parse(crate::support::SOURCE, "evt_boom").unwrap();
        assert_eq!(effects_of(&w.inbox, &boom), 0);
        let (d, l, f) = w.figures(
            &["evt_first"],
            apply.false_duplicates.load(Ordering::SeqCst),
        );
        eprintln!(
            "nats poison: D={d} L={l} F={f} (quarantined {} with reasons, requeued {} for the failing handler, first payload kept)",
            done.quarantined, done.requeued
        );
        assert_eq!((d, l, f), (0, 0, 0));
        w.cleanup().await;
    });
}

#[test]
fn watermark_makes_a_replayed_stream_stale_after_its_records_were_purged() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        let ids = ["evt_w1", "evt_w2", "evt_w3"];
        for id in ids {
            w.publish(Some(id), r#"{"amount":1}"#).await;
        }
        let mut options = w.options();
        options.watermark = true;
        let apply = w.checked();
        let consumer = Arc::new(Consumer::new(apply.clone(), options.clone()));
        let mut counts = consumer.counts();
        let (stop, task) = start(&url, consumer.clone());
        w.wait_counts(&mut counts, |c| c.applied >= 3).await;
        w.wait_all_acked().await;
        let _ = stop.send(());
        task.await.unwrap().unwrap();

        // Retention purged the records; then the durable is recreated, which replays the
        // stream from its start.
        let purged = w
            .inbox
            .write(|c| c.execute("DELETE FROM oncebox_inbox", []))
            .await
            .unwrap();
        assert_eq!(purged, 3);
        let stream = w.js.get_stream(&w.stream).await.unwrap();
        stream.delete_consumer(&w.durable).await.unwrap();
        let consumer = Arc::new(Consumer::new(apply.clone(), options));
        let mut counts = consumer.counts();
        let (stop, task) = start(&url, consumer.clone());
        w.wait_counts(&mut counts, |c| c.acked >= 3).await;
        w.wait_all_acked().await;
        let _ = stop.send(());
        task.await.unwrap().unwrap();
        let replay = *consumer.counts().borrow();

        let (d, l, f) = w.figures(&ids, apply.false_duplicates.load(Ordering::SeqCst));
        eprintln!(
            "nats watermark replay: D={d} L={l} F={f} (replayed 3 after purge: stale {}, applied {})",
            replay.stale, replay.applied
        );
        assert_eq!((d, l, f), (0, 0, 0));
        assert_eq!((replay.stale, replay.applied), (3, 0));
        w.cleanup().await;
    });
}
