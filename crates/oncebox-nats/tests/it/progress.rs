//! A message in hand longer than the ack wait: the consumer says it is in progress, so the
//! server does not deliver it again meanwhile (`faults.rs` has the same wait with progress
//! acks off, where the copy comes and is answered by the inbox).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use oncebox_core::consume::{Apply, Position};
use oncebox_core::{Event, ProcessError, Processed, Unavailable};
use oncebox_nats::Consumer;
use oncebox_testkit::consume::Checked;
use oncebox_testkit::{run, service_url};
use tokio::sync::{Semaphore, mpsc};

use crate::support::{World, start};

/// An `Apply` that waits for a permit before it applies: the message stays in hand until the
/// test lets it go.
#[derive(Clone)]
struct Gated<A> {
    inner: A,
    gate: Arc<Semaphore>,
}

impl<A: Apply> Apply for Gated<A> {
    async fn apply(
        &self,
        event: Event,
        position: Option<Position>,
    ) -> Result<Processed, ProcessError> {
        self.gate.acquire().await.expect("gate open").forget();
        self.inner.apply(event, position).await
    }

    async fn watermark(&self, stream: &str, partition: i64) -> Result<Option<i64>, Unavailable> {
        self.inner.watermark(stream, partition).await
    }
}

#[test]
fn a_message_in_hand_past_the_ack_wait_is_not_delivered_again() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        w.publish(Some("evt_long"), r#"{"amount":3}"#).await;
        let (seen_tx, mut seen) = mpsc::unbounded_channel();
        let gate = Arc::new(Semaphore::new(0));
        let checked = w.db.checked();
        let apply = Checked {
            inner: Gated {
                inner: checked.inner,
                gate: gate.clone(),
            },
            inbox: checked.inbox,
            calls: checked.calls,
            false_duplicates: checked.false_duplicates,
            seen: Some(seen_tx),
        };
        let mut options = w.options();
        // Long enough that a busy machine's stall between two progress acks (a third of it
        // apart) does not outlast it.
        options.ack_wait = Duration::from_secs(3);
        let mut consumer = start(&url, Consumer::new(apply.clone(), options));
        assert_eq!(seen.recv().await.unwrap().event_id.as_str(), "evt_long");
        // One progress ack every third of the ack wait, the first a third after the message
        // came: seven of them are more than two ack waits in hand.
        let held = w.wait(&mut consumer, |c| c.in_progress >= 7).await;
        let info = w.consumer_info().await;
        assert_eq!(
            (info.delivered.consumer_sequence, info.num_redelivered),
            (1, 0),
            "delivered again while in hand: {info:?}"
        );
        assert!(seen.try_recv().is_err(), "a copy reached the apply");
        assert_eq!(held.applied + held.requeued + held.duplicates, 0);

        gate.add_permits(1);
        w.wait(&mut consumer, |c| c.applied == 1 && c.acked == 1)
            .await;
        let info = w.wait_all_acked().await;
        let done = consumer.stop().await;
        let falses = apply.false_duplicates.load(Ordering::SeqCst);
        let (d, l, f) = w.db.figures(&["evt_long"], falses);
        eprintln!(
            "nats in hand for two ack waits: D={d} L={l} F={f} (in-progress acks {}, server deliveries {}, applies {})",
            done.in_progress,
            info.delivered.consumer_sequence,
            apply.calls.load(Ordering::SeqCst)
        );
        assert_eq!((d, l, f), (0, 0, 0));
        assert_eq!(info.delivered.consumer_sequence, 1);
        assert_eq!((done.applied, done.duplicates), (1, 0));
        assert_eq!(apply.calls.load(Ordering::SeqCst), 1);
        w.cleanup().await;
    });
}
