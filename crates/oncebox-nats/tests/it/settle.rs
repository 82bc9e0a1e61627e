//! How single messages are settled when things go wrong around them: a poison message carrying
//! JetStream's own headers is still quarantined; redeliveries during an outage do not use up a
//! handler's attempts; a panicking `Apply` is a failed handler; the acks `run` counted have
//! reached the server when it returns; a conflict whose quarantine failed is not offered to the
//! store again.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_nats::HeaderMap;
use oncebox_core::consume::{Apply, from_fn};
use oncebox_core::{ProcessError, Processed, Unavailable};
use oncebox_nats::Consumer;
use oncebox_testkit::{run, service_url};

use crate::support::{World, connect, create_stream, start};

#[test]
fn poison_with_jetstream_headers_is_quarantined_without_them() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        // No key: poison. The header holds for the stream it was published to; kept on the
        // copy, the quarantine stream would refuse the copy, and the message would be requeued
        // forever.
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Expected-Stream", w.stream.as_str());
        headers.insert("Nats-Msg-Id", "msg_1");
        w.publish_with(headers, r#"{"amount":1}"#).await;

        let mut consumer = start(&url, Consumer::new(w.db.checked(), w.options()));
        w.wait(&mut consumer, |c| c.quarantined >= 1).await;
        w.wait_all_acked().await;
        let done = consumer.stop().await;

        assert_eq!(w.quarantined().await, ["event-id-missing"]);
        let q = w.js.get_stream(&w.quarantine_stream).await.unwrap();
        let copy = q.get_raw_message(1).await.unwrap().headers;
        let header = |name: &str| copy.get(name).map(ToString::to_string);
        assert_eq!(header("Nats-Expected-Stream"), None);
        assert_eq!(header("Nats-Msg-Id"), None);
        assert_eq!(
            header("Oncebox-Original-Nats-Expected-Stream").as_deref(),
            Some(w.stream.as_str())
        );
        assert_eq!(
            header("Oncebox-Original-Nats-Msg-Id").as_deref(),
            Some("msg_1")
        );
        eprintln!(
            "nats poison with Nats-Expected-Stream: quarantined {} (requeued {} on the way)",
            done.quarantined, done.requeued
        );
        assert_eq!((done.quarantined, done.requeued), (1, 0));
        w.cleanup().await;
    });
}

#[test]
fn redeliveries_during_an_outage_do_not_use_up_the_handlers_attempts() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        let max = w.options().retry.max_attempts;
        // More deliveries the store cannot answer than the handler has attempts, then one
        // failure, then the real inbox.
        let outage = max + 2;
        let calls = Arc::new(AtomicU32::new(0));
        let inner = w.db.checked();
        let counted = calls.clone();
        let apply = from_fn(move |event, position| {
            let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
            let inner = inner.clone();
            async move {
                if n <= outage {
                    Err(ProcessError::Unavailable(Unavailable::Busy))
                } else if n == outage + 1 {
                    Err(ProcessError::Handler("a transient failure".into()))
                } else {
                    inner.apply(event, position).await
                }
            }
        });
        w.publish(Some("evt_after_outage"), r#"{"amount":1}"#).await;
        let mut consumer = start(&url, Consumer::new(apply, w.options()));
        w.wait(&mut consumer, |c| c.applied + c.quarantined >= 1)
            .await;
        let info = w.wait_all_acked().await;
        let done = consumer.stop().await;

        eprintln!(
            "nats outage then one failure: applied {}, quarantined {}, requeued {} (server deliveries {}, max_attempts {max})",
            done.applied, done.quarantined, done.requeued, info.delivered.consumer_sequence
        );
        // The failure came at a delivery past max_attempts by the server's count.
        assert_eq!(calls.load(Ordering::SeqCst), outage + 2);
        assert!(info.delivered.consumer_sequence > u64::from(max));
        assert_eq!((done.applied, done.quarantined), (1, 0));
        assert_eq!(w.db.effects("evt_after_outage"), 1);
        assert!(w.quarantined().await.is_empty());
        w.cleanup().await;
    });
}

/// An `Apply` that panics on every call.
async fn explode(calls: Arc<AtomicU32>) -> Result<Processed, ProcessError> {
    calls.fetch_add(1, Ordering::SeqCst);
    panic!("the apply blew up");
}

#[test]
fn a_panicking_apply_is_a_failed_handler_and_is_quarantined() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        let calls = Arc::new(AtomicU32::new(0));
        let counted = calls.clone();
        let apply = from_fn(move |_, _| explode(counted.clone()));
        w.publish(Some("evt_panic"), r#"{"amount":1}"#).await;
        let mut consumer = start(&url, Consumer::new(apply, w.options()));
        w.wait(&mut consumer, |c| c.quarantined >= 1).await;
        w.wait_all_acked().await;
        let done = consumer.stop().await;

        let max = w.options().retry.max_attempts;
        assert_eq!(
            calls.load(Ordering::SeqCst),
            max,
            "tried max_attempts times"
        );
        assert_eq!(w.quarantined().await, ["handler-failed"]);
        let q = w.js.get_stream(&w.quarantine_stream).await.unwrap();
        let copy = q.get_raw_message(1).await.unwrap().headers;
        let detail = copy.get("Oncebox-Detail").unwrap().to_string();
        assert!(detail.contains("the apply blew up"), "{detail}");
        eprintln!(
            "nats panicking apply: {} calls, requeued {}, quarantined {} ({detail})",
            calls.load(Ordering::SeqCst),
            done.requeued,
            done.quarantined
        );
        assert_eq!((done.requeued, done.quarantined), (u64::from(max) - 1, 1));
        w.cleanup().await;
    });
}

#[test]
fn the_acks_counted_have_reached_the_server_when_run_returns() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        w.publish(Some("evt_flushed"), r#"{"amount":1}"#).await;
        let consumer = Consumer::new(w.db.checked(), w.options());
        let mut counts = consumer.counts();
        let after = consumer.counts();
        // On a runtime of its own, dropped as soon as `run` returns, as a process exits:
        // whatever the client queued and did not write dies with it. `run` is told to stop at
        // the moment it counts its ack.
        let url2 = url.clone();
        let ended = tokio::task::spawn_blocking(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let ended = rt.block_on(async move {
                let js = connect(&url2).await;
                let acked = async move {
                    let _ = counts.wait_for(|c| c.acked >= 1).await;
                };
                consumer.run(&js, acked).await
            });
            drop(rt);
            ended
        })
        .await
        .unwrap();
        ended.unwrap();
        assert_eq!(after.borrow().acked, 1);

        // The server's ack floor moves once it has the ack; without it the message would stay
        // pending until its ack wait ran out, and come back.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let mut info = w.consumer_info().await;
        while info.ack_floor.stream_sequence < 1 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the counted ack never reached the server: {info:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
            info = w.consumer_info().await;
        }
        eprintln!(
            "nats ack flushed: counted 1, server ack floor {} with {} pending",
            info.ack_floor.stream_sequence, info.num_ack_pending
        );
        assert_eq!(info.num_ack_pending, 0);
        w.cleanup().await;
    });
}

/// A conflict whose quarantined copy no stream stores (the quarantine stream deleted after the
/// start): it is NAKed back until the quarantine stores again, and meanwhile not asked of the
/// store again, which keeps an audit row of the offered payload each time it is asked.
#[test]
fn a_conflict_whose_quarantine_fails_is_not_offered_to_the_store_again() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        let mut consumer = start(&url, Consumer::new(w.db.checked(), w.options()));
        w.publish(Some("evt_c"), r#"{"v":1}"#).await;
        w.wait(&mut consumer, |c| c.applied >= 1).await;

        w.js.delete_stream(&w.quarantine_stream).await.unwrap();
        w.publish(Some("evt_c"), r#"{"v":2}"#).await;
        // Each copy unstored, the message NAKed back (20 ms apart).
        let held = w.wait(&mut consumer, |c| c.requeued >= 5).await;
        assert_eq!(held.quarantined, 0, "{held:?}");
        assert_eq!(w.db.conflicts().await, 1, "one audit row, not one per try");

        create_stream(&w.js, &w.quarantine_stream, &w.quarantine_subject).await;
        let done = w.wait(&mut consumer, |c| c.quarantined >= 1).await;
        consumer.stop().await;
        eprintln!(
            "nats conflict with the quarantine unstored: requeued {}, then quarantined",
            done.requeued
        );
        assert_eq!(w.db.conflicts().await, 1);
        assert_eq!(w.quarantined().await, ["key-reused"]);
        assert_eq!(w.db.effects("evt_c"), 1);
        w.cleanup().await;
    });
}
