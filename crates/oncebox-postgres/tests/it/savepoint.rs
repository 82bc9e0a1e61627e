//! A handler's own savepoint, whatever its name: one named as the store's was (`oncebox_effect`)
//! stopped the store's `ROLLBACK TO` at the handler's, and a handler that failed or refused
//! had what it wrote before its savepoint committed with the record.

use oncebox_core::{ManualClock, ProcessError, Processed, Response};
use oncebox_postgres::{HandlerError, sqlx};
use oncebox_testkit::{EPOCH, event};

use crate::harness::{Postgres, schema, url};

#[test]
fn a_handler_savepoint_named_as_the_stores_keeps_nothing_of_a_failure_or_refusal() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let pg = Postgres::open(schema(), ManualClock::new(EPOCH)).await;
        sqlx::query("CREATE TABLE sp_effects (event_id TEXT NOT NULL)")
            .execute(pg.inbox.pool())
            .await
            .expect("effects table");
        for (id, refuse) in [("evt-fail", false), ("evt-refuse", true)] {
            let out = pg
                .inbox
                .process(event("shop", id, 1), move |tx| {
                    Box::pin(async move {
                        sqlx::query("INSERT INTO sp_effects VALUES ($1)")
                            .bind(id)
                            .execute(tx.conn())
                            .await?;
                        sqlx::query("SAVEPOINT oncebox_effect")
                            .execute(tx.conn())
                            .await?;
                        if refuse {
                            return Ok(Response::rejected("refused"));
                        }
                        Err(HandlerError::failed("failed after its own savepoint"))
                    })
                })
                .await;
            match (refuse, &out) {
                (false, Err(ProcessError::Handler(_))) => {}
                (true, Ok(Processed::Applied(r))) if r.body == b"refused" => {}
                _ => panic!("{id}: {out:?}"),
            }
            let kept: i64 =
                sqlx::query_scalar("SELECT count(*) FROM sp_effects WHERE event_id = $1")
                    .bind(id)
                    .fetch_one(pg.inbox.pool())
                    .await
                    .expect("count");
            assert_eq!(kept, 0, "{id}: nothing of the handler's work is kept");
        }
    });
}
