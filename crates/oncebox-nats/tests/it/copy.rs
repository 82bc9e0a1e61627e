//! Quarantined copies that would not fit as they are: a poison message near the server's
//! `max_payload` (the copy's own headers push it over), one whose headers are near JetStream's
//! 64 KiB, a quarantine stream with a smaller `max_msg_size`, and a handler's error of 200 KB.
//! Each is quarantined once, cut and marked as cut, instead of being refused and requeued
//! forever.

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::stream;
use oncebox_core::ProcessError;
use oncebox_core::consume::{MAX_DETAIL, from_fn};
use oncebox_nats::{ConsumeError, Consumer, HEADERS_DROPPED, ORIGIN_HEADERS, PAYLOAD_TRUNCATED};
use oncebox_testkit::{run, service_url};

use crate::support::{KEY_HEADER, World, start};

/// Replaces the world's quarantine stream with one that stores messages of at most `max`
/// bytes.
async fn limit_quarantine(w: &World, max: i32) {
    w.js.delete_stream(&w.quarantine_stream).await.unwrap();
    w.js.create_stream(stream::Config {
        name: w.quarantine_stream.clone(),
        subjects: vec![w.quarantine_subject.clone()],
        max_age: Duration::from_secs(600),
        max_message_size: max,
        ..stream::Config::default()
    })
    .await
    .unwrap();
}

/// Publishes `body` without a key (poison: `event-id-missing`), quarantines it and returns the
/// copy's headers and payload, checking that it was quarantined once and nothing is pending.
async fn quarantine_unkeyed(
    url: &str,
    w: &World,
    headers: HeaderMap,
    body: Vec<u8>,
) -> (HeaderMap, Vec<u8>) {
    let subject = w.subject.clone();
    let ack = w.js.publish_with_headers(subject, headers, body.into());
    ack.await.unwrap().await.unwrap();
    let mut consumer = start(url, Consumer::new(w.db.checked(), w.options()));
    w.wait(&mut consumer, |c| c.quarantined >= 1).await;
    w.wait_all_acked().await;
    let done = consumer.stop().await;
    assert_eq!((done.quarantined, done.requeued), (1, 0), "{done:?}");
    assert_eq!(w.quarantined().await, ["event-id-missing"]);
    let q = w.js.get_stream(&w.quarantine_stream).await.unwrap();
    let copy = q.get_raw_message(1).await.unwrap();
    (copy.headers, copy.payload.to_vec())
}

fn header(h: &HeaderMap, name: &str) -> Option<String> {
    h.get(name).map(ToString::to_string)
}

/// The original fits `max_payload`; its copy, with the reason's headers added, would not, and
/// the client refused every publish of it: the message was NAKed and came back forever.
#[test]
fn a_poison_message_near_max_payload_is_quarantined_with_its_payload_cut() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        let max = w.js.client().max_payload();
        let body: Vec<u8> = (0..max.saturating_sub(64))
            .map(|i| b'a' + (i % 26) as u8)
            .collect();
        let (headers, payload) = quarantine_unkeyed(&url, &w, HeaderMap::new(), body.clone()).await;

        let original = body.len().to_string();
        assert_eq!(header(&headers, PAYLOAD_TRUNCATED), Some(original));
        assert!(payload.len() < body.len() && body.starts_with(&payload));
        let detail = header(&headers, "Oncebox-Detail").unwrap();
        assert!(detail.contains("copy cut to fit"), "{detail}");
        eprintln!(
            "nats poison of {} bytes (max_payload {max}): quarantined once, payload cut to {} ({detail})",
            body.len(),
            payload.len()
        );
        w.cleanup().await;
    });
}

/// The quarantine stream stores less than the server would carry: the stream refused the copy,
/// and the message came back forever.
#[test]
fn a_quarantine_stream_with_a_smaller_max_msg_size_gets_a_copy_that_fits() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        limit_quarantine(&w, 4096).await;
        let body = vec![b'x'; 10_000];
        let (headers, payload) = quarantine_unkeyed(&url, &w, HeaderMap::new(), body).await;
        assert_eq!(
            header(&headers, PAYLOAD_TRUNCATED).as_deref(),
            Some("10000")
        );
        assert!(
            !payload.is_empty() && payload.len() < 4096,
            "{}",
            payload.len()
        );
        // Where the original was: its subject and its place in the (fresh) stream.
        let origin = ORIGIN_HEADERS.map(|h| header(&headers, h));
        assert_eq!(origin, [Some(w.subject.clone()), Some("1".to_owned())]);
        w.cleanup().await;
    });
}

/// JetStream stores at most 64 KiB of headers with a message: an original that has nearly as
/// many gets a copy with more (the reason's), which the stream refused every time.
#[test]
fn a_poison_message_with_headers_near_64_kib_is_quarantined_without_them() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        let mut headers = HeaderMap::new();
        headers.insert("X-Huge", "h".repeat(65_400).as_str());
        let body = br#"{"amount":1}"#.to_vec();
        let (copy, payload) = quarantine_unkeyed(&url, &w, headers, body.clone()).await;
        assert_eq!(payload, body, "the payload fits whole");
        assert_eq!(header(&copy, "X-Huge"), None);
        let dropped = header(&copy, HEADERS_DROPPED).unwrap();
        assert!(dropped.parse::<usize>().unwrap() > 65_400, "{dropped}");
        assert_eq!(header(&copy, PAYLOAD_TRUNCATED), None);
        // The subject went with the original headers; the sequence still finds the original.
        let origin = ORIGIN_HEADERS.map(|h| header(&copy, h));
        assert_eq!(origin, [None, Some("1".to_owned())]);
        w.cleanup().await;
    });
}

/// A stream too small for a copy's own headers could never take one: refused at start.
#[test]
fn a_quarantine_stream_too_small_for_any_copy_is_refused_at_start() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        limit_quarantine(&w, 256).await;
        let consumer = Consumer::new(w.db.checked(), w.options());
        let refused = consumer.bind(&w.js).await.unwrap_err();
        assert!(
            matches!(&refused, ConsumeError::QuarantineUnstored { why, .. } if why.contains("max_msg_size")),
            "{refused}"
        );
        w.cleanup().await;
    });
}

/// An interest stream acknowledges a message no consumer wants with a sequence and drops it: a
/// copy stored there was lost while its original was acked. Refused at start.
#[test]
fn a_quarantine_stream_with_interest_retention_is_refused_at_start() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        w.js.delete_stream(&w.quarantine_stream).await.unwrap();
        w.js.create_stream(stream::Config {
            name: w.quarantine_stream.clone(),
            subjects: vec![w.quarantine_subject.clone()],
            retention: stream::RetentionPolicy::Interest,
            ..stream::Config::default()
        })
        .await
        .unwrap();
        // The fault itself: such a stream acknowledges a publish nobody wants, and keeps none.
        let ack = w.js.publish(w.quarantine_subject.clone(), "x".into());
        assert!(ack.await.unwrap().await.unwrap().sequence > 0);
        let mut q = w.js.get_stream(&w.quarantine_stream).await.unwrap();
        assert_eq!(q.info().await.unwrap().state.messages, 0);
        let consumer = Consumer::new(w.db.checked(), w.options());
        let refused = consumer.bind(&w.js).await.unwrap_err();
        assert!(
            matches!(&refused, ConsumeError::QuarantineUnstored { why, .. } if why.contains("interest retention")),
            "{refused}"
        );
        w.cleanup().await;
    });
}

/// A quarantine stream that answers no publish (`no_ack`), or keeps one message per subject
/// and discards the oldest: the first had each copy waited for in vain and published again at
/// every delivery; the second dropped earlier copies whose originals were acked. Refused.
#[test]
fn a_quarantine_stream_that_acks_nothing_or_drops_old_copies_is_refused_at_start() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        let cases = [
            (
                stream::Config {
                    no_ack: true,
                    ..stream::Config::default()
                },
                "no_ack",
            ),
            (
                stream::Config {
                    max_messages_per_subject: 1,
                    ..stream::Config::default()
                },
                "discards the oldest",
            ),
            // `discard = new` alone still drops the oldest per subject.
            (
                stream::Config {
                    max_messages_per_subject: 1,
                    discard: stream::DiscardPolicy::New,
                    ..stream::Config::default()
                },
                "discards the oldest",
            ),
        ];
        for (config, why) in cases {
            w.js.delete_stream(&w.quarantine_stream).await.unwrap();
            w.js.create_stream(stream::Config {
                name: w.quarantine_stream.clone(),
                subjects: vec![w.quarantine_subject.clone()],
                ..config
            })
            .await
            .unwrap();
            let consumer = Consumer::new(w.db.checked(), w.options());
            let refused = consumer.bind(&w.js).await.unwrap_err();
            assert!(
                matches!(&refused, ConsumeError::QuarantineUnstored { why: said, .. } if said.contains(why)),
                "{refused}"
            );
        }
        w.cleanup().await;
    });
}

/// A handler's error of 200 KB: copied whole into `Oncebox-Detail`, it took the copy's headers
/// past JetStream's 64 KiB, the stream refused the copy, and the message was NAKed and came
/// back forever. Cut, the copy is stored at once.
#[test]
fn a_handler_error_of_200_kb_is_quarantined_once_with_a_short_detail() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        let apply =
            from_fn(|_, _| async { Err(ProcessError::Handler("e".repeat(200_000).into())) });
        let mut options = w.options();
        options.retry.max_attempts = 1;
        w.publish(Some("evt_loud"), r#"{"amount":1}"#).await;
        let mut consumer = start(&url, Consumer::new(apply, options));
        w.wait(&mut consumer, |c| c.quarantined >= 1).await;
        w.wait_all_acked().await;
        // Stopped cleanly: the consumer was still connected and pulling.
        let done = consumer.stop().await;

        assert_eq!((done.quarantined, done.requeued), (1, 0));
        assert_eq!(w.quarantined().await, ["handler-failed"]);
        let q = w.js.get_stream(&w.quarantine_stream).await.unwrap();
        let copy = q.get_raw_message(1).await.unwrap();
        let detail = header(&copy.headers, "Oncebox-Detail").unwrap();
        assert!(detail.len() <= MAX_DETAIL, "{} bytes", detail.len());
        assert!(detail.ends_with("[cut: 200032 bytes in all]"), "{detail}");
        assert_eq!(
            header(&copy.headers, KEY_HEADER).as_deref(),
            Some("evt_loud")
        );
        w.cleanup().await;
    });
}
