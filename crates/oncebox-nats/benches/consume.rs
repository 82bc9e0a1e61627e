//! Consumer benchmark: messages/s through the JetStream consumer into the SQLite inbox (one
//! effect row per new key, `synchronous=FULL`), against the same consumer loop acknowledging
//! every message without any dedup, on the same backlog with 10% duplicates.
//!
//! `ONCEBOX_NATS_URL=nats://127.0.0.1:4222 cargo bench -p oncebox-nats --bench consume`
//! (options: `-- --messages N --batch N --rounds N`, `--inbox-only 1` to profile the inbox path
//! alone). Each round fills a fresh stream per loop with new keys, then times each drain from
//! the consumer's start to the last ack; the loops take turns, and the ratio is the median of
//! the rounds'. Prints figures; asserts only that every key was applied exactly once, never
//! anything about time.

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, stream};
use oncebox_core::Source;
use oncebox_core::consume::{Apply, KeyRule, MessageRules};
use oncebox_nats::{Consumer, ConsumerOptions, InboxHandler};
use oncebox_sqlite::Options;
use oncebox_testkit::consume::{
    Drained, Loop, SOURCE, Store, ack_all, backlog, backlog_body, effect, report, rounds,
};
use oncebox_testkit::{bench_arg, service_url};

/// The allocator `oncebox consume` runs with, so both loops are measured as shipped.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A fresh stream holding the backlog. The key travels in `Event-Id`, not `Nats-Msg-Id`, so
/// the stream's publish window does not drop the duplicates the benchmark is about.
async fn fill(js: &jetstream::Context, name: &str, ids: &[String]) {
    let subject = format!("{}.events", name.to_lowercase());
    js.create_stream(stream::Config {
        name: name.to_owned(),
        subjects: vec![subject.clone()],
        max_age: Duration::from_secs(600),
        ..stream::Config::default()
    })
    .await
    .unwrap();
    // The context lets only so many publish acks be outstanding: settle them in chunks.
    let mut acks: Vec<jetstream::context::PublishAckFuture> = Vec::with_capacity(1000);
    for id in ids {
        if acks.len() == 1000 {
            for ack in acks.drain(..) {
                ack.await.unwrap();
            }
        }
        let mut headers = HeaderMap::new();
        headers.insert("Event-Id", id.as_str());
        acks.push(
            js.publish_with_headers(subject.clone(), headers, backlog_body(id).into())
                .await
                .unwrap(),
        );
    }
    for ack in acks {
        ack.await.unwrap();
    }
}

/// Drains `stream` through a consumer applying with `apply`; returns messages/s.
async fn drain<A: Apply>(
    js: &jetstream::Context,
    stream: &str,
    n: usize,
    batch: usize,
    apply: A,
) -> Drained {
    let rules = MessageRules::new(
        Source::new(SOURCE).unwrap(),
        KeyRule::Header("Event-Id".into()),
    );
    let mut options = ConsumerOptions::new(stream, "bench", rules, "oncebox.bench.quarantine");
    options.batch = batch;
    options.max_ack_pending = i64::try_from(batch * 4).unwrap_or(i64::MAX);
    let consumer = Consumer::new(apply, options);
    oncebox_testkit::consume::drain(consumer.counts(), n, |stopped| {
        consumer.run(js, async move {
            let _ = stopped.await;
        })
    })
    .await
}

#[tokio::main]
async fn main() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    let n = bench_arg("--messages", 50_000);
    let batch = bench_arg("--batch", 512);
    let round_count = bench_arg("--rounds", 5).max(1);
    // `--inbox-only 1` skips the no-dedup loop, to profile the inbox path alone.
    let inbox_only = bench_arg("--inbox-only", 0) != 0;
    let unique = backlog(n, 0)
        .iter()
        .collect::<std::collections::HashSet<_>>()
        .len();
    let js = jetstream::new(async_nats::connect(&url).await.unwrap());
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    let store = Store::open(Options::new).await;
    let handler = InboxHandler::new(store.inbox.clone(), effect);

    let measured = rounds(round_count, |round, which| {
        let (js, handler, run_id) = (&js, handler.clone(), &run_id);
        async move {
            if which == Loop::Plain && inbox_only {
                return Drained::SKIPPED;
            }
            let name = format!("ONCEBOX_BENCH_{which:?}_{run_id}_{round}").to_uppercase();
            fill(js, &name, &backlog(n, round)).await;
            let drained = match which {
                Loop::Plain => drain(js, &name, n, batch, ack_all()).await,
                Loop::Inbox => drain(js, &name, n, batch, handler).await,
            };
            let _ = js.delete_stream(&name).await;
            drained
        }
    })
    .await;

    let title = format!(
        "NATS JetStream consumer, {n} messages per round ({unique} keys, 10% duplicates), batch {batch}:"
    );
    report(&title, &measured, &store, unique * round_count).await;
}
