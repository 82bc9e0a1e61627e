//! Consumer benchmark: messages/s through the RabbitMQ consumer into the SQLite inbox (one
//! effect row per new key, `synchronous=FULL`), against the same consumer loop acknowledging
//! every message without any dedup, on the same backlog with 10% duplicates.
//!
//! `ONCEBOX_AMQP_URL=amqp://guest:guest@127.0.0.1:5672/%2f cargo bench -p oncebox-amqp --bench
//! consume` (options: `-- --messages N --prefetch N`). Each run fills a fresh queue first, then
//! times the drain from the consumer's start to the last ack. Prints figures; asserts only that
//! every key was applied exactly once, never anything about time.

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::time::Instant;

use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use oncebox_amqp::{Consumer, ConsumerOptions, InboxHandler};
use oncebox_core::consume::{Apply, KeyRule, MessageRules, from_fn};
use oncebox_core::{Event, Processed, Response, Source};
use oncebox_sqlite::{HandlerError, Inbox, Options, Tx};
use oncebox_testkit::{bench_arg, service_url};

fn effect(tx: &mut Tx<'_>, event: &Event) -> Result<Response, HandlerError> {
    tx.conn().execute(
        "INSERT INTO effects (event_id) VALUES (?1)",
        [event.key.event_id.as_str()],
    )?;
    Ok(Response::completed("ok"))
}

/// Every tenth message repeats an earlier one (same id, same body).
fn ids(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let k = if i % 10 == 9 { i / 2 } else { i };
            format!("evt_{k}")
        })
        .collect()
}

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
        let body = format!(r#"{{"id":"{id}","amount":100,"currency":"EUR"}}"#);
        // Confirms are awaited all at once below.
        drop(
            channel
                .basic_publish(
                    "".into(),
                    queue.into(),
                    BasicPublishOptions::default(),
                    body.as_bytes(),
                    BasicProperties::default().with_message_id(id.as_str().into()),
                )
                .await
                .unwrap(),
        );
    }
    channel.wait_for_confirms().await.unwrap();
}

/// Drains `queue` through a consumer applying with `apply`; returns messages/s.
async fn drain<A: Apply>(conn: &Connection, queue: &str, n: usize, prefetch: u16, apply: A) -> f64 {
    let rules = MessageRules::new(Source::new("shop").unwrap(), KeyRule::MessageId);
    let mut options = ConsumerOptions::new(queue, rules, "");
    options.prefetch = prefetch;
    let consumer = Consumer::new(apply, options);
    let mut counts = consumer.counts();
    let started = Instant::now();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = consumer.run(conn, async move {
        let _ = stopped.await;
    });
    let wait = async {
        counts.wait_for(|c| c.acked == n as u64).await.unwrap();
        let elapsed = started.elapsed();
        let _ = stop.send(());
        elapsed
    };
    let (ran, elapsed) = tokio::join!(run, wait);
    ran.unwrap();
    n as f64 / elapsed.as_secs_f64()
}

#[tokio::main]
async fn main() {
    let Some(url) = service_url("ONCEBOX_AMQP_URL") else {
        return;
    };
    let n = bench_arg("--messages", 20_000);
    let prefetch = u16::try_from(bench_arg("--prefetch", 1024)).unwrap_or(1024);
    let ids = ids(n);
    let unique = ids.iter().collect::<std::collections::HashSet<_>>().len();
    let conn = Connection::connect(&url, ConnectionProperties::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let run_id = uuid::Uuid::new_v4().simple().to_string();

    let plain_q = format!("oncebox-bench-plain-{run_id}");
    fill(&channel, &plain_q, &ids).await;
    let ack_all = from_fn(|_event, _position| async {
        Ok::<_, oncebox_core::ProcessError>(Processed::Applied(Response::completed("")))
    });
    let plain = drain(&conn, &plain_q, n, prefetch, ack_all).await;

    let dir = tempfile::tempdir().unwrap();
    let inbox = Inbox::open(Options::new(dir.path().join("bench.db"))).unwrap();
    inbox
        .write(|c| c.execute_batch("CREATE TABLE effects (event_id TEXT NOT NULL)"))
        .await
        .unwrap();
    let inbox_q = format!("oncebox-bench-inbox-{run_id}");
    fill(&channel, &inbox_q, &ids).await;
    let handler = InboxHandler::new(inbox.clone(), effect);
    let dedup = drain(&conn, &inbox_q, n, prefetch, handler).await;

    let (rows, distinct): (i64, i64) = inbox
        .read(|c| {
            c.query_row(
                "SELECT count(*), count(DISTINCT event_id) FROM effects",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
        })
        .await
        .unwrap();
    for q in [&plain_q, &inbox_q] {
        let _ = channel
            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    let _ = conn.close(200, "done".into()).await;

    println!(
        "RabbitMQ consumer, {n} messages ({unique} keys, 10% duplicates), prefetch {prefetch}:"
    );
    println!("  (a) same loop, ack without dedup:          {plain:>9.0} msg/s");
    println!("  (b) oncebox inbox on SQLite (FULL sync):   {dedup:>9.0} msg/s");
    println!("  ratio b/a: {:.2} (target >= 0.50)", dedup / plain);
    println!("  check: {rows} effect rows for {distinct} keys (expected {unique} and {unique})");
    assert_eq!(
        (rows, distinct),
        (unique as i64, unique as i64),
        "a key applied twice or lost"
    );
}
