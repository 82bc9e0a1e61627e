//! A handler's own savepoint named as the writer's once was (`oncebox_request`): it stopped the
//! writer's `ROLLBACK TO` at the handler's, so a handler that failed had what it wrote before
//! its savepoint committed, and its `RELEASE` of that name failed its whole batch. The
//! writer's name is now drawn at random per store (`stmts.rs`), which no handler can name;
//! this keeps the old name, the one handlers may still use, covered.

use oncebox_core::ProcessError;
use oncebox_sqlite::rusqlite::Connection;
use oncebox_sqlite::{HandlerError, Inbox, Options};
use oncebox_testkit::run;

use crate::harness::shop;

#[test]
fn a_handler_savepoint_named_as_the_writers_once_was_keeps_nothing_of_a_failure() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("o.db");
        let inbox = Inbox::open(Options::new(&path)).unwrap();
        inbox
            .write(|c| c.execute_batch("CREATE TABLE effects (id TEXT NOT NULL)"))
            .await
            .unwrap();
        let failed = inbox.stats().failed_batches();
        for (id, then) in [
            ("evt-savepoint", "SAVEPOINT oncebox_request"),
            ("evt-release", "RELEASE oncebox_request"),
        ] {
            let out = inbox
                .process(shop(id, r#"{"n":1}"#), move |tx| {
                    tx.conn().execute("INSERT INTO effects VALUES (?1)", [id])?;
                    // A statement about a savepoint the handler has not made fails; either way
                    // the handler goes on to fail.
                    let _ = tx.conn().execute_batch(then);
                    Err(HandlerError::failed("failed after its own savepoint"))
                })
                .await;
            assert!(
                matches!(out, Err(ProcessError::Handler(_))),
                "{id}: {out:?}"
            );
        }
        let kept: i64 = Connection::open(&path)
            .unwrap()
            .query_row("SELECT count(*) FROM effects", [], |r| r.get(0))
            .unwrap();
        assert_eq!(kept, 0, "nothing of the failed handlers' work is kept");
        assert_eq!(inbox.stats().failed_batches(), failed, "no batch failed");
    });
}
