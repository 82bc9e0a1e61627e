//! What the consumer checks and decides when it binds: a retry policy without a pause, a
//! quarantine it would read back or no stream stores and a durable that acks or drops messages
//! on its own are refused before anything is pulled; a durable it creates starts at the
//! retention horizon, not at the stream's first message, except on a work-queue stream.

use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, pull};
use async_nats::jetstream::stream;
use oncebox_nats::{ConsumeError, Consumer, DeliverFrom, DurableProblem};
use oncebox_testkit::{run, service_url};

use crate::support::{World, create_stream, start};

/// A quarantine subject no stream stores, or a wildcard, is refused before anything is
/// pulled: every quarantine would fail with no responders and its message come back forever.
#[test]
fn a_quarantine_no_stream_stores_is_refused_at_start() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        let id = uuid::Uuid::new_v4().simple().to_string();
        for (subject, why) in [
            (format!("oncebox.test.{id}.nowhere"), "no stream stores it"),
            (format!("{}.*", w.quarantine_subject), "it holds a wildcard"),
        ] {
            let mut o = w.options();
            o.quarantine_subject = subject.clone();
            let refused = Consumer::new(w.db.checked(), o)
                .bind(&w.js)
                .await
                .unwrap_err();
            assert!(
                matches!(&refused, ConsumeError::QuarantineUnstored { subject: s, why: w } if *s == subject && w == why),
                "{subject}: {refused}"
            );
        }
        // The world's own quarantine, which a stream stores, binds.
        let bound = Consumer::new(w.db.checked(), w.options()).bind(&w.js).await;
        assert!(bound.is_ok());
        w.cleanup().await;
    });
}

/// A retry policy with no pause would NAK every message back at once through a store outage
/// (NAK with no delay): refused before anything is asked of the server.
#[test]
fn a_retry_delay_under_the_floor_is_refused_at_start() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        let mut o = w.options();
        o.retry.delay = Duration::ZERO;
        let consumer = Consumer::new(w.db.checked(), o);
        let ran = consumer.run(&w.js, std::future::pending());
        let refused = tokio::time::timeout(Duration::from_secs(5), ran)
            .await
            .expect("refused at start, not consuming")
            .unwrap_err();
        assert!(matches!(refused, ConsumeError::Retry(_)), "{refused}");
        assert!(refused.to_string().contains("less than 10ms"), "{refused}");
        let s = w.js.get_stream(&w.stream).await.unwrap();
        assert!(
            s.consumer_info(&w.durable).await.is_err(),
            "a refused consumer creates no durable"
        );
        w.cleanup().await;
    });
}

#[test]
fn a_quarantine_the_consumer_would_read_back_is_refused_at_start() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        // A stream that keeps its events and its own quarantine under one wildcard: without
        // the check, every quarantined copy would be delivered again, fail the same way and be
        // quarantined again, without end.
        let id = uuid::Uuid::new_v4().simple().to_string();
        let (stream, base) = (format!("ONCEBOX_TESTRB_{id}"), format!("oncebox.test.{id}"));
        create_stream(&w.js, &stream, &format!("{base}.>")).await;
        let quarantine = format!("{base}.quarantine");
        let options = |filter: Option<String>| {
            let mut o = w.options();
            o.stream = stream.clone();
            o.quarantine_subject = quarantine.clone();
            o.filter_subject = filter;
            o
        };
        for filter in [
            None,
            Some(format!("{base}.*")),
            Some(format!("{base}.>")),
            Some(quarantine.clone()),
        ] {
            let consumer = Consumer::new(w.db.checked(), options(filter.clone()));
            let refused = consumer.bind(&w.js).await.unwrap_err();
            assert!(
                matches!(refused, ConsumeError::QuarantineReadBack { .. }),
                "{filter:?}: {refused}"
            );
            assert!(refused.to_string().contains(&quarantine), "{refused}");
        }
        let s = w.js.get_stream(&stream).await.unwrap();
        assert!(
            s.consumer_info(&w.durable).await.is_err(),
            "a refused consumer creates no durable"
        );

        // A filter that leaves the quarantine out reads the same stream safely.
        let safe = options(Some(format!("{base}.events")));
        Consumer::new(w.db.checked(), safe.clone())
            .bind(&w.js)
            .await
            .unwrap();
        // But an existing durable's own filter is what the server applies: one without a
        // filter reads the quarantine back whatever the options ask for.
        s.delete_consumer(&w.durable).await.unwrap();
        s.create_consumer(pull::Config {
            durable_name: Some(w.durable.clone()),
            ack_policy: AckPolicy::Explicit,
            ..pull::Config::default()
        })
        .await
        .unwrap();
        let refused = Consumer::new(w.db.checked(), safe)
            .bind(&w.js)
            .await
            .unwrap_err();
        assert!(
            matches!(&refused, ConsumeError::QuarantineReadBack { filter, .. } if filter == "no filter"),
            "{refused}"
        );
        eprintln!("nats quarantine read back: refused with {refused}");
        w.js.delete_stream(&stream).await.unwrap();
        w.cleanup().await;
    });
}

#[test]
fn an_existing_durable_that_acks_or_drops_on_its_own_is_refused() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        w.publish(Some("evt_kept"), r#"{"amount":1}"#).await;
        let s = w.js.get_stream(&w.stream).await.unwrap();
        for (config, problem) in [
            (
                pull::Config {
                    ack_policy: AckPolicy::All,
                    ..pull::Config::default()
                },
                DurableProblem::AckPolicy(AckPolicy::All),
            ),
            (
                pull::Config {
                    ack_policy: AckPolicy::None,
                    ..pull::Config::default()
                },
                DurableProblem::AckPolicy(AckPolicy::None),
            ),
            (
                pull::Config {
                    ack_policy: AckPolicy::Explicit,
                    max_deliver: 3,
                    ..pull::Config::default()
                },
                DurableProblem::MaxDeliver(3),
            ),
            (
                pull::Config {
                    ack_policy: AckPolicy::Explicit,
                    headers_only: true,
                    ..pull::Config::default()
                },
                DurableProblem::HeadersOnly,
            ),
        ] {
            let _ = s.delete_consumer(&w.durable).await;
            s.create_consumer(pull::Config {
                durable_name: Some(w.durable.clone()),
                ..config
            })
            .await
            .unwrap();
            let apply = w.db.checked();
            let consumer = Consumer::new(apply.clone(), w.options());
            let ran = consumer.run(&w.js, std::future::pending());
            let refused = tokio::time::timeout(Duration::from_secs(5), ran)
                .await
                .expect("refused at start, not consuming")
                .unwrap_err();
            match &refused {
                ConsumeError::UnsafeDurable { problem: p, .. } => assert_eq!(p, &problem),
                other => panic!("expected {problem}, got {other}"),
            }
            eprintln!("nats unsafe durable: refused with {refused}");
            assert!(refused.to_string().contains(&w.durable), "{refused}");
            // Refused before a message was pulled: nothing applied, nothing acknowledged.
            let info = w.consumer_info().await;
            assert_eq!(info.delivered.stream_sequence, 0);
            assert_eq!(
                apply.calls.load(std::sync::atomic::Ordering::SeqCst),
                0,
                "nothing applied"
            );
        }
        w.cleanup().await;
    });
}

/// A watermark treats every sequence at or below the highest committed one as a replay, so
/// messages must be applied in order: an existing durable that hands out several at a time
/// (a later one committed first would make an earlier one look replayed, acked unapplied) is
/// refused for a watermarked consumer, before anything is pulled; with one at a time it binds.
#[test]
fn an_existing_durable_with_several_messages_in_hand_is_refused_for_a_watermark() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        w.publish(Some("evt_kept"), r#"{"amount":1}"#).await;
        let s = w.js.get_stream(&w.stream).await.unwrap();
        let durable = |max_ack_pending| pull::Config {
            durable_name: Some(w.durable.clone()),
            ack_policy: AckPolicy::Explicit,
            max_ack_pending,
            ..pull::Config::default()
        };
        s.create_consumer(durable(64)).await.unwrap();
        let mut options = w.options();
        options.watermark = true;
        let apply = w.db.checked();
        let refused = Consumer::new(apply.clone(), options.clone())
            .bind(&w.js)
            .await
            .unwrap_err();
        assert!(
            matches!(&refused, ConsumeError::Unordered { found: 64, .. }),
            "{refused}"
        );
        eprintln!("nats unordered durable: refused with {refused}");
        assert_eq!(w.consumer_info().await.delivered.stream_sequence, 0);
        s.delete_consumer(&w.durable).await.unwrap();
        s.create_consumer(durable(1)).await.unwrap();
        Consumer::new(apply, options).bind(&w.js).await.unwrap();
        w.cleanup().await;
    });
}

#[test]
fn a_new_durable_starts_at_the_retention_horizon_not_at_the_first_message() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        // Several seconds: the new messages must still be inside it when the durable is
        // created, after the consumer's task has started, connected and bound, which on a
        // loaded machine takes a while.
        let horizon = Duration::from_secs(5);
        for id in ["evt_old_1", "evt_old_2"] {
            w.publish(Some(id), r#"{"amount":1}"#).await;
        }
        // Older than the horizon, by the server's own timestamp, before the durable exists.
        let s = w.js.get_stream(&w.stream).await.unwrap();
        let stored = s.get_raw_message(2).await.unwrap().time;
        let aged = horizon + Duration::from_millis(200);
        let deadline = tokio::time::Instant::now() + horizon + Duration::from_secs(10);
        while async_nats::datetime::now() - stored < aged {
            assert!(tokio::time::Instant::now() < deadline, "the clock stands");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for id in ["evt_new_1", "evt_new_2"] {
            w.publish(Some(id), r#"{"amount":1}"#).await;
        }

        let mut options = w.options();
        options.deliver_from = DeliverFrom::Retention(horizon);
        let apply = w.db.checked();
        let mut consumer = start(&url, Consumer::new(apply.clone(), options.clone()));
        w.wait(&mut consumer, |c| c.applied >= 2).await;
        let info = w.wait_all_acked().await;
        let done = consumer.stop().await;
        assert_eq!(
            (w.db.effects("evt_new_1"), w.db.effects("evt_new_2")),
            (1, 1)
        );
        assert_eq!(
            (w.db.effects("evt_old_1"), w.db.effects("evt_old_2")),
            (0, 0)
        );
        assert_eq!((done.applied, done.acked), (2, 2));
        assert!(matches!(
            info.config.deliver_policy,
            DeliverPolicy::ByStartTime { .. }
        ));

        // The old messages are there: a durable asked to read everything gets them.
        options.durable = format!("{}-all", w.durable);
        options.deliver_from = DeliverFrom::All;
        let mut all = start(&url, Consumer::new(apply.clone(), options));
        w.wait(&mut all, |c| c.acked >= 4).await;
        let everything = all.stop().await;
        eprintln!(
            "nats new durable: horizon {horizon:?} delivered {} of 4 (the 2 older not); from the start: applied {}, duplicates {}",
            done.acked, everything.applied, everything.duplicates
        );
        assert_eq!((everything.applied, everything.duplicates), (2, 2));
        w.cleanup().await;
    });
}

/// A work-queue stream takes only durables that read from its first message (error 10101 for
/// a start time): the consumer reads it so, whatever its horizon, and each acknowledged
/// message leaves the stream.
#[test]
fn a_work_queue_stream_is_consumed_from_its_first_message() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        w.js.delete_stream(&w.stream).await.unwrap();
        w.js.create_stream(stream::Config {
            name: w.stream.clone(),
            subjects: vec![w.subject.clone()],
            retention: stream::RetentionPolicy::WorkQueue,
            ..stream::Config::default()
        })
        .await
        .unwrap();
        for id in ["evt_q1", "evt_q2"] {
            w.publish(Some(id), r#"{"amount":1}"#).await;
        }
        let mut options = w.options();
        options.deliver_from = DeliverFrom::Retention(Duration::from_secs(60));
        let mut consumer = start(&url, Consumer::new(w.db.checked(), options));
        let counts = w.wait(&mut consumer, |c| c.acked >= 2).await;
        let info = w.wait_all_acked().await;
        assert!(matches!(info.config.deliver_policy, DeliverPolicy::All));
        let done = consumer.stop().await;
        assert_eq!((counts.applied, done.applied), (2, 2));
        assert_eq!((w.db.effects("evt_q1"), w.db.effects("evt_q2")), (1, 1));
        let stream = w.js.get_stream(&w.stream).await.unwrap();
        assert_eq!(
            stream.cached_info().state.messages,
            0,
            "acked messages left"
        );
        w.cleanup().await;
    });
}

/// An existing durable that caps one pull's batch and wait below what the consumer asks for:
/// the consumer pulls within the caps. Asking past them, the server ended every pull with an
/// error, and the consumer ended at each start without consuming anything.
#[test]
fn an_existing_durable_with_smaller_pull_caps_is_consumed_within_them() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        let ids = ["evt_c1", "evt_c2", "evt_c3", "evt_c4", "evt_c5"];
        for id in ids {
            w.publish(Some(id), r#"{"amount":1}"#).await;
        }
        let s = w.js.get_stream(&w.stream).await.unwrap();
        s.create_consumer(pull::Config {
            durable_name: Some(w.durable.clone()),
            ack_policy: AckPolicy::Explicit,
            max_batch: 2,
            max_expires: Duration::from_secs(2),
            ..pull::Config::default()
        })
        .await
        .unwrap();
        let apply = w.db.checked();
        let mut consumer = start(&url, Consumer::new(apply.clone(), w.options()));
        w.wait(&mut consumer, |c| c.applied >= 5).await;
        w.wait_all_acked().await;
        let done = consumer.stop().await;
        assert_eq!((done.applied, done.acked), (5, 5));
        for id in ids {
            assert_eq!(w.db.effects(id), 1, "{id}");
        }
        w.cleanup().await;
    });
}
