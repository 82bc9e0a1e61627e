//! A claim that waited for a key's row lock judges the lease it then finds by the time after
//! the wait, not before it. Node B asks for a key whose lease has expired; while it waits for
//! the row, another node takes the key over with a fresh lease. Judged by B's time from before
//! its wait, that lease looked begun in the future by more than its TTL (a clock stepped back)
//! and was re-anchored to end before it began: the next claim took the key from a live holder.

use std::time::Duration;

use oncebox_core::{Begun, ManualClock, ProcessError};
use oncebox_postgres::sqlx;
use oncebox_testkit::{EPOCH, event};

use crate::harness::{Postgres, schema, url};
use crate::hold::blocked_by;

const TTL: Duration = Duration::from_secs(2);
/// A deadline for what takes milliseconds.
const PROMPT: Duration = Duration::from_secs(30);

#[test]
fn a_lease_taken_over_while_a_claim_waited_for_its_row_is_left_whole() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let pg = Postgres::open(schema(), ManualClock::new(EPOCH)).await;
        let Ok(Begun::Leased(_first)) = pg.inbox.begin(event("shop", "evt-k", 1), TTL).await else {
            panic!("the first lease");
        };
        let row = "source = 'shop' AND event_id = 'evt-k'";
        let (begun, _): (i64, i64) = sqlx::query_as(&format!(
            "SELECT received_at, lease_expires_at FROM oncebox_inbox WHERE {row}"
        ))
        .fetch_one(pg.inbox.pool())
        .await
        .expect("the lease's row");
        // The first holder's lease is over.
        pg.clock.advance(Duration::from_secs(3));
        // Another node's transaction holds the row: its takeover, not yet committed.
        let mut other = pg.inbox.pool().begin().await.expect("transaction");
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *other)
            .await
            .expect("pid");
        sqlx::query(&format!(
            "SELECT id FROM oncebox_inbox WHERE {row} FOR UPDATE"
        ))
        .execute(&mut *other)
        .await
        .expect("row locked");
        let waiting = {
            let inbox = pg.inbox.clone();
            tokio::spawn(async move { inbox.begin(event("shop", "evt-k", 1), TTL).await })
        };
        // The fault: the server says B's claim waits on the other node's row lock.
        let mut admin = pg.inbox.pool().acquire().await.expect("connection");
        tokio::time::timeout(PROMPT, async {
            while blocked_by(&mut admin, pid).await == 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("B's claim waits for the row");
        // Three seconds on, the other node's takeover commits: a fresh lease of one TTL.
        pg.clock.advance(Duration::from_secs(3));
        let (taken_at, taken_until) = (begun + 6_000, begun + 6_000 + 2_000);
        sqlx::query(&format!(
            "UPDATE oncebox_inbox SET received_at = $1, lease_expires_at = $2,
               lease_token = nextval('oncebox_fence') WHERE {row}"
        ))
        .bind(taken_at)
        .bind(taken_until)
        .execute(&mut *other)
        .await
        .expect("taken over");
        other.commit().await.expect("committed");
        let answer = tokio::time::timeout(PROMPT, waiting)
            .await
            .expect("answered")
            .expect("task");
        assert!(
            matches!(answer, Err(ProcessError::InProgress { .. })),
            "{answer:?}"
        );
        let until: i64 = sqlx::query_scalar(&format!(
            "SELECT lease_expires_at FROM oncebox_inbox WHERE {row}"
        ))
        .fetch_one(pg.inbox.pool())
        .await
        .expect("the lease's row");
        assert_eq!(until, taken_until, "the live lease keeps its end");
    });
}
