//! Consumer benchmark: messages/s through the RabbitMQ consumer into the SQLite inbox (one
//! effect row per new key, `synchronous=FULL`), against the same consumer loop acknowledging
//! every message without any dedup, on the same backlog with 10% duplicates.
//!
//! `ONCEBOX_AMQP_URL=amqp://guest:guest@127.0.0.1:5672/%2f cargo bench -p oncebox-amqp --bench
//! consume` (options: `-- --messages N --prefetch N --rounds N`). Each round fills a fresh queue
//! per loop with new keys, then times each drain from the consumer's start to the last ack; the
//! loops take turns, and the ratio is the median of the rounds'. Prints figures; asserts only
//! that every key was applied exactly once, never anything about time.

use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use oncebox_amqp::{Consumer, ConsumerOptions, InboxHandler};
use oncebox_core::Source;
use oncebox_core::consume::{Apply, KeyRule, MessageRules};
use oncebox_sqlite::Options;
use oncebox_testkit::consume::{
    Drained, Loop, SOURCE, Store, ack_all, backlog, backlog_body, effect, report, rounds,
};
use oncebox_testkit::{bench_arg, service_url};

/// The allocator `oncebox consume` runs with, so both loops are measured as shipped.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

async fn fill(channel: &Channel, queue: &str, ids: &[String]) {
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    for id in ids {
        // Confirms are awaited all at once below.
        drop(
            channel
                .basic_publish(
                    "".into(),
                    queue.into(),
                    BasicPublishOptions::default(),
                    backlog_body(id).as_bytes(),
                    BasicProperties::default().with_message_id(id.as_str().into()),
                )
                .await
                .unwrap(),
        );
    }
    channel.wait_for_confirms().await.unwrap();
}

/// Drains `queue` through a consumer applying with `apply`; returns messages/s.
async fn drain<A: Apply>(
    conn: &Connection,
    queue: &str,
    n: usize,
    prefetch: u16,
    apply: A,
) -> Drained {
    let rules = MessageRules::new(Source::new(SOURCE).unwrap(), KeyRule::MessageId);
    // An exchange every vhost has: no message of the backlog is ever quarantined, and the
    // default exchange ("") would route a quarantined copy back into the queue, which the
    // consumer refuses at start.
    let mut options = ConsumerOptions::new(queue, rules, "amq.direct");
    options.prefetch = prefetch;
    let consumer = Consumer::new(apply, options);
    oncebox_testkit::consume::drain(consumer.counts(), n, |stopped| {
        consumer.run(conn, async move {
            let _ = stopped.await;
        })
    })
    .await
}

#[tokio::main]
async fn main() {
    let Some(url) = service_url("ONCEBOX_AMQP_URL") else {
        return;
    };
    let n = bench_arg("--messages", 50_000);
    let prefetch = u16::try_from(bench_arg("--prefetch", 1024)).unwrap_or(1024);
    let round_count = bench_arg("--rounds", 5).max(1);
    let unique = backlog(n, 0)
        .iter()
        .collect::<std::collections::HashSet<_>>()
        .len();
    let conn = Connection::connect(&url, ConnectionProperties::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    let store = Store::open(Options::new).await;
    let handler = InboxHandler::new(store.inbox.clone(), effect);

    let measured = rounds(round_count, |round, which| {
        let (conn, channel, handler, run_id) = (&conn, &channel, handler.clone(), &run_id);
        async move {
            let queue = format!("oncebox-bench-{which:?}-{run_id}-{round}").to_lowercase();
            fill(channel, &queue, &backlog(n, round)).await;
            let drained: Drained = match which {
                Loop::Plain => drain(conn, &queue, n, prefetch, ack_all()).await,
                Loop::Inbox => drain(conn, &queue, n, prefetch, handler).await,
            };
            let _ = channel
                .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                .await;
            drained
        }
    })
    .await;
    let _ = conn.close(200, "done".into()).await;

    let title = format!(
        "RabbitMQ consumer, {n} messages per round ({unique} keys, 10% duplicates), prefetch {prefetch}:"
    );
    report(&title, &measured, &store, unique * round_count).await;
}
