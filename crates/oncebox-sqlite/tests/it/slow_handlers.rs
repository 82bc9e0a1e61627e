//! Slow handlers queued together (a consumer's batch of messages whose handlers each take a
//! while): run in one batch, all of them waited for one commit after the last, past the
//! deadline the first of them had been well inside, and not one was answered as applied; every
//! redelivery then read as a duplicate of work nobody was told of. A batch now takes no more
//! once its requests have run for a while, so the first commit early and are told so.

use std::time::Duration;

use oncebox_core::{ProcessError, Processed, Response, Unavailable};
use oncebox_sqlite::rusqlite::Connection;
use oncebox_sqlite::{Inbox, Options};
use oncebox_testkit::writer::{hold_writer, queued};
use oncebox_testkit::{event, run};

const HANDLERS: usize = 10;
/// Each handler's own work.
const WORK: Duration = Duration::from_millis(150);
/// Shorter than all the handlers' work together, far longer than a few of them.
const DEADLINE: Duration = Duration::from_secs(1);

#[test]
fn slow_handlers_queued_together_commit_in_turn_not_all_after_the_last() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let inbox = Inbox::open(Options::new(&path).deadline(DEADLINE)).unwrap();
        inbox
            .write(|c| c.execute_batch("CREATE TABLE effects (id TEXT NOT NULL)"))
            .await
            .unwrap();
        let handler = |id: String| {
            move |tx: &mut oncebox_sqlite::Tx<'_>| {
                std::thread::sleep(WORK);
                tx.conn()
                    .execute("INSERT INTO effects (id) VALUES (?1)", [&id])
                    .map_err(oncebox_sqlite::HandlerError::failed)?;
                Ok(Response::completed(id.into_bytes()))
            }
        };
        // Held, the writer lets every call queue; released, it finds them all waiting.
        let gate = hold_writer(&inbox).await;
        let calls: Vec<_> = (0..HANDLERS)
            .map(|n| {
                let (inbox, id) = (inbox.clone(), format!("evt-{n}"));
                tokio::spawn(async move { inbox.process(event("shop", &id, 1), handler(id)).await })
            })
            .collect();
        queued(&inbox, HANDLERS).await;
        gate.send(()).unwrap();
        let mut applied = 0;
        for call in calls {
            match call.await.unwrap() {
                Ok(Processed::Applied(_)) => applied += 1,
                Err(ProcessError::Unavailable(
                    Unavailable::Deadline | Unavailable::CommitUnknown(_),
                )) => {}
                other => panic!("{other:?}"),
            }
        }
        // The first batch alone: its first request is the holder, and it ends once what ran
        // after that took 250 ms, so it holds two handlers (each at least 150 ms) and commits
        // near 300 ms, well inside the deadline. All ten in one batch (1.5 s) would leave none
        // applied. (The next batch's three, near 750 ms, are not counted on.)
        assert!(
            applied >= 2,
            "{applied} of {HANDLERS} applied: the first handlers waited for the last"
        );
        // Redelivered, every event is applied once: those whose callers gave up either kept
        // nothing (not started in time) or are read back as done.
        for n in 0..HANDLERS {
            let id = format!("evt-{n}");
            let out = inbox
                .process(event("shop", &id, 1), handler(id.clone()))
                .await;
            assert!(
                matches!(out, Ok(Processed::Applied(_) | Processed::Duplicate(_))),
                "{id}: {out:?}"
            );
        }
        let c = Connection::open(&path).unwrap();
        let (rows, ids): (i64, i64) = c
            .query_row(
                "SELECT count(*), count(DISTINCT id) FROM effects",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(
            (rows, ids),
            (HANDLERS as i64, HANDLERS as i64),
            "each applied once"
        );
    });
}
