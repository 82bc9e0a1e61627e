//! A handler that ends the inbox's transaction itself (`COMMIT` or `ROLLBACK` on `tx.conn()`),
//! which PostgreSQL cannot forbid: what it did may have committed without the key's record, so
//! it is never answered `Applied` and never run again for the key; the key waits, uncertain,
//! for an operator.

use std::time::Duration;

use futures::future::BoxFuture;
use oncebox_core::store::{EventStore, Ingest};
use oncebox_core::{ManualClock, ProcessError, Processed, RecordState, Response};
use oncebox_postgres::{HandlerError, Resolution, Tx, sqlx};
use oncebox_testkit::{EPOCH, event};
use tokio::sync::oneshot;

use crate::harness::{Postgres, schema, url};

/// What a handler does, in order.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// One effect row for the event.
    Effect,
    Commit,
    Rollback,
    Begin,
}

/// How a handler returns.
#[derive(Debug, Clone, Copy)]
enum End {
    Complete,
    Reject,
    Stale,
    Fail,
    /// A statement that fails, its error returned with `?`.
    SqlError,
}

use End::*;
use Step::*;

async fn store() -> Postgres {
    let pg = Postgres::open(schema(), ManualClock::new(EPOCH)).await;
    sqlx::query("CREATE TABLE ended_effects (event_id TEXT NOT NULL)")
        .execute(pg.inbox.pool())
        .await
        .expect("effects table");
    pg
}

fn handler<'t>(
    tx: &'t mut Tx,
    steps: &'static [Step],
    end: End,
) -> BoxFuture<'t, Result<Response, HandlerError>> {
    Box::pin(async move {
        for step in steps {
            let sql = match step {
                Effect => "INSERT INTO ended_effects (event_id) VALUES ($1)",
                Commit => "COMMIT",
                Rollback => "ROLLBACK",
                Begin => "BEGIN",
            };
            let id = tx.key().event_id.as_str().to_owned();
            let query = sqlx::query(sql);
            let query = if matches!(step, Effect) {
                query.bind(id)
            } else {
                query
            };
            query.execute(tx.conn()).await?;
        }
        match end {
            Complete => Ok(Response::completed("done")),
            Reject => Ok(Response::rejected("refused")),
            Stale => Err(HandlerError::Stale),
            Fail => Err(HandlerError::failed(
                "failed after its own transaction control",
            )),
            SqlError => {
                sqlx::query("SELECT 1 / 0").execute(tx.conn()).await?;
                unreachable!("division by zero fails")
            }
        }
    })
}

async fn deliver(
    pg: &Postgres,
    id: &str,
    steps: &'static [Step],
    end: End,
) -> Result<Processed, ProcessError> {
    pg.inbox
        .process(event("shop", id, 1), move |tx| handler(tx, steps, end))
        .await
}

async fn effects(pg: &Postgres, id: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM ended_effects WHERE event_id = $1")
        .bind(id)
        .fetch_one(pg.inbox.pool())
        .await
        .expect("count effects")
}

async fn state(pg: &Postgres, id: &str) -> Option<RecordState> {
    let key = event("shop", id, 1).key;
    let record = pg.inbox.record(&key).await.expect("record");
    record.map(|r| r.state)
}

/// Delivers `id` with `steps` and `end`, then again with a handler that would add an effect:
/// both answers must be `Uncertain`, the record parked, and the effect there once at most.
async fn parked_and_not_run_again(pg: &Postgres, id: &str, steps: &'static [Step], end: End) {
    let first = deliver(pg, id, steps, end).await;
    assert!(
        matches!(first, Err(ProcessError::Uncertain)),
        "{id} {steps:?} {end:?}: the effect's fate is unknown, never applied: {first:?}"
    );
    assert_eq!(state(pg, id).await, Some(RecordState::Uncertain), "{id}");
    let again = deliver(pg, id, &[Effect], Complete).await;
    assert!(
        matches!(again, Err(ProcessError::Uncertain)),
        "{id}: the redelivery waits for an operator: {again:?}"
    );
    let expected = i64::from(steps.iter().any(|s| matches!(s, Effect)));
    assert_eq!(effects(pg, id).await, expected, "{id} {steps:?} {end:?}");
}

#[test]
fn a_handler_that_rolls_back_then_writes_its_effect_is_answered_uncertain_and_not_rerun() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let pg = store().await;
        // The INSERT after the ROLLBACK commits alone, in autocommit, and the claim is gone.
        parked_and_not_run_again(&pg, "rolled-back", &[Rollback, Effect], Complete).await;
    });
}

#[test]
fn a_handler_that_commits_then_fails_is_answered_uncertain_and_not_taken_over() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let pg = store().await;
        // The effect committed with the claim; "handler failed, the key is free" would be a lie.
        parked_and_not_run_again(&pg, "committed-failed", &[Effect, Commit], Fail).await;
    });
}

#[test]
fn a_handler_that_commits_then_succeeds_is_answered_uncertain_until_an_operator_resolves_it() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let pg = store().await;
        parked_and_not_run_again(&pg, "committed-ok", &[Effect, Commit], Complete).await;
        let key = event("shop", "committed-ok", 1).key;
        let done = Response::completed("done");
        let resolved = pg.inbox.resolve(&key, Resolution::Completed(done.clone()));
        assert!(resolved.await.expect("resolve"), "the parked key resolves");
        let replay = deliver(&pg, "committed-ok", &[Effect], Complete).await;
        assert!(
            matches!(&replay, Ok(Processed::Duplicate(r)) if *r == done),
            "{replay:?}"
        );
        assert_eq!(effects(&pg, "committed-ok").await, 1);
    });
}

/// Every way out of the handler after it ended the transaction: each takes another path
/// through `process` (the record written, the savepoint rolled back to, the failure undone).
#[test]
fn every_ending_after_the_handlers_own_commit_or_rollback_is_answered_uncertain() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let pg = store().await;
        let cases: [(&str, &'static [Step], End); 8] = [
            ("rb-reject", &[Rollback, Effect], Reject),
            ("rb-stale", &[Rollback, Effect], Stale),
            ("rb-fail", &[Rollback, Effect], Fail),
            ("rb-sql", &[Rollback, Effect], SqlError),
            ("c-reject", &[Effect, Commit], Reject),
            ("c-stale", &[Effect, Commit], Stale),
            // A transaction of its own after ours: the savepoint is gone, the id differs.
            ("c-begin-ok", &[Effect, Commit, Begin], Complete),
            ("c-begin-sql", &[Effect, Commit, Begin], SqlError),
        ];
        for (id, steps, end) in cases {
            parked_and_not_run_again(&pg, id, steps, end).await;
        }
        // A handler that keeps to its transaction is unchanged: applied, then a duplicate.
        let applied = deliver(&pg, "plain", &[Effect], Complete).await;
        assert!(matches!(applied, Ok(Processed::Applied(_))), "{applied:?}");
        let failed = deliver(&pg, "plain-fail", &[Effect], Fail).await;
        assert!(
            matches!(failed, Err(ProcessError::Handler(_))),
            "{failed:?}"
        );
        assert_eq!(
            state(&pg, "plain-fail").await,
            None,
            "a failure leaves the key free"
        );
    });
}

/// The process dies after its handler's own `COMMIT` (here: the call is dropped mid-handler),
/// before `process` could see it: the claim stays committed as `processing` without a lease.
/// The next delivery must not take it over as an expired lease and run the effect again.
#[test]
fn a_claim_its_handler_committed_before_the_process_died_is_parked_not_taken_over() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let pg = store().await;
        let (committed, after_commit) = oneshot::channel::<()>();
        let inbox = pg.inbox.clone();
        let dying = tokio::spawn(async move {
            inbox
                .process(event("shop", "died", 1), move |tx| {
                    Box::pin(async move {
                        sqlx::query("INSERT INTO ended_effects (event_id) VALUES ('died')")
                            .execute(tx.conn())
                            .await?;
                        sqlx::query("COMMIT").execute(tx.conn()).await?;
                        let _ = committed.send(());
                        std::future::pending::<()>().await;
                        Ok(Response::completed("never"))
                    })
                })
                .await
        });
        after_commit.await.expect("the handler committed");
        dying.abort();
        assert!(dying.await.expect_err("aborted").is_cancelled());
        assert!(
            matches!(
                state(&pg, "died").await,
                Some(RecordState::Processing { .. })
            ),
            "the claim committed alone"
        );

        let again = deliver(&pg, "died", &[Effect], Complete).await;
        assert!(matches!(again, Err(ProcessError::Uncertain)), "{again:?}");
        assert_eq!(state(&pg, "died").await, Some(RecordState::Uncertain));
        let lease = pg
            .inbox
            .begin(event("shop", "died", 1), Duration::from_secs(30));
        let lease = lease.await;
        assert!(matches!(lease, Err(ProcessError::Uncertain)), "{lease:?}");
        let ingest = Ingest {
            event: event("shop", "died", 1),
            order: None,
            accepted: b"accepted".to_vec(),
            stale: Vec::new(),
            routes: Vec::new(),
        };
        let gateway = pg.inbox.ingest(ingest).await;
        assert!(
            matches!(gateway, Err(ProcessError::Uncertain)),
            "{gateway:?}"
        );
        assert_eq!(effects(&pg, "died").await, 1, "the effect ran once");
    });
}
