//! Faults on a real server: a session killed in the middle of a handler's transaction, a
//! `COMMIT` refused for what the handler wrote (a deferred limit too), a handler that goes on
//! after a failed statement.

use futures::future::BoxFuture;
use oncebox_core::{ManualClock, ProcessError, Processed, Response};
use oncebox_postgres::{HandlerError, Tx, sqlx};
use oncebox_testkit::{EPOCH, event};

use crate::harness::{Postgres, schema, url};

#[test]
fn a_session_killed_mid_transaction_answers_unavailable_and_the_retry_applies_once() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let pg = Postgres::open(schema(), ManualClock::new(EPOCH)).await;
        let (pid_tx, pid_rx) = tokio::sync::oneshot::channel::<i32>();
        let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
        let inbox = pg.inbox.clone();
        let victim = tokio::spawn(async move {
            inbox
                .process(event("shop", "k", 7), move |tx| {
                    Box::pin(async move {
                        sqlx::query("UPDATE test_accounts SET balance = balance + 7 WHERE id = 1")
                            .execute(tx.conn())
                            .await?;
                        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                            .fetch_one(tx.conn())
                            .await?;
                        let _ = pid_tx.send(pid);
                        // Hold the transaction open until the session has been killed.
                        let _ = go_rx.await;
                        sqlx::query("UPDATE test_accounts SET balance = balance + 0 WHERE id = 1")
                            .execute(tx.conn())
                            .await?;
                        Ok(Response::completed("ok"))
                    })
                })
                .await
        });
        let pid = pid_rx.await.expect("the handler reached its transaction");
        let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .fetch_one(pg.inbox.pool())
            .await
            .expect("terminate");
        assert!(killed, "the session was really terminated");
        go_tx.send(()).expect("handler waiting");
        let answer = victim.await.expect("victim task");
        assert!(
            matches!(answer, Err(ProcessError::Unavailable(_))),
            "a killed session is unavailability, never a duplicate or success: {answer:?}"
        );
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM oncebox_inbox")
            .fetch_one(pg.inbox.pool())
            .await
            .expect("count");
        assert_eq!(rows, 0, "nothing of the killed transaction committed");
        // The sender's retry applies it exactly once.
        let retry = pg
            .inbox
            .process(event("shop", "k", 7), |tx| {
                Box::pin(async move {
                    sqlx::query("UPDATE test_accounts SET balance = balance + 7 WHERE id = 1")
                        .execute(tx.conn())
                        .await?;
                    Ok(Response::completed("ok"))
                })
            })
            .await;
        assert!(matches!(retry, Ok(Processed::Applied(_))), "{retry:?}");
        let balance: i64 = sqlx::query_scalar("SELECT balance FROM test_accounts WHERE id = 1")
            .fetch_one(pg.inbox.pool())
            .await
            .expect("balance");
        assert_eq!(balance, 7);
    });
}

/// A handler's table with a deferred constraint: the violation surfaces at `COMMIT`, which
/// PostgreSQL then rolls back for certain. That is the handler's failure, to be told as such
/// (a consumer would otherwise hold the message for ever as "storage unavailable, retry"), and
/// it leaves the key free, with nothing of the handler kept.
#[test]
fn a_deferred_constraint_refused_at_commit_fails_the_handler_and_leaves_the_key_free() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let pg = Postgres::open(schema(), ManualClock::new(EPOCH)).await;
        sqlx::query("CREATE TABLE test_refs (n INTEGER UNIQUE DEFERRABLE INITIALLY DEFERRED)")
            .execute(pg.inbox.pool())
            .await
            .expect("table");
        let refused = pg
            .inbox
            .process(event("shop", "d", 1), |tx| inserts(tx, 2))
            .await;
        let Err(ProcessError::Handler(why)) = &refused else {
            panic!("the handler's own failure, not unavailability: {refused:?}");
        };
        assert!(why.to_string().contains("test_refs"), "{why}");
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM oncebox_inbox")
            .fetch_one(pg.inbox.pool())
            .await
            .expect("count");
        assert_eq!(rows, 0, "the key is free");
        let applied = pg
            .inbox
            .process(event("shop", "d", 1), |tx| inserts(tx, 1))
            .await;
        assert!(matches!(applied, Ok(Processed::Applied(_))), "{applied:?}");
    });
}

/// A limit the handler's own deferred trigger meets at `COMMIT` (`54000`, program limit
/// exceeded, raised by PL/pgSQL) is the handler's failure, as any refusal for what it wrote.
/// The same code from the server's full notification queue (every transaction that queued
/// deliveries notifies) is unavailability instead; that one is told apart by its source file
/// (`error.rs`, unit test), since filling the real queue takes gigabytes on this server.
#[test]
fn a_limit_the_handlers_trigger_meets_at_commit_is_the_handlers_failure() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let pg = Postgres::open(schema(), ManualClock::new(EPOCH)).await;
        sqlx::Executor::execute(
            pg.inbox.pool(),
            "CREATE TABLE test_refs (n INTEGER);
             CREATE FUNCTION test_limit() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               RAISE EXCEPTION 'too many of something' USING ERRCODE = '54000';
             END $$;
             CREATE CONSTRAINT TRIGGER test_limit AFTER INSERT ON test_refs
               DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION test_limit();",
        )
        .await
        .expect("trigger");
        let refused = pg
            .inbox
            .process(event("shop", "q", 1), |tx| inserts(tx, 1))
            .await;
        let Err(ProcessError::Handler(why)) = &refused else {
            panic!("the handler's failure: {refused:?}");
        };
        assert!(why.to_string().contains("too many of something"), "{why}");
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM oncebox_inbox")
            .fetch_one(pg.inbox.pool())
            .await
            .expect("count");
        assert_eq!(rows, 0, "nothing committed");
    });
}

/// Inserts the same value into `test_refs` `times` times.
fn inserts(tx: &mut Tx, times: usize) -> BoxFuture<'_, Result<Response, HandlerError>> {
    Box::pin(async move {
        for _ in 0..times {
            sqlx::query("INSERT INTO test_refs (n) VALUES (1)")
                .execute(tx.conn())
                .await?;
        }
        Ok(Response::completed("ok"))
    })
}

/// A handler that catches its statement's error and returns success anyway: PostgreSQL has
/// aborted the transaction, so nothing of it can commit. The caller must hear that the handler
/// failed, for certain, not "unavailable, retry" (every retry would end the same way).
#[test]
fn a_handler_going_on_after_a_failed_statement_fails_and_leaves_the_key_free() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let pg = Postgres::open(schema(), ManualClock::new(EPOCH)).await;
        let answer = pg
            .inbox
            .process(event("shop", "swallowed", 1), |tx| {
                Box::pin(async move {
                    let failed = sqlx::query("SELECT 1 / 0").execute(tx.conn()).await;
                    assert!(failed.is_err(), "the statement failed");
                    Ok(Response::completed("ok"))
                })
            })
            .await;
        let Err(ProcessError::Handler(why)) = &answer else {
            panic!("the handler's failure: {answer:?}");
        };
        assert!(why.to_string().contains("aborted"), "{why}");
        let applied = pg
            .inbox
            .process(event("shop", "swallowed", 1), |_| {
                Box::pin(async { Ok(Response::completed("ok")) })
            })
            .await;
        assert!(matches!(applied, Ok(Processed::Applied(_))), "{applied:?}");
    });
}
