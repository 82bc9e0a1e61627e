//! Code that goes on after SQLite rolled its whole transaction back. Some statement errors end
//! the transaction, not just the statement (here a constraint declared `ON CONFLICT ROLLBACK`);
//! a handler that swallows the error and returns success must not get its record committed
//! without its effect, and `Inbox::write` must not commit what follows.

use oncebox_core::{Event, ProcessError, Processed, Response, Unavailable};
use oncebox_sqlite::rusqlite::Connection;
use oncebox_sqlite::{Inbox, Options};
use oncebox_testkit::run;

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
        assert!(
            matches!(out, Err(ProcessError::Unavailable(Unavailable::Storage(_)))),
            "nothing was committed, so no success: {out:?}"
        );
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
