//! A foreign key SQLite checks only at `COMMIT` (`DEFERRABLE INITIALLY DEFERRED`) left unmet
//! by one request of a batch: that request alone fails, nothing of it kept (a handler's as
//! `Handler`, never `Unavailable`, since every retry repeats it; a caller's `write` refused),
//! and the requests sharing its batch commit. Before, the batch's `COMMIT` failed for it, and
//! every batch-mate was answered "outcome unknown" at each retry.

use oncebox_core::store::{EventStore, Ingest};
use oncebox_core::{Event, ProcessError, Processed, Response};
use oncebox_sqlite::rusqlite::Connection;
use oncebox_sqlite::{HandlerError, Inbox, Options, Tx};
use oncebox_testkit::run;
use oncebox_testkit::writer::{hold_writer, queued};

use crate::harness::shop;

const SCHEMA: &str = "
CREATE TABLE parents (id INTEGER PRIMARY KEY);
CREATE TABLE children (
    event_id TEXT NOT NULL,
    parent INTEGER NOT NULL REFERENCES parents (id) DEFERRABLE INITIALLY DEFERRED
);
INSERT INTO parents (id) VALUES (1);";

fn count(path: &std::path::Path, sql: &str) -> i64 {
    Connection::open(path)
        .unwrap()
        .query_row(sql, [], |r| r.get(0))
        .unwrap()
}

/// A child of parent 1, which exists, or, for `orphan`, of parent 999, which does not.
fn insert_child(tx: &mut Tx<'_>) -> Result<Response, HandlerError> {
    let id = tx.key().event_id.as_str().to_owned();
    let parent = if id == "orphan" { 999 } else { 1 };
    tx.conn().execute(
        "INSERT INTO children (event_id, parent) VALUES (?1, ?2)",
        (&id, parent),
    )?;
    Ok(Response::completed("done"))
}

fn event(id: &str) -> Event {
    shop(id, r#"{"n":1}"#)
}

async fn open(path: &std::path::Path) -> Inbox {
    let inbox = Inbox::open(Options::new(path)).unwrap();
    inbox.write(|c| c.execute_batch(SCHEMA)).await.unwrap();
    inbox
}

/// Runs `request(i, inbox)` for each of `n` into one batch (the writer held while they queue,
/// released once all wait) and returns their answers in order, with the commits and failed
/// batches counted meanwhile.
async fn one_batch<T, F>(
    inbox: &Inbox,
    n: usize,
    request: impl Fn(usize, Inbox) -> F,
) -> (Vec<T>, u64, u64)
where
    T: Send + 'static,
    F: std::future::Future<Output = T> + Send + 'static,
{
    let gate = hold_writer(inbox).await;
    let stats = inbox.stats();
    let (commits, failed) = (stats.commits(), stats.failed_batches());
    let mut tasks = Vec::new();
    for i in 0..n {
        tasks.push(tokio::spawn(request(i, inbox.clone())));
        queued(inbox, i + 1).await;
    }
    gate.send(()).unwrap();
    let mut outs = Vec::new();
    for task in tasks {
        outs.push(task.await.unwrap());
    }
    (
        outs,
        stats.commits() - commits,
        stats.failed_batches() - failed,
    )
}

#[test]
fn a_handler_leaving_a_deferred_foreign_key_unmet_fails_alone() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("o.db");
        let inbox = open(&path).await;
        let ids = ["e1", "orphan", "e2"];
        let (outs, commits, failed) = one_batch(&inbox, ids.len(), |i, inbox| async move {
            inbox.process(event(ids[i]), insert_child).await
        })
        .await;
        for (id, out) in ids.into_iter().zip(outs) {
            if id == "orphan" {
                let Err(ProcessError::Handler(why)) = &out else {
                    panic!("the orphan fails as its handler, every retry alike: {out:?}");
                };
                assert!(why.to_string().contains("FOREIGN KEY"), "{why}");
            } else {
                assert!(matches!(out, Ok(Processed::Applied(_))), "{id}: {out:?}");
            }
        }
        assert_eq!((commits, failed), (1, 0), "one batch, one commit");
        assert_eq!(count(&path, "SELECT count(*) FROM children"), 2);
        assert_eq!(count(&path, "SELECT count(*) FROM oncebox_inbox"), 2);
        // Its key is free: with its parent there, the redelivery applies it.
        inbox
            .write(|c| c.execute_batch("INSERT INTO parents (id) VALUES (999)"))
            .await
            .unwrap();
        let out = inbox.process(event("orphan"), insert_child).await;
        assert!(matches!(out, Ok(Processed::Applied(_))), "{out:?}");
        assert_eq!(count(&path, "SELECT count(*) FROM children"), 3);
    });
}

#[test]
fn a_write_leaving_a_deferred_foreign_key_unmet_is_refused_alone() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("o.db");
        let inbox = open(&path).await;
        let parents = [1_i64, 999, 1];
        let (outs, commits, failed) = one_batch(&inbox, parents.len(), |i, inbox| async move {
            let parent = parents[i];
            inbox
                .write(move |c| {
                    c.execute(
                        "INSERT INTO children (event_id, parent) VALUES (?1, ?2)",
                        (format!("w{i}"), parent),
                    )
                })
                .await
        })
        .await;
        // Refused in its own savepoint with SQLite's own refusal, which a retry repeats; the
        // writes before and after it commit in the batch.
        let Err(oncebox_sqlite::Error::Sql(why)) = &outs[1] else {
            panic!("refused as SQLite refuses it, nothing kept: {:?}", outs[1]);
        };
        assert!(why.to_string().contains("FOREIGN KEY"), "{why}");
        assert!(outs[0].is_ok() && outs[2].is_ok(), "{outs:?}");
        assert_eq!((commits, failed), (1, 0), "one batch, one commit");
        assert_eq!(inbox.stats().restarted_transactions(), 0);
        let kept = "SELECT group_concat(event_id) FROM children";
        let kept = Connection::open(&path)
            .unwrap()
            .query_row(kept, [], |r| r.get::<_, Option<String>>(0))
            .unwrap();
        assert_eq!(kept.as_deref(), Some("w0,w2"));
    });
}

/// A request with no savepoint of its own (the gateway's ingest) whose writes leave a deferred
/// key unmet (here through a trigger someone put on the inbox) is refused, and the requests
/// before it in the batch, which can run again, run again in a new transaction and commit.
#[test]
fn an_ingest_leaving_a_deferred_foreign_key_unmet_is_refused_alone() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("o.db");
        let inbox = open(&path).await;
        inbox
            .write(|c| {
                c.execute_batch(
                    "CREATE TRIGGER orphaned AFTER INSERT ON oncebox_inbox
                     WHEN new.event_id = 'orphan'
                     BEGIN INSERT INTO children (event_id, parent) VALUES (new.event_id, 999); END;",
                )
            })
            .await
            .unwrap();
        let ids = ["e1", "orphan", "e2"];
        let (outs, commits, failed) = one_batch(&inbox, ids.len(), |i, inbox| async move {
            let ingest = Ingest {
                event: event(ids[i]),
                order: None,
                accepted: b"{}".to_vec(),
                stale: b"{}".to_vec(),
                routes: Vec::new(),
            };
            inbox.ingest(ingest).await
        })
        .await;
        for (id, out) in ids.into_iter().zip(outs) {
            if id == "orphan" {
                let Err(ProcessError::Unavailable(why)) = &out else {
                    panic!("refused, nothing kept: {out:?}");
                };
                assert!(why.to_string().contains("FOREIGN KEY"), "{why}");
            } else {
                assert!(matches!(out, Ok(Processed::Applied(_))), "{id}: {out:?}");
            }
        }
        assert_eq!((commits, failed), (1, 0), "one batch, one commit");
        assert_eq!(
            inbox.stats().restarted_transactions(),
            1,
            "begun again once"
        );
        assert_eq!(count(&path, "SELECT count(*) FROM oncebox_inbox"), 2);
        assert_eq!(count(&path, "SELECT count(*) FROM children"), 0);
    });
}
