//! PostgreSQL ingest benchmark: one event per transaction (the naive way) against oncebox's
//! batched ingest, side by side in one run, with the ratio.
//!
//! `ONCEBOX_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/oncebox_test cargo bench -p
//! oncebox-postgres --bench ingest` (options: `-- --events N --naive-events N --producers N
//! --connections N --workers N`). Both modes: durable commits (`synchronous_commit=on`), 10% duplicates,
//! UUIDv4 event ids, the same number of concurrent producers, each mode in a fresh schema.
//! (a) naive: `Inbox::process` — claim, a trivial effect (`UPDATE accounts`), commit — one
//! transaction per event, on a 16-connection pool; (b) `EventStore::ingest` — the record and one
//! outbox row per event — batched into set-based statements. Asserts nothing about time.

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::time::Instant;

use oncebox_core::store::{EventStore, Ingest};
use oncebox_core::{Event, Key, Processed, Response};
use oncebox_postgres::{Inbox, Options, sqlx};

const TARGET: f64 = 5.0;

/// Per producer, its events in order; every tenth repeats an earlier one of the same producer.
fn load(events: usize, producers: usize) -> Vec<Vec<Event>> {
    (0..producers)
        .map(|p| {
            let per = events / producers;
            let mut mine: Vec<Event> = Vec::with_capacity(per);
            for i in 0..per {
                if i % 10 == 9 {
                    let again = mine[(i * 7 + p) % i].clone();
                    mine.push(again);
                } else {
                    let id = uuid::Uuid::new_v4().to_string();
                    let body = format!(r#"{{"id":"{id}","type":"payment.succeeded","amount":1}}"#);
                    let key = Key::parse("bench", &id).expect("key");
                    mine.push(Event::json(key, body).expect("event"));
                }
            }
            mine
        })
        .collect()
}

async fn open(url: &str, connections: u32, workers: usize) -> Inbox {
    let schema = format!("bench_{}", uuid::Uuid::new_v4().simple());
    let inbox = Inbox::open(
        Options::new(url)
            .schema(schema)
            .max_connections(connections)
            .batch_workers(workers),
    )
    .await
    .expect("open");
    let mut conn = inbox.pool().acquire().await.expect("connection");
    sqlx::Executor::execute(
        &mut *conn,
        "CREATE TABLE accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL);
         INSERT INTO accounts VALUES (1, 0);",
    )
    .await
    .expect("accounts");
    inbox
}

/// Runs every producer's events through `each` concurrently; events/s and the outcome counts.
async fn drive<F, Fut>(load: &[Vec<Event>], each: F) -> (f64, usize, usize)
where
    F: Fn(Event) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<Processed, oncebox_core::ProcessError>> + Send,
{
    let started = Instant::now();
    let tasks: Vec<_> = load
        .iter()
        .map(|mine| {
            let (mine, each) = (mine.clone(), each.clone());
            tokio::spawn(async move {
                let (mut applied, mut duplicate) = (0, 0);
                for e in mine {
                    match each(e).await {
                        Ok(Processed::Applied(_)) => applied += 1,
                        Ok(Processed::Duplicate(_)) => duplicate += 1,
                        other => panic!("unexpected answer {other:?}"),
                    }
                }
                (applied, duplicate)
            })
        })
        .collect();
    let (mut applied, mut duplicate, mut n) = (0, 0, 0);
    for t in tasks {
        let (a, d) = t.await.expect("producer");
        applied += a;
        duplicate += d;
        n += a + d;
    }
    (
        n as f64 / started.elapsed().as_secs_f64(),
        applied,
        duplicate,
    )
}

fn main() {
    let Some(url) = std::env::var("ONCEBOX_POSTGRES_URL").ok() else {
        println!("ONCEBOX_POSTGRES_URL is not set: nothing to measure");
        return;
    };
    let events = oncebox_testkit::bench_arg("--events", 40_000);
    let naive_events = oncebox_testkit::bench_arg("--naive-events", 8_000);
    let producers = oncebox_testkit::bench_arg("--producers", 64).max(1);
    let connections = oncebox_testkit::bench_arg("--connections", 16).max(2) as u32;
    let workers = oncebox_testkit::bench_arg("--workers", Options::new("").batch_workers);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        println!(
            "postgres ingest: {producers} producers, 10% duplicates, UUIDv4 ids, \
             synchronous_commit=on, {connections} connections, {workers} batch workers"
        );
        let naive = open(&url, connections, workers).await;
        let (a, applied, dup) = drive(&load(naive_events, producers), move |e| {
            let inbox = naive.clone();
            async move {
                inbox
                    .process(e, |tx| {
                        Box::pin(async move {
                            sqlx::query("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
                                .execute(tx.conn())
                                .await?;
                            Ok(Response::completed("ok"))
                        })
                    })
                    .await
            }
        })
        .await;
        println!(
            "(a) naive, one transaction per event ({naive_events} events): {a:>9.0} events/s \
             [{applied} applied, {dup} duplicates]"
        );
        let batched = open(&url, connections, workers).await;
        let stats_of = batched.clone();
        let (b, applied, dup) = drive(&load(events, producers), move |event| {
            let inbox = batched.clone();
            async move {
                inbox
                    .ingest(Ingest {
                        event,
                        order: None,
                        accepted: b"accepted".to_vec(),
                        stale: Vec::new(),
                        routes: vec!["r".into()],
                    })
                    .await
            }
        })
        .await;
        let stats = stats_of.batch_stats();
        println!(
            "(b) oncebox batched ingest ({events} events):        {b:>9.0} events/s \
             [{applied} applied, {dup} duplicates; {:.1} requests per commit]",
            stats.committed_requests() as f64 / stats.commits().max(1) as f64
        );
        let ratio = b / a;
        println!(
            "ratio b/a = {ratio:.1}x (target >= {TARGET}x: {})",
            if ratio >= TARGET { "met" } else { "NOT met" }
        );
    });
}
