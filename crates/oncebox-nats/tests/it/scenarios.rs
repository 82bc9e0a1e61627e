//! Duplicates, poison and the watermark: the same message five times is one effect and five
//! acks; messages that can never be processed are quarantined with their reason after one
//! attempt; a replayed stream is stale below the watermark even after its records were purged;
//! a message's Content-Type is stored with its event; copies under new publish ids are
//! deduplicated by the inbox, not by the stream (which payload of a key wins: `keys.rs`).

use std::sync::atomic::Ordering;

use async_nats::HeaderMap;
use oncebox_core::FingerprintMode;
use oncebox_core::store::EventStore;
use oncebox_nats::Consumer;
use oncebox_testkit::consume::{POISON, POISON_REASONS, key};
use oncebox_testkit::{run, service_url};

use crate::support::{KEY_HEADER, World, start};

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
        let apply = w.db.checked();
        let mut consumer = start(&url, Consumer::new(apply.clone(), w.options()));
        w.wait(&mut consumer, |c| c.acked >= 5).await;
        let info = w.wait_all_acked().await;
        let done = consumer.stop().await;

        let falses = apply.false_duplicates.load(Ordering::SeqCst);
        let (d, l, f) = w.db.figures(&["evt_five"], falses);
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
        let apply = w.db.checked();
        let mut consumer = start(&url, Consumer::new(apply.clone(), w.options()));
        // The first payload of a key, applied before its conflicting twin is sent.
        w.publish(Some("evt_first"), r#"{"amount":1}"#).await;
        w.wait(&mut consumer, |c| c.applied >= 1).await;

        for (id, body) in POISON {
            w.publish(id, body).await;
        }
        w.wait(&mut consumer, |c| c.quarantined >= 5).await;
        w.wait_all_acked().await;
        let done = consumer.stop().await;

        let reasons = w.quarantined().await;
        assert_eq!(reasons, POISON_REASONS);
        // Only the conflict and the failing handler reach the store: the conflict once, the
        // failing handler exactly `max_attempts` times (its failures, counted by the consumer);
        // nothing loops.
        let max = u64::from(w.options().retry.max_attempts);
        assert_eq!(apply.calls.load(Ordering::SeqCst), 1 + 1 + max);
        assert_eq!(done.requeued, max - 1);
        assert_eq!((done.acked, done.applied), (6, 1));
        assert_eq!(w.db.effects("evt_boom"), 0);
        let falses = apply.false_duplicates.load(Ordering::SeqCst);
        let (d, l, f) = w.db.figures(&["evt_first"], falses);
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
        // The stream ends with a duplicate: answered from its record, it moves the watermark
        // too, or the replay below would apply `evt_w1` again.
        for id in ids.iter().chain(&["evt_w1"]) {
            w.publish(Some(id), r#"{"amount":1}"#).await;
        }
        let mut options = w.options();
        options.watermark = true;
        let apply = w.db.checked();
        let mut consumer = start(&url, Consumer::new(apply.clone(), options.clone()));
        w.wait(&mut consumer, |c| c.applied >= 3 && c.acked >= 4)
            .await;
        w.wait_all_acked().await;
        consumer.stop().await;

        // Retention purged the records; then the durable is recreated, which replays the
        // stream from its start: every message is stale, the last one as the duplicate of the
        // first one's new stale record.
        let inbox = &w.db.inbox;
        let forget = || inbox.write(|c| c.execute("DELETE FROM oncebox_inbox", []));
        assert_eq!(forget().await.unwrap(), 3);
        let stream = w.js.get_stream(&w.stream).await.unwrap();
        stream.delete_consumer(&w.durable).await.unwrap();
        let mut consumer = start(&url, Consumer::new(apply.clone(), options.clone()));
        w.wait(&mut consumer, |c| c.acked >= 4).await;
        w.wait_all_acked().await;
        let replay = consumer.stop().await;
        assert_eq!((replay.stale, replay.duplicates, replay.applied), (3, 1, 0));

        // Once more after the stream's own limits dropped all but its last message, the
        // duplicate: nothing but the watermark can tell it was settled.
        forget().await.unwrap();
        stream.purge().sequence(4).await.unwrap();
        stream.delete_consumer(&w.durable).await.unwrap();
        let mut consumer = start(&url, Consumer::new(apply.clone(), options));
        w.wait(&mut consumer, |c| c.acked >= 1).await;
        w.wait_all_acked().await;
        let tail = consumer.stop().await;

        let falses = apply.false_duplicates.load(Ordering::SeqCst);
        let (d, l, f) = w.db.figures(&ids, falses);
        eprintln!(
            "nats watermark replay: D={d} L={l} F={f} (replayed 4 after purge: stale {}, \
             duplicates {}; the last alone: stale {}, applied {})",
            replay.stale, replay.duplicates, tail.stale, tail.applied
        );
        assert_eq!((d, l, f), (0, 0, 0));
        assert_eq!((tail.stale, tail.applied), (1, 0));
        w.cleanup().await;
    });
}

#[test]
fn watermark_of_a_recreated_stream_starts_afresh() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        for id in ["evt_r1", "evt_r2", "evt_r3"] {
            w.publish(Some(id), r#"{"amount":1}"#).await;
        }
        let mut options = w.options();
        options.watermark = true;
        let apply = w.db.checked();
        let mut consumer = start(&url, Consumer::new(apply.clone(), options.clone()));
        w.wait(&mut consumer, |c| c.applied >= 3).await;
        w.wait_all_acked().await;
        consumer.stop().await;

        // Deleted and created again under its name: its sequences start at 1 again, below
        // the old stream's watermark of 3. Its durable went with it.
        w.recreate_stream().await;
        let fresh = ["evt_n1", "evt_n2"];
        for id in fresh {
            w.publish(Some(id), r#"{"amount":1}"#).await;
        }
        let mut consumer = start(&url, Consumer::new(apply.clone(), options));
        w.wait(&mut consumer, |c| c.acked >= 2).await;
        let info = w.wait_all_acked().await;
        let after = consumer.stop().await;

        let falses = apply.false_duplicates.load(Ordering::SeqCst);
        let (d, l, f) = w.db.figures(&fresh, falses);
        eprintln!(
            "nats watermark after the stream was recreated: D={d} L={l} F={f} (new messages at sequences 1..={}: applied {}, stale {})",
            info.ack_floor.stream_sequence, after.applied, after.stale
        );
        assert_eq!((d, l, f), (0, 0, 0));
        assert_eq!((after.applied, after.stale), (2, 0));
        w.cleanup().await;
    });
}

/// A raw body is stored under the type it came with, so a relay forwards it as such, not as
/// JSON; a message without one keeps none.
#[test]
fn a_messages_content_type_is_stored_with_its_event() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        let mut headers = HeaderMap::new();
        headers.insert(KEY_HEADER, "plain-1");
        headers.insert("Content-Type", "text/plain");
        w.publish_with(headers, "plain words").await;
        w.publish(Some("json-1"), r#"{"amount":1}"#).await;
        let mut options = w.options();
        options.rules.fingerprint = FingerprintMode::Raw;
        let mut consumer = start(&url, Consumer::new(w.db.checked(), options));
        w.wait(&mut consumer, |c| c.acked >= 2).await;
        consumer.stop().await;
        let stored = |id: &'static str| {
            let inbox = &w.db.inbox;
            async move {
                let e = EventStore::event(inbox, &key(id)).await.unwrap();
                e.expect("stored").meta.content_type
            }
        };
        assert_eq!(stored("plain-1").await.as_deref(), Some("text/plain"));
        assert_eq!(stored("json-1").await, None);
        w.cleanup().await;
    });
}

/// A publisher that retries under a new `Nats-Msg-Id` (a restarted producer, a second one)
/// gets past JetStream's own duplicate window: the stream stores both copies, and the inbox
/// alone keeps the effect to one.
#[test]
fn copies_under_new_publish_ids_pass_the_streams_window_and_still_have_one_effect() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        for msg_id in ["publish-1", "publish-2", "publish-3"] {
            let mut headers = HeaderMap::new();
            headers.insert(KEY_HEADER, "evt_republished");
            headers.insert("Nats-Msg-Id", msg_id);
            w.publish_with(headers, r#"{"amount":3}"#).await;
        }
        let apply = w.db.checked();
        let mut consumer = start(&url, Consumer::new(apply.clone(), w.options()));
        w.wait(&mut consumer, |c| c.acked >= 3).await;
        let info = w.wait_all_acked().await;
        let done = consumer.stop().await;
        let falses = apply.false_duplicates.load(Ordering::SeqCst);
        let (d, l, f) = w.db.figures(&["evt_republished"], falses);
        eprintln!(
            "nats copies under new publish ids: D={d} L={l} F={f} (stored by the stream {}, applied {}, duplicates {})",
            info.ack_floor.stream_sequence, done.applied, done.duplicates
        );
        // All three reached the consumer: the stream's window let each in.
        assert_eq!(info.ack_floor.stream_sequence, 3);
        assert_eq!((d, l, f), (0, 0, 0));
        assert_eq!((done.applied, done.duplicates), (1, 2));
        w.cleanup().await;
    });
}
