//! What one session or transaction leaves behind for others: a handler's session-wide `SET`
//! (it carried over to later events on its pooled connection, and to the statements run
//! outside transactions there), a transaction left idle by a
//! node that stopped in the middle of it (its rows held until the server's TCP keepalive gave
//! up, hours later), and the migration lock held by a session that stopped (every start waited
//! with it, silently).

use std::time::Duration;

use oncebox_core::{ManualClock, ProcessError, Processed, Response};
use oncebox_postgres::sqlx::{self, Connection};
use oncebox_postgres::{Inbox, OpenError};
use oncebox_testkit::{EPOCH, event};

use crate::harness::{options, schema, session_setting, url};
use crate::hold::Holder;

/// Longer than anything here takes but the fault's own wait.
const PROMPT: Duration = Duration::from_secs(30);

#[test]
fn a_handlers_session_settings_do_not_carry_over_to_later_events() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let clock = ManualClock::new(EPOCH);
        let inbox = Inbox::open(options(&schema(), &clock).max_connections(2))
            .await
            .expect("open");
        let first = inbox
            .process(event("shop", "evt-0", 1), |tx| {
                Box::pin(async move {
                    sqlx::query("SET synchronous_commit = off")
                        .execute(tx.conn())
                        .await?;
                    sqlx::query("SET default_transaction_isolation = 'serializable'")
                        .execute(tx.conn())
                        .await?;
                    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                        .fetch_one(tx.conn())
                        .await?;
                    Ok(Response::completed(pid.to_string()))
                })
            })
            .await;
        let Ok(Processed::Applied(first)) = first else {
            panic!("{first:?}")
        };
        let setter: i32 = String::from_utf8(first.body).unwrap().parse().unwrap();
        // Later events, until some ran on the connection whose session was changed.
        let mut on_setter = 0;
        for n in 1..=40 {
            let out = inbox
                .process(event("shop", &format!("evt-{n}"), 1), |tx| {
                    Box::pin(async move {
                        let row: (i32, String, String) = sqlx::query_as(
                            "SELECT pg_backend_pid(), current_setting('synchronous_commit'),
                                    current_setting('transaction_isolation')",
                        )
                        .fetch_one(tx.conn())
                        .await?;
                        Ok(Response::completed(format!(
                            "{} {} {}",
                            row.0, row.1, row.2
                        )))
                    })
                })
                .await;
            let Ok(Processed::Applied(seen)) = out else {
                panic!("{out:?}")
            };
            let seen = String::from_utf8(seen.body).unwrap();
            assert!(seen.ends_with(" on read committed"), "event {n}: {seen}");
            on_setter += usize::from(seen.starts_with(&format!("{setter} ")));
        }
        assert!(on_setter > 0, "no later event ran on the changed session");
    });
}

/// A handler's `SET synchronous_commit = off` for its session reached the statements oncebox
/// runs outside transactions on the same pooled connection (`complete`, `release`, the relay's
/// claims and records), which were then acknowledged before they were durable. Also after a
/// handler that committed the inbox's transaction itself and set it after.
#[test]
fn a_handlers_session_durability_does_not_reach_statements_outside_transactions() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let clock = ManualClock::new(EPOCH);
        let inbox = Inbox::open(options(&schema(), &clock).max_connections(2))
            .await
            .expect("open");
        let handlers = [
            ("evt-1", "SET synchronous_commit = off"),
            ("evt-2", "COMMIT; SET synchronous_commit = off"),
        ];
        for (id, set) in handlers {
            let (seen_tx, seen) = tokio::sync::oneshot::channel::<(i32, String)>();
            let out = inbox
                .process(event("shop", id, 1), move |tx| {
                    Box::pin(async move {
                        sqlx::Executor::execute(tx.conn(), set).await?;
                        let seen: (i32, String) = sqlx::query_as(
                            "SELECT pg_backend_pid(), current_setting('synchronous_commit')",
                        )
                        .fetch_one(tx.conn())
                        .await?;
                        let _ = seen_tx.send(seen);
                        Ok(Response::completed("ok"))
                    })
                })
                .await;
            // The fault was in place: the handler's session committed lazily.
            let (pid, seen) = seen.await.unwrap();
            assert_eq!(seen, "off", "{set}");
            let expected = if set.starts_with("COMMIT") {
                matches!(out, Err(ProcessError::Uncertain))
            } else {
                matches!(out, Ok(Processed::Applied(_)))
            };
            assert!(expected, "{set}: {out:?}");
            let after = session_setting(inbox.pool(), pid, "synchronous_commit").await;
            assert_eq!(after, "on", "outside a transaction, after `{set}`");
        }
    });
}

#[test]
fn a_transaction_left_idle_is_ended_by_the_server_and_its_key_freed() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let clock = ManualClock::new(EPOCH);
        let schema = schema();
        // The node that stops mid-transaction: its handler waits and sends nothing.
        let stopped = options(&schema, &clock).idle_in_transaction(Duration::from_secs(1));
        let stopped = Inbox::open(stopped).await.expect("node");
        let node = options(&schema, &clock).deadline(Duration::from_secs(2));
        let node = Inbox::open(node).await.expect("node");
        let holder = Holder::start(&stopped, event("shop", "evt-1", 1)).await;
        // Delivered again to the other node, as a sender retries, until it is applied there.
        let retried = tokio::time::timeout(PROMPT, async {
            loop {
                let out = node
                    .process(event("shop", "evt-1", 1), |_| {
                        Box::pin(async { Ok(Response::completed("second node")) })
                    })
                    .await;
                match out {
                    Err(ProcessError::Unavailable(_)) => continue,
                    other => return other,
                }
            }
        })
        .await
        .expect("the key was freed");
        assert!(matches!(retried, Ok(Processed::Applied(_))), "{retried:?}");
        // The fault: the held transaction's session was ended by the server.
        let mut admin = sqlx::PgConnection::connect(&url().unwrap()).await.unwrap();
        let alive: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = $1")
            .bind(holder.pid)
            .fetch_one(&mut admin)
            .await
            .unwrap();
        assert_eq!(alive, 0, "the idle session was ended");
        let late = holder.release().await;
        assert!(
            matches!(late, Err(ProcessError::Unavailable(_))),
            "nothing of the ended transaction commits: {late:?}"
        );
    });
}

#[test]
fn a_migration_lock_held_by_a_stopped_session_fails_the_start_naming_it() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let clock = ManualClock::new(EPOCH);
        let schema = schema();
        drop(
            Inbox::open(options(&schema, &clock))
                .await
                .expect("created"),
        );
        // A session stopped mid-migration: it holds the schema's migration lock.
        let mut stuck = sqlx::PgConnection::connect(&url().unwrap()).await.unwrap();
        let mut tx = stuck.begin().await.unwrap();
        let path = format!("SET LOCAL search_path = \"{schema}\"");
        sqlx::query(&path).execute(&mut *tx).await.unwrap();
        sqlx::query(
            "SELECT pg_advisory_xact_lock(hashtext('oncebox-migrate:' || current_schema()))",
        )
        .execute(&mut *tx)
        .await
        .unwrap();
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        let waiting = options(&schema, &clock).migration_lock_wait(Duration::from_millis(500));
        let refused = tokio::time::timeout(PROMPT, Inbox::open(waiting))
            .await
            .expect("the start gave up");
        match refused {
            Err(e @ OpenError::MigrationLocked { .. }) => {
                assert!(e.to_string().contains(&format!("pid {pid} ")), "{e}");
            }
            other => panic!("{other:?}"),
        }
        tx.rollback().await.unwrap();
        Inbox::open(options(&schema, &clock))
            .await
            .expect("opens once the lock is free");
    });
}
