//! Batched ingest on PostgreSQL: concurrent requests share statements and commits, and every
//! answer is still exactly what the per-event path would give.

use std::time::Duration;

use oncebox_core::store::{EventStore, Ingest, Order};
use oncebox_core::{Begun, ManualClock, ProcessError, Processed};
use oncebox_postgres::sqlx;
use oncebox_testkit::race::{Timed, raced, timed};
use oncebox_testkit::{EPOCH, event};

use crate::harness::{Postgres, schema, url};

fn ingest(id: &str, amount: i64, routes: &[&str]) -> Ingest {
    Ingest {
        event: event("shop", id, amount),
        order: None,
        accepted: b"accepted".to_vec(),
        stale: b"stale".to_vec(),
        routes: routes.iter().map(|r| (*r).to_owned()).collect(),
    }
}

async fn fresh() -> Postgres {
    Postgres::open(schema(), ManualClock::new(EPOCH)).await
}

async fn count(pg: &Postgres, sql: &str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(pg.inbox.pool())
        .await
        .expect("count")
}

#[test]
fn concurrent_ingest_is_batched_and_stores_each_key_once() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let pg = fresh().await;
        // 64 senders, 40 requests each; every fourth request repeats one sent before.
        let tasks: Vec<_> = (0..64)
            .map(|t| {
                let inbox = pg.inbox.clone();
                tokio::spawn(async move {
                    let mut answers = Vec::new();
                    for i in 0..40 {
                        let id = if i % 4 == 3 {
                            format!("e{t}-{}", i - 3)
                        } else {
                            format!("e{t}-{i}")
                        };
                        answers.push((id.clone(), inbox.ingest(ingest(&id, 1, &["r"])).await));
                    }
                    answers
                })
            })
            .collect();
        let (mut applied, mut duplicates) = (0, 0);
        for t in tasks {
            for (id, answer) in t.await.expect("sender") {
                match answer {
                    Ok(Processed::Applied(_)) => applied += 1,
                    Ok(Processed::Duplicate(r)) => {
                        assert_eq!(r.body, b"accepted", "{id}: the first answer is replayed");
                        duplicates += 1;
                    }
                    other => panic!("{id}: {other:?}"),
                }
            }
        }
        assert_eq!((applied, duplicates), (64 * 30, 64 * 10));
        assert_eq!(
            count(&pg, "SELECT count(*) FROM oncebox_inbox").await,
            64 * 30
        );
        assert_eq!(
            count(&pg, "SELECT count(*) FROM oncebox_outbox").await,
            64 * 30
        );
        let stats = pg.inbox.batch_stats();
        eprintln!(
            "{} requests in {} commits ({:.1} per commit)",
            stats.committed_requests(),
            stats.commits(),
            stats.committed_requests() as f64 / stats.commits().max(1) as f64
        );
        // The batching really happened: far fewer commits than requests.
        assert!(
            stats.commits() < stats.committed_requests() / 2,
            "no batching"
        );
    });
}

#[test]
fn fifty_concurrent_deliveries_of_one_key_apply_once() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let pg = fresh().await;
        // All 50 handed to the store in one pass, before any answer is read.
        let requests = (0..50).map(|_| timed(pg.inbox.ingest(ingest("same", 5, &["r"]))));
        let mut applied = 0;
        let mut answers = Vec::new();
        for answer in futures::future::join_all(requests).await {
            match &answer.value {
                Ok(Processed::Applied(_)) => applied += 1,
                Ok(Processed::Duplicate(_)) => {}
                other => panic!("{other:?}"),
            }
            answers.push(answer);
        }
        assert_eq!(applied, 1);
        let won = |r: &Result<Processed, _>| matches!(r, Ok(Processed::Applied(_)));
        let raced = raced(&answers, won, |_, _| true);
        assert!(
            raced > Some(0),
            "no duplicate was sent before the first was answered"
        );
        assert_eq!(count(&pg, "SELECT count(*) FROM oncebox_inbox").await, 1);
        assert_eq!(count(&pg, "SELECT count(*) FROM oncebox_outbox").await, 1);
    });
}

/// Two nodes (two stores with pools of their own, as two gateway processes have) on one
/// database take the same key at the same moment, 25 senders each: one applies it, every
/// other answer on either node is the first answer replayed, and one record and one delivery
/// exist.
#[test]
fn one_key_raced_on_two_nodes_applies_once() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let pg = fresh().await;
        let other = oncebox_postgres::Inbox::open(crate::harness::options(&pg.schema, &pg.clock))
            .await
            .expect("second node");
        let nodes = [pg.inbox.clone(), other];
        // All 50 handed to their nodes in one pass, before any answer is read.
        let requests = (0..50).map(|i| {
            let answer = timed(nodes[i % 2].ingest(ingest("raced", 5, &["r"])));
            async move { (i % 2, answer.await) }
        });
        let mut applied = [0; 2];
        let mut answers = Vec::new();
        for (node, answer) in futures::future::join_all(requests).await {
            match &answer.value {
                Ok(Processed::Applied(_)) => applied[node] += 1,
                Ok(Processed::Duplicate(first)) => assert_eq!(first.body, b"accepted"),
                other => panic!("node {node}: {other:?}"),
            }
            answers.push(Timed {
                sent: answer.sent,
                answered: answer.answered,
                value: (
                    node,
                    answer
                        .value
                        .is_ok_and(|p| matches!(p, Processed::Applied(_))),
                ),
            });
        }
        assert_eq!(applied.iter().sum::<i32>(), 1, "{applied:?}");
        // Both nodes really took part: the other node's requests left before the winner's
        // answer came, so it had to find the key taken in the database, not in its own batch.
        let won = |(_, applied): &(usize, bool)| *applied;
        let rival = |w: &(usize, bool), l: &(usize, bool)| w.0 != l.0;
        let raced = raced(&answers, won, rival);
        assert!(
            raced > Some(0),
            "no request on the other node was sent before the winner was answered"
        );
        assert_eq!(count(&pg, "SELECT count(*) FROM oncebox_inbox").await, 1);
        assert_eq!(count(&pg, "SELECT count(*) FROM oncebox_outbox").await, 1);
    });
}

#[test]
fn conflicts_in_and_across_batches_are_recorded_and_the_first_payload_wins() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let pg = fresh().await;
        let first = pg.inbox.ingest(ingest("k", 1, &[])).await;
        assert!(matches!(first, Ok(Processed::Applied(_))), "{first:?}");
        // Same key, other payloads, concurrently: some share a batch with each other.
        let tasks: Vec<_> = (2..12)
            .map(|amount| {
                let inbox = pg.inbox.clone();
                tokio::spawn(async move { inbox.ingest(ingest("k", amount, &[])).await })
            })
            .collect();
        for t in tasks {
            let answer = t.await.expect("sender");
            assert!(
                matches!(answer, Err(ProcessError::Conflict { .. })),
                "{answer:?}"
            );
        }
        assert_eq!(
            count(&pg, "SELECT count(*) FROM oncebox_conflicts").await,
            10
        );
        let stored: Vec<u8> = sqlx::query_scalar("SELECT payload FROM oncebox_inbox")
            .fetch_one(pg.inbox.pool())
            .await
            .expect("payload");
        assert_eq!(stored, br#"{"amount":1}"#);
    });
}

#[test]
fn a_key_under_a_two_phase_lease_is_not_taken_by_ingest() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let pg = fresh().await;
        let begun = pg
            .inbox
            .begin(event("shop", "leased", 1), Duration::from_secs(30))
            .await;
        assert!(matches!(begun, Ok(Begun::Leased(_))), "{begun:?}");
        let answer = pg.inbox.ingest(ingest("leased", 1, &["r"])).await;
        assert!(
            matches!(answer, Err(ProcessError::InProgress { .. })),
            "{answer:?}"
        );
        assert_eq!(count(&pg, "SELECT count(*) FROM oncebox_outbox").await, 0);
        // After expiry neither: the lease's holder may have acted before it stopped, so the
        // key is parked uncertain for an operator, as `process` parks it.
        pg.clock.advance(Duration::from_secs(31));
        let answer = pg.inbox.ingest(ingest("leased", 1, &["r"])).await;
        assert!(matches!(answer, Err(ProcessError::Uncertain)), "{answer:?}");
        assert_eq!(count(&pg, "SELECT count(*) FROM oncebox_outbox").await, 0);
    });
}

#[test]
fn ordering_guard_stores_an_older_event_as_stale_without_delivery() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let pg = fresh().await;
        let with_order = |id: &str, version| Ingest {
            order: Some(Order {
                entity: "order-1".into(),
                version,
            }),
            ..ingest(id, 1, &["r"])
        };
        let newer = pg.inbox.ingest(with_order("paid", 20)).await;
        assert!(matches!(newer, Ok(Processed::Applied(_))), "{newer:?}");
        let older = pg.inbox.ingest(with_order("created", 10)).await;
        match older {
            Ok(Processed::Applied(r)) => assert_eq!(r.body, b"stale"),
            other => panic!("{other:?}"),
        }
        assert_eq!(count(&pg, "SELECT count(*) FROM oncebox_outbox").await, 1);
        assert_eq!(
            count(
                &pg,
                "SELECT count(*) FROM oncebox_inbox WHERE state = 'stale'"
            )
            .await,
            1
        );
    });
}
