//! Code that makes SQLite roll its whole transaction back: some statement errors end the
//! transaction, not just the statement (a constraint declared `ON CONFLICT ROLLBACK`, a
//! trigger's `RAISE(ROLLBACK)`). That is the event's own fault, which every retry repeats: it
//! fails as `Handler` with nothing kept, never `Unavailable` (requeued forever), and the events
//! that shared its batch run again instead of failing with it.

use oncebox_core::consume::Apply;
use oncebox_core::{Event, ProcessError, Processed, Response, Unavailable};
use oncebox_sqlite::rusqlite::Connection;
use oncebox_sqlite::{HandlerError, Inbox, InboxHandler, Options, Tx};
use oncebox_testkit::run;
use oncebox_testkit::writer::{hold_writer, queued};

use crate::harness::shop;

fn event(id: &str) -> Event {
    shop(id, r#"{"n":1}"#)
}

fn count(path: &std::path::Path, sql: &str) -> i64 {
    Connection::open(path)
        .unwrap()
        .query_row(sql, [], |r| r.get(0))
        .unwrap()
}

/// A table whose trigger rolls back the whole transaction for one event id.
const POISONED: &str = "
CREATE TABLE effects (event_id TEXT NOT NULL);
CREATE TRIGGER poison BEFORE INSERT ON effects WHEN new.event_id = 'poison'
BEGIN SELECT RAISE(ROLLBACK, 'poisoned'); END;";

/// Every event's effect: a row, which the trigger refuses for `poison`.
fn insert_effect(tx: &mut Tx<'_>) -> Result<Response, HandlerError> {
    tx.conn().execute(
        "INSERT INTO effects (event_id) VALUES (?1)",
        [tx.key().event_id.as_str()],
    )?;
    Ok(Response::completed("done"))
}

#[test]
fn a_handler_going_on_after_sqlite_rolled_back_its_transaction_commits_nothing() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("o.db");
        let inbox = Inbox::open(Options::new(&path)).unwrap();
        inbox
            .write(|c| {
                c.execute_batch(
                    "CREATE TABLE refs (n INTEGER UNIQUE ON CONFLICT ROLLBACK);
                     CREATE TABLE effects (n INTEGER NOT NULL);",
                )
            })
            .await
            .unwrap();
        let out = inbox
            .process(event("e1"), |tx| {
                tx.conn()
                    .execute("INSERT INTO effects (n) VALUES (1)", [])?;
                tx.conn().execute("INSERT INTO refs (n) VALUES (1)", [])?;
                // Ends the whole transaction, the effect above with it; swallowed.
                let again = tx.conn().execute("INSERT INTO refs (n) VALUES (1)", []);
                assert!(again.is_err(), "the conflict was hit");
                Ok(Response::completed("done"))
            })
            .await;
        let Err(ProcessError::Handler(why)) = out else {
            panic!("nothing was committed, and no retry would: the handler's error: {out:?}");
        };
        assert!(why.to_string().contains("rolled back"), "{why}");
        assert_eq!(
            count(&path, "SELECT count(*) FROM oncebox_inbox"),
            0,
            "no record"
        );
        assert_eq!(count(&path, "SELECT count(*) FROM effects"), 0, "no effect");
        // The sender's retry, with a handler that does its work, applies it once.
        let out = inbox
            .process(event("e1"), |tx| {
                tx.conn()
                    .execute("INSERT INTO effects (n) VALUES (1)", [])?;
                Ok(Response::completed("done"))
            })
            .await;
        assert!(matches!(out, Ok(Processed::Applied(_))), "{out:?}");
        assert_eq!(count(&path, "SELECT count(*) FROM effects"), 1);

        // The same through `write`: what the closure does after the rollback is not kept.
        let out = inbox
            .write(|c| {
                c.execute("INSERT INTO refs (n) VALUES (1)", [])?;
                let again = c.execute("INSERT INTO refs (n) VALUES (1)", []);
                assert!(again.is_err(), "the conflict was hit");
                c.execute("INSERT INTO effects (n) VALUES (2)", [])
            })
            .await;
        assert!(out.is_err(), "{out:?}");
        assert_eq!(count(&path, "SELECT count(*) FROM effects WHERE n = 2"), 0);
        assert_eq!(count(&path, "SELECT count(*) FROM refs"), 0);
    });
}

/// Forty events in one group commit, through the broker consumers' `InboxHandler`, whose
/// handler can run again; the twenty-first hits `RAISE(ROLLBACK)`. It alone fails, as
/// `Handler`, nothing of it kept; the twenty before it run again in a new transaction, the
/// nineteen after it run there too, and all thirty-nine commit in the batch's one commit.
#[test]
fn a_handler_rolling_back_the_transaction_fails_alone_and_its_batch_mates_commit() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("o.db");
        let inbox = Inbox::open(Options::new(&path)).unwrap();
        inbox.write(|c| c.execute_batch(POISONED)).await.unwrap();
        let consumer = InboxHandler::new(inbox.clone(), |tx: &mut Tx<'_>, _: &Event| {
            insert_effect(tx)
        });
        // Held, the writer lets the forty queue in order; released, it takes them all into
        // the holder's batch.
        let gate = hold_writer(&inbox).await;
        let (stats, commits) = (inbox.stats(), inbox.stats().commits());
        let committed = stats.committed_requests();
        let mut tasks = Vec::new();
        for i in 0..40 {
            let id = if i == 20 {
                "poison".to_owned()
            } else {
                format!("e{i}")
            };
            let consumer = consumer.clone();
            tasks.push((
                id.clone(),
                tokio::spawn(async move { consumer.apply(event(&id), None).await }),
            ));
            queued(&inbox, i + 1).await;
        }
        gate.send(()).unwrap();
        for (id, task) in tasks {
            let out = task.await.unwrap();
            if id == "poison" {
                let Err(ProcessError::Handler(why)) = &out else {
                    panic!("the cause fails as its handler: {out:?}");
                };
                assert!(why.to_string().contains("poisoned"), "{why}");
            } else {
                assert!(matches!(out, Ok(Processed::Applied(_))), "{id}: {out:?}");
            }
        }
        assert_eq!(stats.commits(), commits + 1, "one batch, one commit");
        assert_eq!(stats.restarted_transactions(), 1, "begun again once");
        assert_eq!(stats.committed_requests(), committed + 39);
        assert_eq!(stats.failed_batches(), 0);
        assert_eq!(count(&path, "SELECT count(*) FROM effects"), 39);
        assert_eq!(count(&path, "SELECT count(*) FROM oncebox_inbox"), 39);
        // Its key is free: the trigger fixed, the redelivery applies it.
        inbox
            .write(|c| c.execute_batch("DROP TRIGGER poison"))
            .await
            .unwrap();
        let out = consumer.apply(event("poison"), None).await;
        assert!(matches!(out, Ok(Processed::Applied(_))), "{out:?}");
    });
}

/// With `process`'s `FnOnce` handlers, the events that ran before the cause cannot run again:
/// they are told to retry (`Unavailable`), nothing of them kept, and their retry applies them;
/// those after it commit in the same batch.
#[test]
fn with_handlers_that_run_once_the_events_before_the_cause_are_told_to_retry() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("o.db");
        let inbox = Inbox::open(Options::new(&path)).unwrap();
        inbox.write(|c| c.execute_batch(POISONED)).await.unwrap();
        let gate = hold_writer(&inbox).await;
        let ids = ["a", "b", "poison", "c", "d"];
        let mut tasks = Vec::new();
        for (i, id) in ids.into_iter().enumerate() {
            let inbox2 = inbox.clone();
            tasks.push(tokio::spawn(async move {
                inbox2.process(event(id), insert_effect).await
            }));
            queued(&inbox, i + 1).await;
        }
        gate.send(()).unwrap();
        let mut outs = Vec::new();
        for task in tasks {
            outs.push(task.await.unwrap());
        }
        assert!(
            matches!(outs[0], Err(ProcessError::Unavailable(_))),
            "{outs:?}"
        );
        assert!(
            matches!(outs[1], Err(ProcessError::Unavailable(_))),
            "{outs:?}"
        );
        assert!(matches!(outs[2], Err(ProcessError::Handler(_))), "{outs:?}");
        assert!(matches!(outs[3], Ok(Processed::Applied(_))), "{outs:?}");
        assert!(matches!(outs[4], Ok(Processed::Applied(_))), "{outs:?}");
        assert_eq!(
            effects(&path),
            ["c", "d"],
            "nothing of the events told to retry"
        );
        for id in ["a", "b"] {
            let out = inbox.process(event(id), insert_effect).await;
            assert!(matches!(out, Ok(Processed::Applied(_))), "{id}: {out:?}");
        }
        assert_eq!(effects(&path), ["c", "d", "a", "b"]);
    });
}

/// A handler that runs `COMMIT` on the writer's transaction fails as `Handler`, told so, with
/// nothing of it committed; an event after it in the batch commits.
#[test]
fn a_handler_running_commit_fails_and_commits_nothing() {
    committer_refused(Hook::None);
}

/// The same after an earlier batch's code set a commit hook of its own on the connection,
/// which replaced the writer's guard: its `COMMIT` then committed the batch.
#[test]
fn a_commit_hook_set_by_earlier_code_does_not_let_a_stray_commit_through() {
    committer_refused(Hook::EarlierBatch);
}

/// The same with the hook set by a handler earlier in the same batch: the guard was set again
/// only at each `BEGIN`, so the `COMMIT` committed the batch-mate's work and its own effect,
/// and was told nothing of it was kept.
#[test]
fn a_commit_hook_set_by_a_batch_mate_does_not_let_a_stray_commit_through() {
    committer_refused(Hook::BatchMate);
}

/// Who set a commit hook of their own on the writer's connection before the stray `COMMIT`.
#[derive(Clone, Copy, PartialEq)]
enum Hook {
    None,
    EarlierBatch,
    BatchMate,
}

fn committer_refused(hook: Hook) {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("o.db");
        let inbox = Inbox::open(Options::new(&path)).unwrap();
        inbox.write(|c| c.execute_batch(POISONED)).await.unwrap();
        if hook == Hook::EarlierBatch {
            inbox
                .write(|c| {
                    c.commit_hook(Some(|| false));
                    Ok(())
                })
                .await
                .unwrap();
        }
        let gate = hold_writer(&inbox).await;
        let hooking = (hook == Hook::BatchMate).then(|| {
            let inbox = inbox.clone();
            tokio::spawn(async move {
                inbox
                    .process(event("hooker"), |tx| {
                        tx.conn().commit_hook(Some(|| false));
                        insert_effect(tx)
                    })
                    .await
            })
        });
        let ahead = usize::from(hooking.is_some());
        queued(&inbox, ahead).await;
        let committing = tokio::spawn({
            let inbox = inbox.clone();
            async move {
                inbox
                    .process(event("committer"), |tx| {
                        insert_effect(tx)?;
                        tx.conn().execute_batch("COMMIT")?;
                        Ok(Response::completed("done"))
                    })
                    .await
            }
        });
        queued(&inbox, ahead + 1).await;
        let after = tokio::spawn({
            let inbox = inbox.clone();
            async move { inbox.process(event("after"), insert_effect).await }
        });
        queued(&inbox, ahead + 2).await;
        gate.send(()).unwrap();
        let out = committing.await.unwrap();
        let Err(ProcessError::Handler(why)) = &out else {
            panic!("{out:?}");
        };
        assert!(why.to_string().contains("ran COMMIT"), "{why}");
        let out = after.await.unwrap();
        assert!(matches!(out, Ok(Processed::Applied(_))), "{out:?}");
        if let Some(hooking) = hooking {
            // Its handler cannot run twice: told to retry, truly nothing of it kept.
            let out = hooking.await.unwrap();
            assert!(
                matches!(&out, Err(ProcessError::Unavailable(Unavailable::Storage(why)))
                    if why.contains("nothing of this request was kept")),
                "{out:?}"
            );
        }
        assert_eq!(effects(&path), ["after"]);
    });
}

/// The effects' event ids, in the order they were written.
fn effects(path: &std::path::Path) -> Vec<String> {
    let c = Connection::open(path).unwrap();
    let mut q = c
        .prepare("SELECT event_id FROM effects ORDER BY rowid")
        .unwrap();
    q.query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// A handler that ends the transaction and then changes the connection's settings in the
/// autocommit it left (`synchronous = OFF`, which SQLite refuses inside a transaction,
/// `foreign_keys = OFF`): the writer sets them back, so later batches still commit durably.
/// Shown both where the handler's own rollback restarts the batch and where a write's does.
#[test]
fn settings_changed_after_ending_the_transaction_are_set_back() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("o.db");
        let inbox = Inbox::open(Options::new(&path)).unwrap();
        let settings = || async {
            inbox
                .write(|c| {
                    let sync: i64 = c.query_row("PRAGMA synchronous", [], |r| r.get(0))?;
                    let keys: i64 = c.query_row("PRAGMA foreign_keys", [], |r| r.get(0))?;
                    Ok((sync, keys))
                })
                .await
                .unwrap()
        };
        let full = settings().await;
        assert_eq!(full, (2, 1), "FULL, with foreign keys");
        let changed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = changed.clone();
        let out = inbox
            .process(event("e1"), move |tx| {
                tx.conn().execute_batch(
                    "ROLLBACK; PRAGMA synchronous = OFF; PRAGMA foreign_keys = OFF;",
                )?;
                let sync: i64 = tx
                    .conn()
                    .query_row("PRAGMA synchronous", [], |r| r.get(0))?;
                seen.store(sync == 0, std::sync::atomic::Ordering::SeqCst);
                Ok(Response::completed("done"))
            })
            .await;
        assert!(matches!(out, Err(ProcessError::Handler(_))), "{out:?}");
        assert!(
            changed.load(std::sync::atomic::Ordering::SeqCst),
            "the change took"
        );
        assert_eq!(settings().await, full);
        inbox
            .write(|c| {
                c.execute_batch("ROLLBACK; PRAGMA synchronous = OFF;")?;
                Ok(())
            })
            .await
            .unwrap_err();
        assert_eq!(settings().await, full);
    });
}
