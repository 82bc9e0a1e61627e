//! Duplicates and poison: the same message five times is one effect and five acks; messages
//! that can never be processed are quarantined with their reason after one attempt.

use std::sync::atomic::Ordering;

use oncebox_amqp::Consumer;
use oncebox_testkit::consume::{POISON, POISON_REASONS};
use oncebox_testkit::{run, service_url};

use crate::support::{World, start};

#[test]
fn same_message_published_five_times_has_one_effect_and_five_acks() {
    let Some(url) = service_url("ONCEBOX_AMQP_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        for _ in 0..5 {
            w.publish(Some("evt_five"), r#"{"amount":5}"#).await;
        }
        let apply = w.db.checked();
        let mut consumer = start(&url, Consumer::new(apply.clone(), w.options()));
        consumer.wait(|c| c.acked >= 5, w.state()).await;
        let done = consumer.stop().await;
        w.wait_ready(&w.queue, 0).await;

        let falses = apply.false_duplicates.load(Ordering::SeqCst);
        let (d, l, f) = w.db.figures(&["evt_five"], falses);
        eprintln!(
            "amqp five publishes: D={d} L={l} F={f} (acks {}, applied {}, duplicates {}, queue empty)",
            done.acked, done.applied, done.duplicates
        );
        assert_eq!((d, l, f), (0, 0, 0));
        assert_eq!((done.applied, done.duplicates, done.requeued), (1, 4, 0));
        w.cleanup().await;
    });
}

#[test]
fn poison_messages_are_quarantined_with_their_reason_after_one_attempt() {
    let Some(url) = service_url("ONCEBOX_AMQP_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        let apply = w.db.checked();
        let mut consumer = start(&url, Consumer::new(apply.clone(), w.options()));
        // The first payload of a key, applied before its conflicting twin is sent.
        w.publish(Some("evt_first"), r#"{"amount":1}"#).await;
        consumer.wait(|c| c.applied >= 1, w.state()).await;
        for (id, body) in POISON {
            w.publish(id, body).await;
        }
        consumer.wait(|c| c.quarantined >= 5, w.state()).await;
        let done = consumer.stop().await;
        w.wait_ready(&w.queue, 0).await;

        let reasons: Vec<String> = w.quarantined().await.into_iter().map(|(r, _)| r).collect();
        assert_eq!(reasons, POISON_REASONS);
        // Only the conflict and the failing handler reach the store: the conflict once, the
        // failing handler exactly `max_attempts` times; nothing loops.
        let max = u64::from(w.options().retry.max_attempts);
        assert_eq!(apply.calls.load(Ordering::SeqCst), 1 + 1 + max);
        assert_eq!(done.requeued, max - 1);
        assert_eq!((done.acked, done.applied), (6, 1));
        let falses = apply.false_duplicates.load(Ordering::SeqCst);
        let (d, l, f) = w.db.figures(&["evt_first"], falses);
        assert_eq!(w.db.effects("evt_boom"), 0);
        eprintln!(
            "amqp poison: D={d} L={l} F={f} (quarantined {} with reasons, requeued {} for the failing handler, first payload kept)",
            done.quarantined, done.requeued
        );
        assert_eq!((d, l, f), (0, 0, 0));
        w.cleanup().await;
    });
}

/// A key sent twice with different payloads, both in hand at once (the prefetch holds many):
/// the one published first is the one kept, and the later is quarantined as `key-reused` (G4).
/// Applied side by side, whichever committed first won: measured, the later payload in about
/// one pair in seven at a prefetch of 50.
#[test]
fn the_first_published_payload_of_a_key_wins_within_one_prefetch() {
    let Some(url) = service_url("ONCEBOX_AMQP_URL") else {
        return;
    };
    run(async move {
        const PAIRS: usize = 200;
        let w = World::new(&url).await;
        for i in 0..PAIRS {
            let id = format!("pair-{i}");
            w.publish(Some(&id), r#"{"v":1}"#).await;
            w.publish(Some(&id), r#"{"v":2}"#).await;
        }
        let apply = w.db.checked();
        let mut options = w.options();
        options.prefetch = 50;
        let mut consumer = start(&url, Consumer::new(apply.clone(), options));
        consumer
            .wait(
                |c| c.applied >= PAIRS as u64 && c.quarantined >= PAIRS as u64,
                w.state(),
            )
            .await;
        let done = consumer.stop().await;
        w.wait_ready(&w.queue, 0).await;
        let quarantined = w.quarantined().await;
        let later: usize = quarantined
            .iter()
            .filter(|(reason, body)| reason == "key-reused" && body == br#"{"v":2}"#)
            .count();
        eprintln!(
            "amqp reused keys: {later} of {PAIRS} later payloads quarantined (applied {}, quarantined {})",
            done.applied, done.quarantined
        );
        assert_eq!(later, PAIRS, "an earlier payload lost to a later one");
        w.cleanup().await;
    });
}
