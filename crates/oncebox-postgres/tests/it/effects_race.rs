//! Different events racing for one business fact on two nodes: 50 events asking for one action
//! key (`Tx::once`) send one email, and 50 versions of one entity (`Tx::advance`) leave the
//! highest. Each race is shown to have happened: the first taker holds its transaction until
//! another transaction waits on it (`pg_blocking_pids`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use oncebox_core::{ManualClock, Once, Processed, Response};
use oncebox_postgres::{HandlerError, Inbox, Tx, sqlx};
use oncebox_testkit::{EPOCH, event};

use crate::harness::{Postgres, options, schema, url};

const EVENTS: usize = 50;

/// Two nodes on one fresh schema, and a pool of the test's own to watch the server with.
async fn nodes() -> (Postgres, [Inbox; 2], sqlx::PgPool) {
    let pg = Postgres::open(schema(), ManualClock::new(EPOCH)).await;
    let other = Inbox::open(options(&pg.schema, &pg.clock))
        .await
        .expect("second node");
    let nodes = [pg.inbox.clone(), other];
    let watch = sqlx::PgPool::connect(&url().unwrap()).await.expect("watch");
    (pg, nodes, watch)
}

/// Holds the caller's transaction until another transaction waits on it, for at most 10 s;
/// sets `raced` when one did.
async fn until_someone_waits(tx: &mut Tx, watch: &sqlx::PgPool, raced: &AtomicBool) {
    let me: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(tx.conn())
        .await
        .expect("pid");
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
        )
        .bind(me)
        .fetch_one(watch)
        .await
        .expect("waiters");
        if waiting > 0 {
            raced.store(true, Ordering::SeqCst);
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The handler a user writes for an order's email: sent once, whichever event asks.
fn email(
    tx: &mut Tx,
    watch: sqlx::PgPool,
    raced: Arc<AtomicBool>,
) -> BoxFuture<'_, Result<Response, HandlerError>> {
    Box::pin(async move {
        if tx.once("email", "order-7").await? == Once::Already {
            return Ok(Response::completed("already"));
        }
        until_someone_waits(tx, &watch, &raced).await;
        sqlx::query("INSERT INTO test_emails (order_key) VALUES ('order-7')")
            .execute(tx.conn())
            .await?;
        Ok(Response::completed("first"))
    })
}

/// The handler for a version of an order: the first to arrive holds the row until another
/// waits on it.
fn advance(
    tx: &mut Tx,
    version: i64,
    watch: sqlx::PgPool,
    raced: Arc<AtomicBool>,
) -> BoxFuture<'_, Result<Response, HandlerError>> {
    Box::pin(async move {
        tx.advance("order", "order-9", version).await?;
        if !raced.load(Ordering::SeqCst) {
            until_someone_waits(tx, &watch, &raced).await;
        }
        Ok(Response::completed("moved"))
    })
}

#[test]
fn fifty_events_racing_for_one_action_key_send_one_email() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let (pg, nodes, watch) = nodes().await;
        let raced = Arc::new(AtomicBool::new(false));
        let tasks: Vec<_> = (0..EVENTS)
            .map(|i| {
                let (inbox, watch, raced) = (nodes[i % 2].clone(), watch.clone(), raced.clone());
                tokio::spawn(async move {
                    let event = event("shop", &format!("e{i}"), 1);
                    inbox
                        .process(event, move |tx| email(tx, watch, raced))
                        .await
                })
            })
            .collect();
        let mut first = 0;
        for t in tasks {
            match t.await.expect("sender") {
                Ok(Processed::Applied(r)) => first += usize::from(r.body == b"first"),
                other => panic!("{other:?}"),
            }
        }
        assert!(
            raced.load(Ordering::SeqCst),
            "no event waited on the first taker"
        );
        let emails: i64 = sqlx::query_scalar("SELECT count(*) FROM test_emails")
            .fetch_one(pg.inbox.pool())
            .await
            .unwrap();
        let events: i64 = sqlx::query_scalar("SELECT count(*) FROM oncebox_inbox")
            .fetch_one(pg.inbox.pool())
            .await
            .unwrap();
        assert_eq!((first, emails, events), (1, 1, EVENTS as i64));
    });
}

#[test]
fn fifty_versions_of_one_entity_racing_leave_the_highest() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let (pg, nodes, watch) = nodes().await;
        let raced = Arc::new(AtomicBool::new(false));
        let tasks: Vec<_> = (1..=EVENTS)
            .map(|n| {
                let (inbox, watch, raced) = (nodes[n % 2].clone(), watch.clone(), raced.clone());
                tokio::spawn(async move {
                    let event = event("shop", &format!("v{n}"), 1);
                    let version = i64::try_from(n).unwrap();
                    inbox
                        .process(event, move |tx| advance(tx, version, watch, raced))
                        .await
                })
            })
            .collect();
        let (mut applied, mut stale) = (0, 0);
        for t in tasks {
            match t.await.expect("sender") {
                Ok(Processed::Applied(_)) => applied += 1,
                Ok(Processed::Stale) => stale += 1,
                other => panic!("{other:?}"),
            }
        }
        assert!(raced.load(Ordering::SeqCst), "no version waited on another");
        let version: i64 = sqlx::query_scalar(
            "SELECT version FROM oncebox_versions WHERE entity = 'order' AND entity_id = 'order-9'",
        )
        .fetch_one(pg.inbox.pool())
        .await
        .unwrap();
        eprintln!("{EVENTS} versions raced: {applied} applied, {stale} stale, {version} kept");
        assert_eq!(
            version, EVENTS as i64,
            "a lower version overwrote a higher one"
        );
        assert_eq!(applied + stale, EVENTS);
    });
}
