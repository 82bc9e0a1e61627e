//! The test world: a unique stream and quarantine stream on the server (deleted at the end)
//! next to the testkit's SQLite store, whose handler records one effect row per key and gives
//! the figures D, L and F.

use std::path::PathBuf;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, consumer, stream};
use oncebox_core::Source;
use oncebox_core::consume::{Apply, Counts, KeyRule, MessageRules, RetryPolicy};
use oncebox_nats::{ConsumeError, Consumer, ConsumerOptions};
use oncebox_sqlite::Options;
use oncebox_testkit::consume::{Running, SOURCE, Store};

/// The tests' key header. Not `Nats-Msg-Id`: the stream's own publish dedup window would
/// swallow the duplicates these tests publish on purpose, and oncebox never relies on it.
pub const KEY_HEADER: &str = "Event-Id";

/// One test's streams and database.
pub struct World {
    pub js: jetstream::Context,
    pub stream: String,
    pub subject: String,
    pub quarantine_stream: String,
    pub quarantine_subject: String,
    pub durable: String,
    pub db: Store,
}

impl World {
    pub async fn new(url: &str) -> World {
        World::with_options(url, Options::new).await
    }

    pub async fn with_options(url: &str, options: impl FnOnce(PathBuf) -> Options) -> World {
        let js = connect(url).await;
        let id = uuid::Uuid::new_v4().simple().to_string();
        let (stream, subject) = (
            format!("ONCEBOX_TEST_{id}"),
            format!("oncebox.test.{id}.events"),
        );
        let quarantine_stream = format!("ONCEBOX_TESTQ_{id}");
        let quarantine_subject = format!("oncebox.test.{id}.quarantine");
        for (name, subject) in [
            (&stream, &subject),
            (&quarantine_stream, &quarantine_subject),
        ] {
            create_stream(&js, name, subject).await;
        }
        World {
            js,
            stream,
            subject,
            quarantine_stream,
            quarantine_subject,
            durable: format!("oncebox-{id}"),
            db: Store::open(options).await,
        }
    }

    pub fn options(&self) -> ConsumerOptions {
        let rules = MessageRules::new(
            Source::new(SOURCE).unwrap(),
            KeyRule::Header(KEY_HEADER.into()),
        );
        let mut o =
            ConsumerOptions::new(&self.stream, &self.durable, rules, &self.quarantine_subject);
        // Long enough that no test sees a redelivery it did not ask for.
        o.ack_wait = Duration::from_secs(10);
        o.retry = RetryPolicy {
            delay: Duration::from_millis(20),
            uncertain_delay: Duration::from_millis(20),
            max_attempts: 3,
        };
        o
    }

    /// Publishes with the key header `id` (none if `None`) and waits for the stream's ack.
    pub async fn publish(&self, id: Option<&str>, body: &str) {
        let mut headers = HeaderMap::new();
        if let Some(id) = id {
            headers.insert(KEY_HEADER, id);
        }
        self.publish_with(headers, body).await;
    }

    /// Publishes with these headers and waits for the stream's ack.
    pub async fn publish_with(&self, headers: HeaderMap, body: &str) {
        self.js
            .publish_with_headers(self.subject.clone(), headers, body.to_owned().into())
            .await
            .unwrap()
            .await
            .unwrap();
    }

    pub async fn consumer_info(&self) -> consumer::Info {
        let stream = self.js.get_stream(&self.stream).await.unwrap();
        stream.consumer_info(&self.durable).await.unwrap()
    }

    /// Deletes the consumed stream (its durable goes with it) and creates it again under the
    /// same name: its sequences start at 1 again.
    pub async fn recreate_stream(&self) {
        self.js.delete_stream(&self.stream).await.unwrap();
        create_stream(&self.js, &self.stream, &self.subject).await;
    }

    /// Waits until the server holds nothing for the consumer: every message acknowledged.
    pub async fn wait_all_acked(&self) -> consumer::Info {
        let mut info = self.consumer_info().await;
        for _ in 0..500 {
            if info.num_ack_pending == 0 && info.num_pending == 0 {
                return info;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            info = self.consumer_info().await;
        }
        panic!("still pending: {info:?}");
    }

    /// Waits until the consumer's counts satisfy `done`; when stuck, fails with what the
    /// server says too.
    pub async fn wait(
        &self,
        consumer: &mut Running<ConsumeError>,
        done: impl FnMut(&Counts) -> bool,
    ) -> Counts {
        let server = async { format!("server: {:?}", self.consumer_info().await) };
        consumer.wait(done, server).await
    }

    /// The quarantined messages' reasons, in stream order.
    pub async fn quarantined(&self) -> Vec<String> {
        let stream = self.js.get_stream(&self.quarantine_stream).await.unwrap();
        let last = stream.get_info().await.unwrap().state.last_sequence;
        let mut out = Vec::new();
        for seq in 1..=last {
            let m = stream.get_raw_message(seq).await.unwrap();
            let reason = m.headers.get("Oncebox-Reason").expect("a reason header");
            out.push(reason.to_string());
        }
        out.sort();
        out
    }

    pub async fn cleanup(self) {
        for s in [&self.stream, &self.quarantine_stream] {
            let _ = self.js.delete_stream(s).await;
        }
    }
}

/// A stream keeping `subject` for ten minutes.
pub async fn create_stream(js: &jetstream::Context, name: &str, subject: &str) {
    js.create_stream(stream::Config {
        name: name.to_owned(),
        subjects: vec![subject.to_owned()],
        max_age: Duration::from_secs(600),
        ..stream::Config::default()
    })
    .await
    .unwrap();
}

pub async fn connect(url: &str) -> jetstream::Context {
    jetstream::new(async_nats::connect(url).await.unwrap())
}

/// Runs `consumer` on its own connection until stopped.
pub fn start<A: Apply>(url: &str, consumer: Consumer<A>) -> Running<ConsumeError> {
    let url = url.to_owned();
    Running::spawn(consumer.counts(), move |stopped| async move {
        let js = connect(&url).await;
        consumer
            .run(&js, async move {
                let _ = stopped.await;
            })
            .await
    })
}
