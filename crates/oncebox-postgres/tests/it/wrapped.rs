//! A storage failure (a serialization failure, a deadlock) that a handler wrapped in its own
//! error, bare or with context: answered `Unavailable`, as its bare `Sql` error is, not as the
//! event's own failure, and nothing of it kept. A broker consumer counted that toward
//! quarantining a valid message during the contention. The SQLite store's answer is the same
//! (`oncebox-sqlite` `tests/it/wrapped.rs`).

use oncebox_core::{ManualClock, ProcessError, Processed, Response, Unavailable};
use oncebox_postgres::{HandlerError, sqlx};
use oncebox_testkit::wrapped::WithContext;
use oncebox_testkit::{EPOCH, event};

use crate::harness::{Postgres, schema, url};

#[test]
fn a_storage_failure_a_handler_wrapped_is_unavailable_not_its_failure() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let pg = Postgres::open(schema(), ManualClock::new(EPOCH)).await;
        sqlx::query("CREATE TABLE wrapped_effects (event_id TEXT NOT NULL)")
            .execute(pg.inbox.pool())
            .await
            .expect("effects table");
        // The server's own error of each class: a serialization failure and a deadlock are
        // the storage's, a check of the handler's own data is the event's.
        let cases = [
            ("40001", true, true),
            ("40P01", false, true),
            ("23514", true, false),
        ];
        for (code, context, storage) in cases {
            let id = format!("evt-{code}");
            let raised =
                format!("DO $$ BEGIN RAISE EXCEPTION 'refused' USING ERRCODE = '{code}'; END $$");
            let effect_id = id.clone();
            let out = pg
                .inbox
                .process(event("shop", &id, 1), move |tx| {
                    Box::pin(async move {
                        sqlx::query("INSERT INTO wrapped_effects VALUES ($1)")
                            .bind(&effect_id)
                            .execute(tx.conn())
                            .await?;
                        let e = sqlx::query(&raised).execute(tx.conn()).await.unwrap_err();
                        Err(if context {
                            HandlerError::failed(WithContext(e))
                        } else {
                            HandlerError::failed(e)
                        })
                    })
                })
                .await;
            match (storage, &out) {
                (true, Err(ProcessError::Unavailable(Unavailable::Busy))) => {}
                (false, Err(ProcessError::Handler(_))) => {}
                _ => panic!("{id}: {out:?}"),
            }
            let kept: i64 =
                sqlx::query_scalar("SELECT count(*) FROM wrapped_effects WHERE event_id = $1")
                    .bind(&id)
                    .fetch_one(pg.inbox.pool())
                    .await
                    .expect("count");
            assert_eq!(kept, 0, "{id}: nothing of the handler's work is kept");
            // The key is free: the sender's retry applies it.
            let retried = pg
                .inbox
                .process(event("shop", &id, 1), |_| {
                    Box::pin(async { Ok(Response::completed("applied")) })
                })
                .await;
            assert!(
                matches!(retried, Ok(Processed::Applied(_))),
                "{id}: {retried:?}"
            );
        }
    });
}
