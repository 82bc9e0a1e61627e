//! `InboxHandler` behind a real consumer: a NATS JetStream durable in watermark mode hands each
//! message to the PostgreSQL inbox, and acknowledges only what the store answered. Needs
//! `ONCEBOX_NATS_URL` as well.

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, stream};
use oncebox_core::Source;
use oncebox_core::consume::{KeyRule, MessageRules, RetryPolicy};
use oncebox_nats::{Consumer, ConsumerOptions};
use oncebox_postgres::sqlx;
use oncebox_testkit::consume::Running;

use crate::consume::{consumer, effects};
use crate::harness::url;

const KEY_HEADER: &str = "Event-Id";

async fn connect(url: &str) -> jetstream::Context {
    jetstream::new(async_nats::connect(url).await.expect("nats"))
}

async fn create_stream(js: &jetstream::Context, name: &str, subject: &str) {
    js.create_stream(stream::Config {
        name: name.to_owned(),
        subjects: vec![subject.to_owned()],
        max_age: Duration::from_secs(600),
        ..stream::Config::default()
    })
    .await
    .expect("stream");
}

#[test]
fn a_nats_consumer_applies_through_the_postgres_inbox_once_and_keeps_the_watermark() {
    let (Some(_), Some(nats)) = (url(), oncebox_testkit::service_url("ONCEBOX_NATS_URL")) else {
        return;
    };
    oncebox_testkit::run(async move {
        let (pg, apply) = consumer().await;
        let js = connect(&nats).await;
        let id = uuid::Uuid::new_v4().simple().to_string();
        let (name, subject) = (format!("ONCEBOX_PG_{id}"), format!("oncebox.pg.{id}"));
        let (qname, qsubject) = (format!("ONCEBOX_PGQ_{id}"), format!("oncebox.pgq.{id}"));
        create_stream(&js, &name, &subject).await;
        create_stream(&js, &qname, &qsubject).await;
        // Applied, refused, a duplicate of the first, applied, and a conflict with it.
        let messages = [
            ("a", r#"{"n":1}"#),
            ("b", r#"{"do":"refuse"}"#),
            ("a", r#"{"n":1}"#),
            ("k", r#"{"n":1}"#),
            ("k", r#"{"n":2}"#),
        ];
        for (key, body) in messages {
            let mut headers = HeaderMap::new();
            headers.insert(KEY_HEADER, key);
            js.publish_with_headers(subject.clone(), headers, body.to_owned().into())
                .await
                .expect("publish")
                .await
                .expect("stored");
        }

        let rules = MessageRules::new(
            Source::new("shop").expect("source"),
            KeyRule::Header(KEY_HEADER.into()),
        );
        let mut options = ConsumerOptions::new(&name, &format!("pg-{id}"), rules, &qsubject);
        options.watermark = true;
        options.max_ack_pending = 1;
        options.retry = RetryPolicy {
            delay: Duration::from_millis(20),
            uncertain_delay: Duration::from_millis(20),
            max_attempts: 3,
        };
        let consumer = Consumer::new(apply, options);
        let nats = nats.clone();
        let mut running = Running::spawn(consumer.counts(), move |stopped| async move {
            let js = connect(&nats).await;
            consumer.run(&js, async move { drop(stopped.await) }).await
        });
        let counts = running
            .wait(|c| c.acked == 5, async {
                "all five acknowledged".to_owned()
            })
            .await;
        let counts_at_stop = running.stop().await;
        assert_eq!(counts, counts_at_stop, "nothing after the five");
        assert_eq!(
            (counts.applied, counts.duplicates, counts.quarantined),
            (3, 1, 1),
            "a, b (refused) and k applied, a's duplicate, k's conflict: {counts:?}"
        );
        assert_eq!(effects(&pg, "a").await, 1);
        assert_eq!(effects(&pg, "k").await, 1);
        assert_eq!(effects(&pg, "b").await, 0);
        let watermark: Option<i64> =
            sqlx::query_scalar("SELECT max(position) FROM oncebox_offsets")
                .fetch_one(pg.inbox.pool())
                .await
                .expect("watermark");
        assert_eq!(
            watermark,
            Some(5),
            "every acknowledged message settled its offset"
        );
        for s in [&name, &qname] {
            let _ = js.delete_stream(s).await;
        }
    });
}
